"""Word vectors: nearest neighbours, analogies, and the word2vec file formats.

**Formats** (word2vec.c's, read and written by gensim's ``KeyedVectors.load_word2vec_format``
and ``save_word2vec_format``). Both start with a header line ``"<words> <dim>\\n"``.

* *text*: one line per word, ``word v1 v2 ... vdim`` separated by single spaces (we write
  ``%.9g``, which gives back the same float32 values);
* *binary*: per word the UTF-8 word, one space, then ``dim`` little-endian float32 (4 bytes
  each); we end each vector with ``\\n`` as word2vec.c does (gensim writes none; the reader
  takes both).

Which one: ``binary=True/False``, or by default a name ending in ``.bin`` is binary.

**Similarity** follows gensim's ``most_similar``: every word vector and the query are
unit-normalised; the query is the mean of the positive words' unit vectors and the negated
negative ones' (``king - man + woman`` for ``analogy``), normalised again; the answer is the
``top`` words of highest cosine with it, the query words left out.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_open, read_file_bytes
from attnlm.base.foreign import check_finite, foreign_reader


class WordVectors:
    """``words`` (unique, in file order) and ``vectors`` ``(len(words), dim)`` float32."""

    def __init__(self, words: list[str], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(words):
            raise InputError(f"{len(words)} words need a (words, dim) matrix, got {vectors.shape}")
        self.words = list(words)
        self.vectors = vectors
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise InputError("word vectors need unique words")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self.unit = vectors / np.where(norms > 0, norms, 1.0)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    def lookup(self, word: str) -> int:
        """The row of ``word``; an :class:`InputError` when it has no vector."""
        try:
            return self.index[word]
        except KeyError:
            raise InputError(f"{word!r} is not in the vocabulary ({len(self)} words)") from None

    def vector(self, word: str) -> np.ndarray:
        return self.vectors[self.lookup(word)]

    def similarity(self, a: str, b: str) -> float:
        """Cosine of the two words' vectors."""
        return float(self.unit[self.lookup(a)] @ self.unit[self.lookup(b)])

    def most_similar(
        self,
        positive: list[str],
        negative: list[str] = (),  # type: ignore[assignment]
        top: int = 10,
        restrict: int | None = None,
    ) -> list[tuple[str, float]]:
        """The ``top`` words nearest (cosine) to the mean of ``positive`` minus
        ``negative`` (see the module docstring), among the first ``restrict`` words."""
        if not positive and not negative:
            raise InputError("give at least one word")
        rows = [self.lookup(w) for w in [*positive, *negative]]
        weights = np.array([1.0] * len(positive) + [-1.0] * len(negative), dtype=np.float32)
        query = (weights[:, None] * self.unit[rows]).sum(0) / len(rows)
        query = (query / max(float(np.linalg.norm(query)), 1e-30)).astype(np.float32)
        end = len(self) if restrict is None else min(restrict, len(self))
        cos = self.unit[:end] @ query
        want = min(top + len(rows), end)
        best = np.argpartition(-cos, want - 1)[:want] if want < end else np.arange(end)
        best = best[np.lexsort((best, -cos[best]))]
        skip = set(rows)
        return [(self.words[i], float(cos[i])) for i in best if i not in skip][:top]

    def analogy(self, a: str, b: str, c: str, top: int = 10) -> list[tuple[str, float]]:
        """``a - b + c``: ``most_similar([a, c], [b])``; ``analogy("king", "man", "woman")``
        asks what is to woman as king is to man."""
        return self.most_similar([a, c], [b], top)

    # -- files ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], binary: bool | None = None) -> Path:
        """Write the word2vec text or binary format (module docstring), atomically."""
        path = Path(path)
        binary = is_binary_name(path) if binary is None else binary
        n, dim = self.vectors.shape
        with atomic_open(path, "wb") as f:
            f.write(f"{n} {dim}\n".encode())
            if binary:
                little = self.vectors.astype("<f4", copy=False)
                for word, row in zip(self.words, little):
                    f.write(word.encode("utf-8") + b" " + row.tobytes() + b"\n")
            else:
                fmt = " ".join(["%.9g"] * dim)
                for word, row in zip(self.words, self.vectors.tolist()):
                    f.write(f"{word} {fmt % tuple(row)}\n".encode())
        return path

    @classmethod
    @foreign_reader("word2vec", path_arg=1)
    def load(cls, path: str | os.PathLike[str], binary: bool | None = None) -> WordVectors:
        """Read a word2vec text or binary file (ours, gensim's or word2vec.c's)."""
        path = Path(path)
        binary = is_binary_name(path) if binary is None else binary
        data = read_file_bytes(path)
        head, _, body = data.partition(b"\n")
        try:
            n, dim = (int(x) for x in head.split())
            if n < 0 or dim < 1:
                raise ValueError
        except ValueError:
            raise InputError(
                f"{path}: not a word2vec file (the first line should be '<words> <dim>', "
                f"got {head[:40]!r})"
            ) from None
        # each number takes at least 4 bytes (binary) or 2 ("0 ", text): a header asking for
        # far more than the file holds is refused before the table is allocated (small
        # shortfalls are named by the readers, with the line)
        if n * dim > len(body) + (1 << 20):
            raise InputError(
                f"{path}: the header says {n:,} words of {dim:,} numbers, more than the "
                f"{len(data):,}-byte file can hold"
            )
        words, vectors = (_read_binary if binary else _read_text)(path, body, n, dim)
        check_finite(vectors, path, "vector")
        if len(set(words)) != len(words):
            seen: dict[str, int] = {}
            keep = [seen.setdefault(w, i) == i for i, w in enumerate(words)]  # first one wins
            words = [w for w, k in zip(words, keep) if k]
            vectors = vectors[np.array(keep)]
        return cls(words, vectors)


def is_binary_name(path: str | os.PathLike[str]) -> bool:
    """A file name ending in ``.bin`` means the binary format."""
    return str(path).lower().endswith(".bin")


def _read_text(path: Path, body: bytes, n: int, dim: int) -> tuple[list[str], np.ndarray]:
    lines = body.split(b"\n")
    if len(lines) < n or (len(lines) == n and not lines[-1].strip() and n):
        raise InputError(f"{path}: the header says {n} words, the file has fewer lines")
    words = []
    rows = np.empty((n, dim), dtype=np.float32)
    for k in range(n):
        try:
            parts = lines[k].rstrip().decode("utf-8").split(" ")
            rows[k] = np.array(parts[1:], dtype=np.float32)
        except (UnicodeDecodeError, ValueError):
            raise InputError(
                f"{path}: line {k + 2} is not a word and {dim} numbers (a binary file? name "
                "it *.bin or pass --format binary)"
            ) from None
        words.append(parts[0])
    return words, rows


def _read_binary(path: Path, body: bytes, n: int, dim: int) -> tuple[list[str], np.ndarray]:
    words = []
    rows = np.empty((n, dim), dtype=np.float32)
    size = 4 * dim
    at = 0
    for k in range(n):
        space = body.find(b" ", at)
        if space < 0 or space + 1 + size > len(body):
            raise InputError(f"{path}: the header says {n} words, the file ends after {k}")
        try:
            words.append(body[at:space].decode("utf-8").lstrip("\n"))
        except UnicodeDecodeError:
            raise InputError(
                f"{path}: word {k + 1} is not UTF-8 (a text file? pass --format text)"
            ) from None
        rows[k] = np.frombuffer(body, dtype="<f4", count=dim, offset=space + 1)
        at = space + 1 + size
    return words, rows
