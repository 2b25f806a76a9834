"""Modified Kneser-Ney streamed over the merged count tables of :mod:`attnlm.ngram.bounded_count`,
and the ARPA file written from disk, in bounded memory.

The arithmetic is :mod:`attnlm.ngram.smoothing`'s, applied to blocks that hold whole contexts
(:func:`~attnlm.ngram.smoothing.interpolation_terms` sums in table order), so every number has
the bits of the in-memory estimate. What the in-memory estimator gets by indexing whole
arrays, this gets from sorted passes, as lmplz does (Heafield et al. 2013):

* whether an n-gram starts with ``<s>``, and its suffix key (suffix id of its prefix, last
  word): gathers with the prefix ids, which are non-decreasing in table order;
* its suffix id (position of w2..wk among the order-(k-1) n-grams): the suffix keys sorted on
  disk (:class:`~attnlm.ngram.disk.ExternalSort`), then found in the sorted order-(k-1) table;
* the continuation counts of order k-1: run lengths of the sorted suffix ids;
* p(w2..wk), for p(w1..wk) = u + gamma(w1..wk-1) p(w2..wk): read along the sorted suffix ids,
  then sorted back to table order;
* a context's denominator, discount mass and gamma: in the block that holds all its n-grams.

Level k (2..N) does the first three for order k and then finishes order k-1 (adjusted counts,
discounts, probabilities, back-off weights of order k-2); after the last level, order N.
Files per order k in the temporary folder: ``bos`` (starts with <s>), ``suf`` (suffix id),
``cont``, ``adj``, ``lowp`` (p of the suffix), ``p``; ``logp`` and ``bo`` (float32, what the
ARPA file prints) stay until the file is written.

Shape legend: V = vocabulary size, n_k = order-k n-grams, b = entries of a block.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnlm.ngram.arpa_write import word_tuples, write_sections
from attnlm.ngram.bounded_count import Budget, Counted
from attnlm.ngram.disk import (
    Column,
    DenseWriter,
    ExternalSort,
    SortedLookup,
    gather_sorted,
)
from attnlm.ngram.progress import progress_bar
from attnlm.ngram.smoothing import (
    Discount,
    backoff_log10,
    counts_of_counts,
    discount_from,
    estimate_discount,
    interpolation_terms,
)

Table = Column | np.ndarray  # order 1 lives in memory, the others on disk


def _log10(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log10(x)


class _Estimate:
    """The state of one streamed estimate: per order k, the tables listed in the module
    docstring (dicts keyed by k; order 1 as arrays)."""

    def __init__(self, counted: Counted, order: int, folder: Path, budget: Budget, bar) -> None:
        self.N = order
        self.V = V = len(counted.vocab)
        self.bos = counted.vocab.bos
        self.folder = folder
        self.B = budget.block
        self.bar = bar
        self.keys: dict[int, Table] = {1: np.arange(V, dtype=np.int64)}
        self.counts: dict[int, Table] = {1: counted.unigrams}
        for k in range(2, order + 1):
            self.keys[k] = counted.keys[k - 2]
            self.counts[k] = counted.counts[k - 2]
        self.sizes = [len(self.keys[k]) for k in range(1, order + 1)]
        self.starts_bos: dict[int, Table] = {1: np.arange(V) == self.bos}
        self.suf: dict[int, Table] = {}
        self.lowp: dict[int, Table] = {}
        self.p: dict[int, Table] = {}
        self.logp: dict[int, Column] = {}
        self.bo: dict[int, Column] = {}
        self.discounts: list[Discount] = []

    def column(self, name: str, k: int, dtype) -> Column:
        return Column(self.folder / f"{name}{k}", dtype)

    def run(self) -> None:
        for k in range(2, self.N + 1):
            cont, pairs = self.suffixes(k)
            self.finish_order(k - 1, cont)
            self.lower_probs(k, pairs)
        self.finish_order(self.N, None)

    # -- level k: suffixes of order k, continuation counts of order k-1 ---------------------
    def suffixes(self, k: int) -> tuple[Table, tuple[Column, Column] | None]:
        """Write ``bos[k]`` (and ``suf[2]``); return the continuation counts of order k-1 and,
        for k >= 3, the (suffix id, position) pairs of order k sorted by suffix id."""
        V, B = self.V, self.B
        starts_bos = self.column("bos", k, np.bool_)
        if k == 2:
            self.suf[2] = suf = self.column("suf", 2, np.int64)
            cont = np.zeros(V, dtype=np.int64)
            for key in self.keys[2].blocks(B):
                prefix, word = np.divmod(key, V)
                starts_bos.append(self.starts_bos[1][prefix])
                suf.append(word)
                cont += np.bincount(word, minlength=V)
            self.starts_bos[2] = starts_bos
            return cont, None
        by_suffix = ExternalSort(self.folder, f"suffix{k}", [np.int64], B)
        at = 0
        for key in self.keys[k].blocks(B):
            prefix, word = np.divmod(key, V)
            starts_bos.append(gather_sorted(self.starts_bos[k - 1], prefix, B))
            suffix_key = gather_sorted(self.suf[k - 1], prefix, B) * V + word
            by_suffix.add(suffix_key, np.arange(at, at + len(key)))
            at += len(key)
        self.starts_bos[k] = starts_bos
        self._drop(self.suf, k - 1)
        find = SortedLookup(self.keys[k - 1], B)
        suf_sorted = self.column("sufsorted", k, np.int64)
        pos_sorted = self.column("possorted", k, np.int64)
        cont = DenseWriter(self.column("cont", k - 1, np.int64))
        for suffix_key, pos in by_suffix.merged(B):
            j = find(suffix_key)
            suf_sorted.append(j)
            pos_sorted.append(pos)
            cont.add(*np.unique(j, return_counts=True))
        by_suffix.delete()
        return cont.finish(self.sizes[k - 2]), (suf_sorted, pos_sorted)

    def lower_probs(self, k: int, pairs: tuple[Column, Column] | None) -> None:
        """``lowp[k]``: p of each order-k n-gram's suffix, in table order (and ``suf[k]``)."""
        B = self.B
        lowp = self.column("lowp", k, np.float64)
        if k == 2:
            for key in self.keys[2].blocks(B):
                lowp.append(self.p[1][key % self.V])
        else:
            suf_sorted, pos_sorted = pairs
            back = ExternalSort(self.folder, f"back{k}", [np.int64, np.float64], B)
            for j, pos in zip(suf_sorted.blocks(B), pos_sorted.blocks(B)):
                back.add(pos, j, gather_sorted(self.p[k - 1], j, B))
            suf_sorted.delete()
            pos_sorted.delete()
            self.suf[k] = suf = self.column("suf", k, np.int64)
            done = 0
            for pos, j, pv in back.merged(B):
                if len(pos) and (pos[0] != done or pos[-1] != done + len(pos) - 1):
                    raise RuntimeError("bounded estimate: suffix positions out of step")
                done += len(pos)
                suf.append(j)
                lowp.append(pv)
            back.delete()
        self.lowp[k] = lowp
        self._drop(self.p, k - 1)

    # -- finishing an order: adjusted counts, discounts, probabilities -----------------------
    def finish_order(self, m: int, cont: Table | None) -> None:
        adj, d = self.adjusted(m, cont)
        self.discounts.append(d)
        self.probabilities(m, adj, d)

    def adjusted(self, m: int, cont: Table | None) -> tuple[Table, Discount]:
        """Adjusted counts of order m (see :func:`attnlm.ngram.smoothing.adjusted_counts`)."""
        if m == 1:
            a = (
                self.counts[1].copy()
                if cont is None
                else np.where(self.starts_bos[1], self.counts[1], cont)
            )
            a[self.bos] = 0  # <s> is never predicted
            return a, estimate_discount(a, 1)
        if cont is None:  # the highest order: raw counts
            t = [0, 0, 0, 0]
            for c in self.counts[m].blocks(self.B):
                t = [x + y for x, y in zip(t, counts_of_counts(c))]
            return self.counts[m], discount_from(t, m)
        adj = self.column("adj", m, np.int64)
        t = [0, 0, 0, 0]
        blocks = zip(
            self.counts[m].blocks(self.B), self.starts_bos[m].blocks(self.B), cont.blocks(self.B)
        )
        for c, starts_bos, n in blocks:
            a = np.where(starts_bos, c, n)
            adj.append(a)
            t = [x + y for x, y in zip(t, counts_of_counts(a))]
        for done in (cont, self.counts.pop(m), self.starts_bos.pop(m)):
            done.delete()
        return adj, discount_from(t, m)

    def probabilities(self, m: int, adj: Table, d: Discount) -> None:
        """``p[m]`` (when a higher order needs it), ``logp[m]`` and ``bo[m-1]``."""
        V = self.V
        logp = self.logp[m] = self.column("logp", m, np.float32)
        if m == 1:
            u, gamma = interpolation_terms(adj, d, np.zeros(V, dtype=np.int64), 1)
            p = self.p[1] = u + gamma[0] / (V - 1)
            lp = _log10(p)
            lp[self.bos] = 0.0  # as KenLM writes it
            logp.append(lp)
            self.bar.update(V)
            return
        p_out = self.column("p", m, np.float64) if m < self.N else None
        bo = DenseWriter(self.column("bo", m - 1, np.float32))
        for key, a, lowp in context_blocks([self.keys[m], adj, self.lowp[m]], V, self.B):
            prefix = key // V
            first = int(prefix[0])
            local = prefix - first
            u, gamma = interpolation_terms(a, d, local, int(local[-1]) + 1)
            p = u + gamma[local] * lowp
            if p_out is not None:
                p_out.append(p)
            logp.append(_log10(p))
            bo.add(np.arange(first, first + len(gamma)), backoff_log10(gamma))
            self.bar.update(len(key))
        self.bo[m - 1] = bo.finish(self.sizes[m - 2])
        if p_out is not None:
            self.p[m] = p_out
        self._drop(self.lowp, m)
        if m < self.N:
            adj.delete()

    @staticmethod
    def _drop(tables: dict[int, Table], k: int) -> None:
        t = tables.pop(k, None)
        if isinstance(t, Column):
            t.delete()

    # -- the ARPA file -----------------------------------------------------------------------
    def sections(self) -> Iterator[Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]]:
        for k in range(1, self.N + 1):
            yield self._lines(k)

    def _lines(self, k: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        # formatting holds about 200 bytes per line of a block (word tuples, gathers, the
        # number tables and their indices): blocks of 1/8 of the estimate's
        B, N, V = max(self.B // 8, 64), self.N, self.V
        bo = self.bo[k].blocks(B) if k < N else itertools.repeat(None)
        for key, logp, b in zip(_blocks(self.keys[k], B), self.logp[k].blocks(B), bo):
            ids = word_tuples(key, k, V, lambda m, idx: gather_sorted(self.keys[m], idx, B))
            yield ids, logp, b


def _blocks(table: Table, size: int) -> Iterator[np.ndarray]:
    if isinstance(table, np.ndarray):
        return (table[lo : lo + size] for lo in range(0, len(table), size))
    return table.blocks(size)


def context_blocks(columns: list[Column], V: int, size: int) -> Iterator[list[np.ndarray]]:
    """Aligned blocks of ``columns`` (the first: keys ``prefix * V + word``, sorted) of about
    ``size`` entries, cut between contexts: every context's n-grams are in one block."""
    carry = None
    for blocks in zip(*(c.blocks(size) for c in columns)):
        if carry is not None:
            blocks = [np.concatenate((a, b)) for a, b in zip(carry, blocks)]
        prefix = blocks[0] // V
        cut = int(np.searchsorted(prefix, prefix[-1], "left"))
        if cut == 0:  # one context so far: read on
            carry = blocks
            continue
        yield [b[:cut] for b in blocks]
        carry = [b[cut:] for b in blocks]
    if carry is not None and len(carry[0]):
        yield carry


def estimate_and_write(
    counted: Counted, order: int, path, folder: Path, budget: Budget, progress: bool
) -> tuple[list[int], list[tuple[float, float, float]]]:
    """Estimate modified Kneser-Ney from the merged counts and write the ARPA file; returns
    the n-grams per order and the discounts."""
    sizes = [len(counted.vocab)] + [len(c) for c in counted.keys]
    with progress_bar(sum(sizes), "estimate", progress) as bar:
        est = _Estimate(counted, order, folder, budget, bar)
        est.run()
    write_sections(path, counted.vocab.words, est.sizes, est.sections(), progress)
    return est.sizes, [d.as_tuple() for d in est.discounts]
