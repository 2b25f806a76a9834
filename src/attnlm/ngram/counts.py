"""Vectorised n-gram counting over sentences, with ``<s>``, ``</s>`` and ``<unk>``.

Sentences are integer-encoded and laid end to end in one flat array, each one wrapped as
``<s> w1 .. wk </s>`` (KenLM's convention) or, with ``pad="nltk"``, as ``<s>``*(n-1) words
``</s>``*(n-1) (NLTK's ``pad_both_ends``). No n-gram crosses a sentence boundary.

n-grams are identified hierarchically, as in a trie: an order-k n-gram ``w1 .. wk`` is the pair
(id of its order-(k-1) prefix ``w1 .. w(k-1)``, id of ``wk``), packed into one int64 key
``prefix_id * V + wk`` where ``V`` is the vocabulary size. Order k's table is the sorted array of
its distinct keys; the id of an n-gram is its index in that array, and unigram ids are word ids.
Counting an order is one ``np.unique`` over the keys of all positions, so the cost is a few
sorts of arrays as long as the corpus (no Python dict per token).

Shape legend: T = tokens in the flat array (words plus markers), n_k = distinct order-k n-grams.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np

from attnlm.base.errors import ConfigError, InputError

UNK = "<unk>"  # the ARPA / KenLM unknown word (the same string as attnlm.tokenizers.base.UNK)
BOS = "<s>"
#: the highest order counted (KenLM's lmplz is built for 6 by default): counting and
#: estimating loop over every order, so ``--order 1000000`` ran without bound on any text
MAX_ORDER = 32
EOS = "</s>"
PADDINGS = ("kenlm", "nltk")


class Vocabulary:
    """Word <-> id map. Ids 0, 1, 2 are ``<unk>``, ``<s>``, ``</s>`` when built from text (as in
    KenLM); other words follow in order of first appearance."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words: list[str] = list(words)
        self.index: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise InputError("vocabulary contains a word twice")
        for special in (UNK, BOS, EOS):
            if special not in self.index:
                raise InputError(f"vocabulary lacks {special}")
        self.unk = self.index[UNK]
        self.bos = self.index[BOS]
        self.eos = self.index[EOS]

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: Sequence[str]) -> np.ndarray:
        """Ids of ``words`` (int64), unknown words mapped to ``<unk>``."""
        get = self.index.get
        return np.fromiter(
            map(get, words, repeat(self.unk, len(words))), dtype=np.int64, count=len(words)
        )


def split_sentences(text: str, tokenize: bool = False) -> list[list[str]]:
    """One sentence per non-blank line: whitespace-separated tokens (as ``lmplz`` reads them),
    or, with ``tokenize``, the words of :func:`attnlm.tokenizers.word.split_words`."""
    if tokenize:
        from attnlm.tokenizers.word import split_words  # lazy: only this path needs it

        sents = [split_words(line) for line in text.splitlines()]
    else:
        sents = [line.split() for line in text.splitlines()]
    return [s for s in sents if s]


@dataclass
class Encoded:
    """Sentences as one flat id array with markers.

    ``tokens`` (T,) word ids; ``pos`` (T,) position inside the padded sentence (0 at its first
    token); ``predict`` (T,) bool, the positions that are scored (every token after the
    leading ``<s>`` markers, so ``</s>`` is predicted and ``<s>`` never is).
    """

    tokens: np.ndarray
    pos: np.ndarray
    predict: np.ndarray
    n_sentences: int


def encode_sentences(
    sentences: Sequence[Sequence[str]],
    vocab: Vocabulary,
    order: int,
    pad: str = "kenlm",
) -> Encoded:
    """Flatten sentences (lists of words) with markers, words mapped to ids of ``vocab``."""
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    words = vocab.encode(list(chain.from_iterable(sentences)))
    return encode_ids(words, lengths, order, pad, vocab.bos, vocab.eos)


