"""Sentence pairs as token ids, ready to batch: both sides encoded with the pair tokenizers
(start / end tokens as their config says), with the padding ids and embedding sizes a model
needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnlm.base.errors import InputError

if TYPE_CHECKING:
    from attnlm.data.pairs.read import Pair
    from attnlm.data.pairs.tokenizers import PairTokenizers


@dataclass(frozen=True)
class EncodedPairs:
    """Token ids of pairs, ready to batch: ``source[i]`` and ``target[i]`` are the ids of pair
    ``i`` with start / end tokens as the tokenizer config says; ``source_pad`` /
    ``target_pad`` are the padding ids and ``source_vocab_size`` / ``target_vocab_size`` the
    embedding sizes a model needs."""

    source: list[list[int]]
    target: list[list[int]]
    source_pad: int
    target_pad: int
    source_vocab_size: int
    target_vocab_size: int

    def __len__(self) -> int:
        return len(self.source)

    def n_tokens(self) -> tuple[int, int]:
        """Total (source, target) tokens."""
        return sum(map(len, self.source)), sum(map(len, self.target))


def encode_pairs(pairs: Sequence[Pair], tokenizers: PairTokenizers) -> EncodedPairs:
    """Encode both sides of every pair with :meth:`PairTokenizers.encode`. A character a
    tokenizer cannot encode raises :class:`InputError` naming the pair."""
    from attnlm.base.errors import AttnlmError

    src: list[list[int]] = []
    tgt: list[list[int]] = []
    for i, (s, t) in enumerate(pairs):
        try:
            src.append(tokenizers.encode(s, "source"))
            tgt.append(tokenizers.encode(t, "target"))
        except AttnlmError as e:
            raise InputError(f"pair {i} ({s!r} -> {t!r}): {e}") from None
    return EncodedPairs(
        source=src,
        target=tgt,
        source_pad=tokenizers.source_ids.pad,
        target_pad=tokenizers.target_ids.pad,
        source_vocab_size=tokenizers.source_ids.vocab_size,
        target_vocab_size=tokenizers.target_ids.vocab_size,
    )
