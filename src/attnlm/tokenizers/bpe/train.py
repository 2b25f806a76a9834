"""The byte-level BPE trainer: merges learned over the bytes of a text's pre-tokenized chunks.

The text's chunks (:func:`~attnlm.tokenizers.bpe.patterns.count_chunks`, special tokens cut out
first) are counted, and merges are learned over their UTF-8 bytes with
:func:`attnlm.tokenizers.training.learn_merges` (incremental pair counts, a pair-to-words index
and a lazy max-heap). The 256 single bytes get ids 0..255 in GPT-2's byte order
(:data:`~attnlm.tokenizers.bpe.merge.GPT2_BYTE_ORDER`), merged tokens 256, 257, ... in order of
creation; ties go to the smallest ``(left id, right id)``, the rule of Hugging Face
``tokenizers``' byte-level ``BpeTrainer``, so both learn the same merges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from attnlm.tokenizers.base import TokenizerConfigError, check_text
from attnlm.tokenizers.bpe.merge import _BYTE_TO_ID, GPT2_BYTE_ORDER
from attnlm.tokenizers.bpe.patterns import (
    _fix_surrogates,
    _special_regex,
    count_chunks,
    resolve_pattern,
    split_pattern,
)
from attnlm.tokenizers.training import MAX_SYMBOLS, learn_merges


def learn_ranks(
    text: str,
    vocab_size: int,
    pattern: str = "gpt2",
    special_tokens: Iterable[str] | None = None,
    *,
    min_frequency: int = 0,
) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]], str]:
    """``(ranks, merges, pattern)`` learned from ``text``: ``vocab_size - 256`` merges (fewer
    if the text runs out of pairs), the merged byte pairs in order, and the pattern as a
    built-in name or the regex. ``special_tokens`` are cut out of the text; pairs seen fewer
    than ``min_frequency`` times are not merged."""
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise TokenizerConfigError(
            f"vocab_size {vocab_size!r} too small: byte-level BPE needs at least 256 "
            "(one token per byte)"
        )
    if vocab_size > MAX_SYMBOLS:
        raise TokenizerConfigError(f"vocab_size {vocab_size} too large (max {MAX_SYMBOLS})")
    name, pat = resolve_pattern(pattern)
    check_text(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _fix_surrogates(text)
    names = list(special_tokens or ())
    segments = _special_regex(names).split(text) if names else [text]
    counts: Counter[str] = Counter()
    for seg in segments:
        counts.update(count_chunks(seg, split_pattern(pat)))
    words = [list(w.encode("utf-8").translate(_BYTE_TO_ID)) for w in counts]
    symbols: list[bytes] = [bytes([b]) for b in GPT2_BYTE_ORDER]
    merged = learn_merges(
        words, list(counts.values()), symbols, vocab_size, min_frequency=min_frequency
    )
    ranks = {s: i for i, s in enumerate(symbols)}
    merges = [(symbols[a], symbols[b]) for a, b, *_ in merged]
    return ranks, merges, name or pat