def encode_ids(
    words: np.ndarray, lengths: np.ndarray, order: int, pad: str, bos: int, eos: int
) -> Encoded:
    """Flatten integer sentences (``words`` back to back, ``lengths`` per sentence)."""
    if pad not in PADDINGS:
        raise ConfigError(f"padding must be one of {', '.join(PADDINGS)}, got {pad!r}")
    n_pad = 1 if pad == "kenlm" else max(order - 1, 1)
    n = len(lengths)
    full = lengths + 2 * n_pad  # padded sentence lengths
    total = int(full.sum())
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(full[:-1], out=starts[1:])
    # position inside the padded sentence: 0, 1, 2, ... restarting at every sentence
    pos = np.ones(total, dtype=np.int64)
    pos[0] = 0
    pos[starts[1:]] = -(full[:-1] - 1)
    np.cumsum(pos, out=pos)
    tokens = np.full(total, eos, dtype=np.int64)
    tokens[pos < n_pad] = bos
    sent_len = np.repeat(lengths, full)  # (T,) length of the sentence of each position
    tokens[(pos >= n_pad) & (pos < n_pad + sent_len)] = words
    return Encoded(tokens=tokens, pos=pos, predict=pos >= n_pad, n_sentences=n)


def unique_inverse(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(q, return_inverse=True)`` for non-negative int64 ``q``, faster: when key and
    index fit together in 63 bits, one value sort of ``key << b | index`` replaces the argsort."""
    n = len(q)
    if n == 0:
        return q.copy(), np.zeros(0, dtype=np.int64)
    b = max(int(n - 1).bit_length(), 1)
    if int(q.max()).bit_length() + b > 62:
        return np.unique(q, return_inverse=True)
    packed = np.sort((q << b) | np.arange(n, dtype=np.int64))
    keys = packed >> b
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    inverse = np.empty(n, dtype=np.int64)
    inverse[packed & ((1 << b) - 1)] = np.cumsum(new) - 1
    return keys[new], inverse


def lookup(keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each ``query`` key in the sorted ``keys``, or -1 where absent (negative queries
    mean 'no such n-gram' and stay -1)."""
    out = np.full(query.shape, -1, dtype=np.int64)
    if len(keys) == 0:
        return out
    idx = np.searchsorted(keys, query)
    idx_c = np.minimum(idx, len(keys) - 1)
    hit = (query >= 0) & (keys[idx_c] == query)
    out[hit] = idx_c[hit]
    return out


@dataclass
class NgramCounts:
    """Raw counts of every n-gram of orders 1..``order`` in a corpus.

    Per order k (lists indexed by k-1): ``keys[k]`` (n_k,) sorted packed keys (for k = 1 the
    word ids 0..V-1), ``counts[k]`` (n_k,) raw counts, ``suffix[k]`` (n_k,) id of the order-(k-1)
    n-gram ``w2 .. wk`` (for k = 1: -1), ``first[k]`` (n_k,) id of the first word.
    """

    vocab: Vocabulary
    order: int
    pad: str
    keys: list[np.ndarray]
    counts: list[np.ndarray]
    suffix: list[np.ndarray]
    first: list[np.ndarray]
    n_tokens: int
    n_sentences: int

    @property
    def V(self) -> int:  # noqa: N802 - the conventional name
        return len(self.vocab)

    def prefix(self, k: int) -> np.ndarray:
        """(n_k,) id of the order-(k-1) prefix of each order-k n-gram (k >= 2)."""
        return self.keys[k - 1] // self.V

    def word(self, k: int) -> np.ndarray:
        """(n_k,) id of the last word of each order-k n-gram."""
        return self.keys[k - 1] % self.V


def ngram_ids(tokens: np.ndarray, pos: np.ndarray, keys: list[np.ndarray], V: int) -> list:
    """Ids of the n-grams ending at every position, per order (-1: absent or crossing the
    sentence start). ``keys`` holds the sorted key tables of orders 2.. (index k-1)."""
    ids = [tokens]
    for k in range(2, len(keys) + 1):
        prev = np.full(tokens.shape, -1, dtype=np.int64)
        prev[1:] = ids[-1][:-1]
        prev[pos < k - 1] = -1
        q = np.where(prev >= 0, prev * V + tokens, -1)
        ids.append(lookup(keys[k - 1], q))
    return ids


def check_order(order: int) -> int:
    """``order`` if it is in 1..:data:`MAX_ORDER`, else a one-line ConfigError."""
    if not 1 <= order <= MAX_ORDER:
        raise ConfigError(f"order must be in 1..{MAX_ORDER}, got {order}")
    return order


def count_ngrams(
    sentences: Sequence[Sequence[str]],
    order: int,
    pad: str = "kenlm",
    vocab_words: Iterable[str] | None = None,
) -> NgramCounts:
    """Count all n-grams of orders 1..``order`` in ``sentences`` (lists of tokens).

    The vocabulary is ``<unk> <s> </s>`` then the words in order of first appearance (plus
    ``vocab_words`` if given); ``<unk>`` has count 0 unless the text contains it literally.
    """
    check_order(order)
    if not sentences:
        raise InputError("no sentences to count (the text is empty)")
    index = word_index()
    words, lengths = encode_new_words(index, sentences)
    check_markers(index, words)
    if vocab_words is not None:
        for w in vocab_words:
            index[w]
    vocab = Vocabulary(list(index))
    enc = encode_ids(words, lengths, order, pad, vocab.bos, vocab.eos)
    keys, counts, suffix, first = count_positions(enc.tokens, enc.pos, order, len(vocab))
    return NgramCounts(
        vocab=vocab,
        order=order,
        pad=pad,
        keys=keys,
        counts=counts,
        suffix=suffix,
        first=first,
        n_tokens=int(enc.predict.sum()),
        n_sentences=enc.n_sentences,
    )


def word_index() -> defaultdict[str, int]:
    """A growing word -> id map that starts with ``<unk> <s> </s>`` (ids 0, 1, 2): a missing
    word gets the current size as its id (``default_factory`` is ``len``), so ids follow the
    order of first appearance, at C speed."""
    index: defaultdict[str, int] = defaultdict()
    index.default_factory = index.__len__
    for special in (UNK, BOS, EOS):
        index[special]
    return index


def encode_new_words(
    index: defaultdict[str, int], sentences: Sequence[Sequence[str]]
) -> tuple[np.ndarray, np.ndarray]:
    """(words (W,) ids of every token, back to back; lengths (S,) per sentence), adding the
    words not yet in ``index``."""
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    words = np.fromiter(
        map(index.__getitem__, chain.from_iterable(sentences)),
        dtype=np.int64,
        count=int(lengths.sum()),
    )
    return words, lengths


def check_markers(index: dict[str, int], words: np.ndarray) -> None:
    """Refuse ``<s>`` / ``</s>`` inside a sentence (ids 1, 2 of :func:`word_index`)."""
    if len(index) > 3 and np.any((words == 1) | (words == 2)):
        raise InputError(
            f"the text contains {BOS} or {EOS} inside a sentence; KenLM and attnlm "
            "add them around every line themselves"
        )


def count_positions(
    tokens: np.ndarray, pos: np.ndarray, order: int, V: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Keys, counts, suffix ids and first words per order (see :class:`NgramCounts`) of the
    n-grams in a flat token array (``tokens``, ``pos`` of :func:`encode_ids`; ids < ``V``)."""
    keys = [np.arange(V, dtype=np.int64)]
    counts = [np.bincount(tokens, minlength=V).astype(np.int64)]
    suffix = [np.full(V, -1, dtype=np.int64)]
    first = [np.arange(V, dtype=np.int64)]
    prev_ids = tokens
    for k in range(2, order + 1):
        valid = np.zeros(len(tokens), dtype=bool)
        valid[1:] = pos[1:] >= k - 1
        where = np.flatnonzero(valid)
        q = prev_ids[where - 1] * V + tokens[where]  # (prefix id, word) packed
        uniq, inverse = unique_inverse(q)
        ids = np.full(len(tokens), -1, dtype=np.int64)
        ids[where] = inverse
        keys.append(uniq)
        counts.append(np.bincount(inverse, minlength=len(uniq)))
        # the suffix w2..wk of the n-gram ending at position p is the order-(k-1) n-gram
        # ending there; every occurrence gives the same value, so a scatter is enough
        suf = np.empty(len(uniq), dtype=np.int64)
        suf[inverse] = prev_ids[where]
        suffix.append(suf)
        first.append(first[-1][uniq // V])
        prev_ids = ids
    return keys, counts, suffix, first
