"""Arrays on disk for the bounded-memory n-gram path (:mod:`attnlm.ngram.bounded`): columns
written and read in blocks, gathers and lookups with sorted indices that read only the window
they need, and an external sort (sorted runs spilled to disk, then a k-way merge).

Nothing here is memory-mapped: a mapped page stays resident (and counts in the process's peak
RSS) while the mapping lives, so blocks are read with ``np.fromfile`` and appended with
``ndarray.tofile``; what is in memory is the blocks the caller asks for.

Shape legend: n = entries of a column, b = entries of a block, r = sorted runs (or sources).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np


class Column:
    """A 1-D array of ``dtype`` in a raw binary file, appended to in blocks, read by range."""

    def __init__(self, path: str | Path, dtype: np.typing.DTypeLike) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.n = 0
        self._out = None

    def __len__(self) -> int:
        return self.n

    def append(self, values: np.ndarray) -> None:
        if self._out is None:
            self._out = open(self.path, "ab")  # noqa: SIM115 - closed by close()/read()
        np.ascontiguousarray(values, dtype=self.dtype).tofile(self._out)
        self.n += len(values)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def read(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Entries lo..hi-1 (hi=None: to the end)."""
        self.close()
        hi = self.n if hi is None else min(hi, self.n)
        if hi <= lo:
            return np.empty(0, dtype=self.dtype)
        return np.fromfile(
            self.path, dtype=self.dtype, count=hi - lo, offset=lo * self.dtype.itemsize
        )

    def blocks(self, size: int) -> Iterator[np.ndarray]:
        """The whole column in blocks of ``size`` entries (the last one shorter)."""
        for lo in range(0, self.n, size):
            yield self.read(lo, lo + size)

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def gather_sorted(src: Column | np.ndarray, idx: np.ndarray, window: int) -> np.ndarray:
    """``src[idx]`` for non-decreasing ``idx``, reading at most ``window`` entries at a time."""
    if isinstance(src, np.ndarray):
        return src[idx]
    out = np.empty(len(idx), dtype=src.dtype)
    i = 0
    while i < len(idx):
        lo = int(idx[i])
        j = i + int(np.searchsorted(idx[i:], lo + window, "left"))
        out[i:j] = src.read(lo, int(idx[j - 1]) + 1)[idx[i:j] - lo]
        i = j
    return out


class SortedLookup:
    """Positions of sorted queries in a sorted column of distinct keys, reading the column
    forward a window at a time; successive calls must bring non-decreasing queries, every one
    of them present in the column."""

    def __init__(self, keys: Column, window: int) -> None:
        self.keys = keys
        self.window = window
        self.start = 0
        self.buf = keys.read(0, window)

    def __call__(self, q: np.ndarray) -> np.ndarray:
        out = np.empty(len(q), dtype=np.int64)
        i = 0
        while i < len(q):
            if len(self.buf) == 0:
                raise RuntimeError("sorted lookup: a query is not in the table")
            j = i + int(np.searchsorted(q[i:], self.buf[-1], "right"))
            at = np.searchsorted(self.buf, q[i:j])
            if not np.array_equal(self.buf[at], q[i:j]):
                raise RuntimeError("sorted lookup: a query is not in the table")
            out[i:j] = self.start + at
            i = j
            if i < len(q):  # the rest lies past this window
                self.start += len(self.buf)
                self.buf = self.keys.read(self.start, self.start + self.window)
        return out


Block = tuple[np.ndarray, ...]


def merge_rounds(sources: Sequence[Iterator[Block]]) -> Iterator[list[tuple[int, Block]]]:
    """k-way merge of sorted streams, a round at a time.

    Each source yields blocks ``(keys, *payload)`` whose keys are non-decreasing across blocks.
    Each round takes, from every source, its buffered entries with keys up to the frontier (the
    smallest last key among the buffers of sources that have more blocks to come) and yields
    ``[(source index, its slice), ...]``: every key of a round is <= every key of the next, and
    a key that no source repeats comes in one round whole. Two blocks per source are in memory.
    """
    n = len(sources)
    buf: list[Block | None] = [next(s, None) for s in sources]
    ahead: list[Block | None] = [
        next(s, None) if b is not None else None for s, b in zip(sources, buf)
    ]
    while True:
        for s in range(n):
            while buf[s] is not None and len(buf[s][0]) == 0:
                buf[s] = ahead[s]
                ahead[s] = next(sources[s], None) if buf[s] is not None else None
        live = [s for s in range(n) if buf[s] is not None]
        if not live:
            return
        bounded = [buf[s][0][-1] for s in live if ahead[s] is not None]
        frontier = min(bounded) if bounded else None
        parts = []
        for s in live:
            b = buf[s]
            cut = len(b[0]) if frontier is None else int(np.searchsorted(b[0], frontier, "right"))
            parts.append((s, tuple(a[:cut] for a in b)))
            buf[s] = tuple(a[cut:] for a in b)
        yield parts


