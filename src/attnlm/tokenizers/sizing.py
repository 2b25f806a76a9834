"""A vocabulary size sized from the data, for trained subword vocabularies (``bpe``,
``wordpiece``) when a run leaves the size to the data (``train.bpe_vocab_size = 0``).

Rule of thumb: one subword per distinct word that occurs at least twice in the training text,
times :data:`WORDS_PER_TOKEN` , on top of the 256 byte tokens, rounded up to a multiple of 64
and kept within [:data:`MIN_VOCAB`, :data:`MAX_VOCAB`]. Words seen once are mostly names, numbers
and typos: a vocabulary that gave each its own token would spend its rows on tokens the model
sees once. A small corpus gets a small vocabulary (each token is seen often enough to learn),
a large one a larger vocabulary (shorter sequences). "Words" are runs of letters or digits
(``\\w+``), counted over every text given (both sides of sentence pairs when they share one
vocabulary).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

WORDS_PER_TOKEN = 0.5  # subwords per distinct word seen twice or more (tuned, docs/seq2seq.md)
MIN_VOCAB = 512
MAX_VOCAB = 16_000
BYTE_TOKENS = 256

_WORD = re.compile(r"\w+")


def repeated_words(texts: Iterable[str]) -> int:
    """How many distinct words occur at least twice in ``texts``."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(_WORD.findall(text))
    return sum(1 for c in counts.values() if c >= 2)


def vocab_size_for(texts: Iterable[str]) -> int:
    """The subword vocabulary size for a tokenizer trained on ``texts`` (module docstring)."""
    raw = BYTE_TOKENS + WORDS_PER_TOKEN * repeated_words(texts)
    size = 64 * -(-int(raw) // 64)
    return max(MIN_VOCAB, min(MAX_VOCAB, size))
