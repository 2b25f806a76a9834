"""Word-level tokenizer: regex word/punctuation splitting, a frequency-ranked vocabulary.

Splitting (:func:`split_words`): runs of word characters (``\\w+``: letters, digits,
underscore, any script) and single punctuation/symbol characters (``[^\\w\\s]``); whitespace
is dropped. ``"Don't stop!"`` -> ``["Don", "'", "t", "stop", "!"]``.

Vocabulary: ``<unk>`` has id 0, then every word seen at least ``min_freq`` times, most
frequent first (ties in code-point order), cut to ``max_size`` ids in all. Unseen words encode
to ``<unk>``.

Decoding joins the words with single spaces, except none before closing punctuation
(``. , ; : ! ? ) ] }`` ...), none after opening brackets, and none around an apostrophe
followed by a contraction ending such as ``t``, ``s``, ``ll``, ``er`` (``Don ' t`` ->
``Don't``). Whitespace is not restored exactly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from attnlm.tokenizers.base import (
    UNK,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerConfigError,
    UnkFirst,
    check_text,
    register_kind,
)

WORD_PATTERN = re.compile(r"\w+|[^\w\s]")
_NO_SPACE_BEFORE = set(".,;:!?)]}%…»”’")
_NO_SPACE_AFTER = set("([{$«“‘")
_CONTRACTION_ENDS = {"s", "t", "d", "ll", "re", "ve", "m", "er", "st", "en"}


def split_words(text: str) -> list[str]:
    """Split ``text`` into words (``\\w+``) and single punctuation characters; drop spaces."""
    return WORD_PATTERN.findall(text)


def join_words(words: Iterable[str]) -> str:
    """Join words with readable spacing (see the module docstring)."""
    toks = list(words)

    def inner_apostrophe(k: int) -> bool:  # toks[k] is "'" between two word tokens
        return (
            toks[k] == "'"
            and 0 < k < len(toks) - 1
            and toks[k - 1][-1:].isalnum()
            and toks[k + 1].lower() in _CONTRACTION_ENDS
        )

    out = toks[:1]
    for k in range(1, len(toks)):
        w, prev = toks[k], toks[k - 1]
        glue = (
            w in _NO_SPACE_BEFORE
            or prev in _NO_SPACE_AFTER
            or inner_apostrophe(k)
            or inner_apostrophe(k - 1)
        )
        out.append(w if glue else " " + w)
    return "".join(out)


@register_kind
class WordTokenizer(UnkFirst, Tokenizer):
    """Word-level tokenizer (see the module docstring).

    JSON fields: ``words`` (the vocabulary, position = id, ``<unk>`` first).
    """

    kind = "word"

    def __init__(self, words: Iterable[str]) -> None:
        words = list(words)
        if not words or words[0] != UNK:
            words = [UNK] + [w for w in words if w != UNK]
        if len(set(words)) != len(words):
            raise TokenizerConfigError("word vocabulary contains duplicates")
        self.words: list[str] = words
        self._stoi = {w: i for i, w in enumerate(words)}
        self.unk_id = 0

    @classmethod
    def train(cls, text: str, min_freq: int = 1, max_size: int | None = None) -> WordTokenizer:
        """Vocabulary of the words of ``text`` seen at least ``min_freq`` times, most frequent
        first, at most ``max_size`` ids including ``<unk>``."""
        check_text(text)
        if not isinstance(min_freq, int) or min_freq < 1:
            raise TokenizerConfigError(f"min_freq must be an integer >= 1, got {min_freq!r}")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 2):
            raise TokenizerConfigError(
                f"max_size {max_size!r} too small: a word vocabulary needs <unk> and one word"
            )
        counts = Counter(split_words(text))
        ranked = sorted(
            (w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w)
        )
        if max_size is not None:
            ranked = ranked[: max_size - 1]
        if not ranked:
            raise TokenizerConfigError(
                f"no word occurs at least min_freq={min_freq} times in the training text"
            )
        return cls([UNK, *ranked])

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        check_text(text)
        get = self._stoi.get
        return [get(w, 0) for w in split_words(text)]

    def decode(self, ids: Iterable[int]) -> str:
        words = self.words
        n = len(words)
        toks = []
        for i in ids:
            if not (isinstance(i, int) and 0 <= i < n):
                raise InvalidTokenIdError(f"token id {i!r} is not in the vocabulary (size {n})")
            toks.append(words[i])
        return join_words(toks)

    def to_dict(self) -> dict[str, Any]:
        return {"words": self.words}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WordTokenizer:
        words = data["words"]
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise TypeError("'words' must be a list of strings")
        return cls(words)
