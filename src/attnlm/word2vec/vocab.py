"""Words, the vocabulary, and the three sampling tables of word2vec (Mikolov et al. 2013).

* **Sentences.** A text is lower-cased and split into words (``\\w+`` with inner apostrophes:
  ``o'er``, ``'tis`` -> ``tis``); a *sentence* is a paragraph (lines up to a blank line), so
  a context window never crosses a speech of the built-in corpus.
* **Vocabulary.** Words seen at least ``min_count`` times, most frequent first (ties: first
  seen first, as gensim); the others are dropped from the sentences before any window is
  taken (as gensim and word2vec.c do).
* **Subsampling of frequent words.** A word of count ``c`` is kept with probability
  ``min(1, (sqrt(c / t) + 1) * t / c)`` where ``t = sample * total_count`` (word2vec.c's and
  gensim's formula; ``sample = 0`` keeps every word).
* **Noise distribution.** Negatives are drawn with probability proportional to
  ``count ** 0.75``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from attnlm.base.errors import InputError

WORD = re.compile(r"\w+(?:'\w+)*")
PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n")
NOISE_POWER = 0.75


def words_of(text: str) -> list[str]:
    """The words of ``text``, lower-cased (the tokenization of ``attnlm word2vec train``)."""
    return WORD.findall(text.lower())


def split_sentences(text: str) -> list[list[str]]:
    """``text`` as word2vec sentences: one per paragraph, empty ones dropped."""
    return [ws for ws in map(words_of, PARAGRAPH.split(text)) if ws]


@dataclass
class Vocab:
    """``words`` most frequent first and their ``counts`` (int64)."""

    words: list[str]
    counts: np.ndarray

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_count: int = 5) -> Vocab:
        counter: Counter[str] = Counter()
        for s in sentences:
            counter.update(s)
        kept = [(w, c) for w, c in counter.items() if c >= min_count]  # first-seen order
        kept.sort(key=lambda wc: -wc[1])  # stable: ties stay in first-seen order
        if not kept:
            most = max(counter.values(), default=0)
            raise InputError(
                f"no word occurs --min-count {min_count} times (the most frequent occurs "
                f"{most} times): give more text or a lower --min-count"
            )
        return cls([w for w, _ in kept], np.array([c for _, c in kept], dtype=np.int64))

    def encode(self, sentences: Iterable[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """In-vocabulary word ids of all sentences, concatenated (int32), and the sentence
        number of each (int32); out-of-vocabulary words are dropped."""
        index = self.index
        ids: list[int] = []
        sent: list[int] = []
        for k, s in enumerate(sentences):
            row = [index[w] for w in s if w in index]
            ids += row
            sent += [k] * len(row)
        return np.array(ids, dtype=np.int32), np.array(sent, dtype=np.int32)

    def keep_probabilities(self, sample: float) -> np.ndarray:
        """Per word the probability to keep one occurrence (subsampling, module docstring)."""
        c = self.counts.astype(np.float64)
        if sample <= 0:
            return np.ones_like(c)
        t = sample * c.sum()
        return np.minimum(1.0, (np.sqrt(c / t) + 1.0) * t / c)

    def noise(self, power: float = NOISE_POWER) -> np.ndarray:
        """The noise distribution: ``count ** power``, normalised (float64)."""
        p = self.counts.astype(np.float64) ** power
        return p / p.sum()


def alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias method (Vose's construction) for the distribution ``p``: draw ``k``
    uniformly, keep it with probability ``keep[k]``, else take ``alias[k]``; each draw then
    has exactly probability ``p`` (up to float rounding), in O(1)."""
    n = len(p)
    scaled = np.asarray(p, dtype=np.float64) * n
    keep = np.ones(n, dtype=np.float64)
    alias = np.arange(n, dtype=np.int64)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        keep[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    return keep, alias  # leftovers (rounding) keep themselves with probability 1
