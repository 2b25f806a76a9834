"""Where a word and each token sit in a text, as character spans ``[start, end)``: the
embeddings endpoint (:meth:`attnlm.web.service.ModelService.embeddings`) averages the hidden
states of the tokens that overlap a word's first whole-word occurrence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from attnlm.web.service.limits import ServiceError


def find_word(sentence: str, word: str, n: int = 1) -> tuple[int, int]:
    """Character span of the first whole-word occurrence of ``word`` (exact case first)."""
    pattern = r"(?<!\w)" + re.escape(word) + r"(?!\w)"
    m = re.search(pattern, sentence) or re.search(pattern, sentence, re.IGNORECASE)
    if m is None:
        raise ServiceError(f"the word {word!r} does not occur in sentence {n}")
    return m.span()


def token_spans(tokenizer: Any, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character span ``[start, end)`` of each token of ``text`` (zero-width when unknown).

    Byte-level tokenizers (``decode_bytes``) are mapped through UTF-8 byte offsets; others by
    finding each token's text in order.
    """
    if hasattr(tokenizer, "decode_bytes"):
        data = text.encode("utf-8")
        char_at = []  # byte offset -> index of the character containing it
        for ci, ch in enumerate(text):
            char_at.extend([ci] * len(ch.encode("utf-8")))
        char_at.append(len(text))
        spans, b = [], 0
        for i in ids:
            n = len(tokenizer.decode_bytes([i]))
            a, b = b, min(b + n, len(data))
            end = char_at[b - 1] + 1 if b > a else char_at[a]
            spans.append((char_at[a], end))
        return spans
    spans, pos = [], 0
    for i in ids:
        piece = tokenizer.decode([i])
        at = text.find(piece, pos) if piece else -1
        if at < 0:
            spans.append((pos, pos))
            continue
        spans.append((at, at + len(piece)))
        pos = at + len(piece)
    return spans
