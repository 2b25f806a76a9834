"""The length filter of sentence pairs: drop pairs with a side longer than a number of characters
or (with the pair tokenizers) tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnlm.base.errors import ConfigError
from attnlm.base.validate import positive

if TYPE_CHECKING:
    from attnlm.data.pairs.read import Pair
    from attnlm.data.pairs.tokenizers import PairTokenizers


def filter_pairs(
    pairs: Sequence[Pair],
    *,
    max_chars: int | None = None,
    max_tokens: int | None = None,
    tokenizers: PairTokenizers | None = None,
) -> tuple[list[Pair], int]:
    """Keep pairs whose sides both have at most ``max_chars`` characters and (with
    ``tokenizers``) at most ``max_tokens`` tokens, start / end tokens not counted.
    Returns the kept pairs (in order) and the number dropped."""
    limits = {"max_chars": max_chars, "max_tokens": max_tokens}
    positive(limits, *limits, where="", optional=True)
    if max_tokens is not None and tokenizers is None:
        raise ConfigError("max_tokens needs the pair tokenizers to count tokens")
    kept = []
    for pair in pairs:
        if max_chars is not None and max(len(pair.source), len(pair.target)) > max_chars:
            continue
        if max_tokens is not None:
            assert tokenizers is not None
            if len(tokenizers.tokens(pair.source, "source")) > max_tokens:
                continue
            if len(tokenizers.tokens(pair.target, "target")) > max_tokens:
                continue
        kept.append(pair)
    return kept, len(pairs) - len(kept)
