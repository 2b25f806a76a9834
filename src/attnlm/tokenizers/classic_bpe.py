"""Classic BPE (Sennrich, Haddow and Birch, 2016): word-internal merges with an end-of-word
marker ``</w>``, the algorithm as taught.

Training builds a word-frequency table (words are whitespace-separated; each newline is a
word of its own), spells every word as characters plus ``</w>`` (``low`` -> ``l o w </w>``),
then repeatedly merges the most frequent adjacent pair of symbols across the table. Counting
is incremental (:func:`attnlm.tokenizers.training.learn_merges`), the result is the same as
recounting after each merge. **Tie-break**: among equally frequent pairs the one whose
(left, right) symbols come first in code-point order wins; on the textbook table
``{l o w </w>: 5, l o w e r </w>: 2, n e w e s t </w>: 6, w i d e s t </w>: 3}`` the merges
are ``(e, s)`` 9, ``(es, t)`` 9, ``(est, </w>)`` 9, ``(l, o)`` 7, ``(lo, w)`` 7, ...

Encoding applies the learned merges to each word, lowest merge rank first. Characters never
seen in training map to ``<unk>``. Ids: ``<unk>`` = 0, then the base symbols (``</w>``, the
newline and the training characters, in code-point order), then merged symbols in merge order.

Decoding concatenates symbols and turns ``</w>`` into a space: words and newlines come back,
other whitespace (runs of spaces, tabs) is normalised to single spaces.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
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
from attnlm.tokenizers.training import learn_merges

END = "</w>"
NEWLINE = "\n"
_WORDS = re.compile(r"\n|[^\s]+")


def split_classic_words(text: str) -> list[str]:
    """Whitespace-separated words, plus one ``"\\n"`` item per newline."""
    return _WORDS.findall(text)


def _spell(word: str) -> tuple[str, ...]:
    """The initial symbols of a word: its characters then ``</w>`` (a newline stays alone)."""
    return (NEWLINE,) if word == NEWLINE else (*word, END)


def classic_merges(table: Mapping[str, int], num_merges: int) -> list[tuple[tuple[str, str], int]]:
    """Learn up to ``num_merges`` merges on a word-frequency table whose keys are
    space-separated symbols (``{"l o w </w>": 5, ...}``); returns ``[((left, right), count)]``.
    """
    words_syms = [tuple(k.split()) for k in table]
    base = sorted({s for w in words_syms for s in w})
    symbols: list[Any] = [(s,) for s in base]
    sid = {s: i for i, s in enumerate(base)}
    words = [[sid[s] for s in w] for w in words_syms]
    merged = learn_merges(
        words, list(table.values()), symbols, len(base) + num_merges, sort_key=_key
    )
    return [(("".join(symbols[a]), "".join(symbols[b])), c) for a, b, _, c in merged]


def _key(content: tuple[str, ...]) -> tuple[str, ...]:
    return content


@register_kind
class ClassicBPETokenizer(UnkFirst, Tokenizer):
    """Classic word-internal BPE with ``</w>`` (see the module docstring).

    ``symbols``: the base symbols (without ``<unk>``); ``merges``: ordered ``(left id, right
    id)`` pairs of token ids (``<unk>`` = 0, base symbols 1.., merged symbols after them in
    order of creation). JSON fields: ``symbols`` (strings), ``merges`` (id pairs).
    """

    kind = "classic-bpe"

    def __init__(self, symbols: Iterable[str], merges: Iterable[tuple[int, int]]) -> None:
        base = list(symbols)
        if len(set(base)) != len(base) or UNK in base or not all(isinstance(s, str) for s in base):
            raise TokenizerConfigError("base symbols must be distinct strings other than <unk>")
        # Each token's content is the tuple of base symbols it spells; <unk> is id 0.
        self._tokens: list[tuple[str, ...]] = [(UNK,), *((s,) for s in base)]
        self._index: dict[tuple[str, ...], int] = {t: i for i, t in enumerate(self._tokens)}
        self._str_index: dict[str, int] = {s: i + 1 for i, s in enumerate(base)}
        self._merge_ids: list[tuple[int, int]] = []
        self._merge_rank: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (a, b) in enumerate(merges):
            n = len(self._tokens)
            if not (isinstance(a, int) and isinstance(b, int) and 0 < a < n and 0 < b < n):
                raise ValueError(f"merge {rank} refers to an unknown token id")
            content = self._tokens[a] + self._tokens[b]
            new = self._index.get(content)
            if new is None:
                new = len(self._tokens)
                self._tokens.append(content)
                self._index[content] = new
            self._merge_rank.setdefault((a, b), (rank, new))
            self._merge_ids.append((a, b))
        self.base_symbols = base
        self._cache: dict[str, list[int]] = {}

    @property
    def merges(self) -> list[tuple[str, str]]:
        """The merges in order, as ``(left, right)`` symbol strings (e.g. ``("es", "t")``)."""
        toks = self._tokens
        return [("".join(toks[a]), "".join(toks[b])) for a, b in self._merge_ids]

    @classmethod
    def train(cls, text: str, vocab_size: int) -> ClassicBPETokenizer:
        """Learn merges on the words of ``text`` until the vocabulary (``<unk>``, base symbols
        and merged symbols) has ``vocab_size`` entries or no pair is left."""
        check_text(text)
        counts = Counter(split_classic_words(text))
        if not counts:
            raise TokenizerConfigError("cannot train classic BPE on text without words")
        spelled = [_spell(w) for w in counts]
        base = sorted({s for w in spelled for s in w})
        need = len(base) + 1
        if not isinstance(vocab_size, int) or vocab_size < need:
            raise TokenizerConfigError(
                f"vocab_size {vocab_size!r} too small: the training text has {len(base)} base "
                f"symbols, so classic BPE needs at least {need} (with <unk>)"
            )
        symbols: list[Any] = [(s,) for s in base]
        sid = {s: i for i, s in enumerate(base)}
        words = [[sid[s] for s in w] for w in spelled]
        merged = learn_merges(words, list(counts.values()), symbols, vocab_size - 1, sort_key=_key)
        return cls(base, [(a + 1, b + 1) for a, b, *_ in merged])  # ids: <unk> is 0

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_text(self, i: int) -> str:
        """The symbols of token ``i`` joined, ``</w>`` included (e.g. ``est</w>``)."""
        if not (isinstance(i, int) and 0 <= i < len(self._tokens)):
            raise InvalidTokenIdError(f"token id {i!r} is not in the vocabulary")
        return "".join(self._tokens[i])

    def _encode_word(self, word: str) -> list[int]:
        get = self._str_index.get
        ids = [get(s, 0) for s in _spell(word)]
        ranks = self._merge_rank
        while len(ids) > 1:
            best = None
            best_i = -1
            for i in range(len(ids) - 1):
                r = ranks.get((ids[i], ids[i + 1]))
                if r is not None and (best is None or r[0] < best[0]):
                    best, best_i = r, i
            if best is None:
                break
            ids[best_i : best_i + 2] = [best[1]]
        return ids

    def encode(self, text: str) -> list[int]:
        check_text(text)
        cache = self._cache
        out: list[int] = []
        for w in split_classic_words(text):
            ids = cache.get(w)
            if ids is None:
                ids = self._encode_word(w)
                if len(cache) > 100_000:
                    cache.clear()
                cache[w] = ids
            out += ids
        return out

    def decode(self, ids: Iterable[int]) -> str:
        toks = self._tokens
        n = len(toks)
        parts = []
        for i in ids:
            if not (isinstance(i, int) and 0 <= i < n):
                raise InvalidTokenIdError(f"token id {i!r} is not in the vocabulary (size {n})")
            parts.append("".join(toks[i]))
        text = "".join(parts).replace(END, " ").replace(" \n", "\n")
        return text[:-1] if text.endswith(" ") else text

    def to_dict(self) -> dict[str, Any]:
        return {"symbols": self.base_symbols, "merges": [list(m) for m in self._merge_ids]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassicBPETokenizer:
        symbols = data["symbols"]
        merges = data["merges"]
        if not isinstance(symbols, list) or not isinstance(merges, list):
            raise TypeError("'symbols' and 'merges' must be lists")
        return cls(symbols, [(int(a), int(b)) for a, b in merges])