class ExternalSort:
    """Rows ``(key int64, *payload)`` sorted by key in bounded memory: rows are buffered up to
    ``run_size``, each full buffer is sorted and written as a run in ``folder``, and
    :meth:`merged` yields the sorted rows in blocks (a k-way merge of the runs). The order of
    rows with equal keys is unspecified."""

    def __init__(
        self, folder: Path, name: str, payload: Sequence[np.typing.DTypeLike], run_size: int
    ) -> None:
        self.folder, self.name = Path(folder), name
        self.dtypes = [np.dtype(np.int64)] + [np.dtype(d) for d in payload]
        self.run_size = run_size
        self.pending: list[Block] = []
        self.buffered = 0
        self.runs: list[list[Column]] = []

    def add(self, key: np.ndarray, *payload: np.ndarray) -> None:
        self.pending.append((key, *payload))
        self.buffered += len(key)
        if self.buffered >= self.run_size:
            self._spill()

    def _sorted_pending(self) -> Block:
        cols = [np.concatenate(c) for c in zip(*self.pending)]
        self.pending, self.buffered = [], 0
        order = np.argsort(cols[0])
        return tuple(c[order] for c in cols)

    def _spill(self) -> None:
        r = len(self.runs)
        run = [
            Column(self.folder / f"{self.name}.run{r}.{j}", d) for j, d in enumerate(self.dtypes)
        ]
        for column, values in zip(run, self._sorted_pending()):
            column.append(values)
            column.close()
        self.runs.append(run)

    def merged(self, block: int) -> Iterator[Block]:
        """All rows sorted by key, in blocks of about ``block`` rows (more when a merge round
        brings more); runs are read ``block // (2 r)`` rows at a time."""
        if not self.runs:
            if self.pending:
                rows = self._sorted_pending()
                for lo in range(0, len(rows[0]), block):
                    yield tuple(c[lo : lo + block] for c in rows)
            return
        if self.pending:
            self._spill()
        per = max(block // (2 * len(self.runs)), 1)
        sources = [zip(*(c.blocks(per) for c in run)) for run in self.runs]
        for parts in merge_rounds(sources):
            cols = [np.concatenate(c) for c in zip(*(p for _, p in parts))]
            order = np.argsort(cols[0])
            yield tuple(c[order] for c in cols)

    def delete(self) -> None:
        for run in self.runs:
            for column in run:
                column.delete()
        self.runs, self.pending = [], []


class DenseWriter:
    """Appends a dense column of ``n`` entries from sparse, increasing positions: the entries
    never given are ``fill``; values at one position given in successive calls are added."""

    def __init__(self, column: Column, fill: float = 0) -> None:
        self.column = column
        self.fill = fill
        self.pending: tuple[int, np.ndarray] | None = None  # (position, value) not yet written

    def add(self, pos: np.ndarray, values: np.ndarray) -> None:
        """``pos`` increasing (distinct), >= every position given before."""
        if len(pos) == 0:
            return
        values = np.asarray(values, dtype=self.column.dtype).copy()
        if self.pending is not None:
            p, v = self.pending
            if pos[0] == p:
                values[0] += v
            else:
                self._write([p], [v])
        self._write(pos[:-1], values[:-1])
        self.pending = (int(pos[-1]), values[-1])

    def _write(self, pos: Sequence[int] | np.ndarray, values: Sequence | np.ndarray) -> None:
        if len(pos) == 0:
            return
        self._fill_to(int(pos[0]))
        dense = np.full(int(pos[-1]) + 1 - self.column.n, self.fill, dtype=self.column.dtype)
        dense[np.asarray(pos) - self.column.n] = values
        self.column.append(dense)

    def _fill_to(self, end: int, step: int = 1 << 20) -> None:
        while self.column.n < end:
            self.column.append(
                np.full(min(step, end - self.column.n), self.fill, self.column.dtype)
            )

    def finish(self, n: int) -> Column:
        """Write what is pending and fill up to ``n`` entries."""
        if self.pending is not None:
            self._write([self.pending[0]], [self.pending[1]])
            self.pending = None
        self._fill_to(n)
        self.column.close()
        return self.column
