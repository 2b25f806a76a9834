"""The windows, batches and noise words of word2vec training: :class:`NoiseSampler` (the
``count ** 0.75`` table), :func:`make_groups` (skip-gram centre words grouped by reach),
:func:`make_cbow_batch` (CBOW contexts by arithmetic on positions), :func:`batches` (the
subsampled text cut into batches with their learning rates) and the worker threads that run
them (see :mod:`attnlm.word2vec.train`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnlm.word2vec.config import Word2VecConfig
from attnlm.word2vec.steps import CbowBatch, Group
from attnlm.word2vec.vocab import alias_table


class NoiseSampler:
    """Draws noise words from ``p`` with an alias table (:func:`alias_table`)."""

    def __init__(self, p: np.ndarray) -> None:
        keep, alias = alias_table(p)
        self.keep = torch.from_numpy(keep.astype(np.float32))
        self.alias = torch.from_numpy(alias)

    def draw(self, shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
        k = torch.randint(0, len(self.keep), shape, generator=gen)
        stay = torch.rand(shape, generator=gen) < self.keep[k]
        return torch.where(stay, k, self.alias[k])


def make_groups(
    ids: np.ndarray,
    sent: np.ndarray,
    reach: np.ndarray,
    start: int,
    stop: int,
    window: int,
    negatives: Tensor,
) -> list[Group]:
    """The skip-gram centre words at positions ``start..stop`` of the (subsampled) ``ids``
    with their contexts, one :class:`Group` per reach; ``negatives`` ``(stop - start, K)``
    are theirs in position order."""
    n = len(ids)
    pos = np.arange(start, stop)
    groups = []
    for r in range(1, window + 1):
        at = np.flatnonzero(reach[start:stop] == r)
        if not len(at):
            continue
        p = pos[at]
        offsets = np.concatenate([np.arange(-r, 0), np.arange(1, r + 1)])
        q = p[:, None] + offsets[None, :]  # (B, 2r)
        inside = (q >= 0) & (q < n)
        qc = np.where(inside, q, 0)
        valid = inside & (sent[qc] == sent[p][:, None])
        centres = torch.from_numpy(ids[p].astype(np.int64))
        noise = negatives[torch.from_numpy(at)]
        ctx = torch.from_numpy(np.where(valid, ids[qc], 0).astype(np.int64))
        groups.append(Group(centres, ctx, noise, valid=torch.from_numpy(valid)))
    return groups


def sentence_bounds(sent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position of a text whose sentence numbers ``sent`` never decrease: the
    positions of the first and the last word of its sentence."""
    starts = np.flatnonzero(np.diff(sent, prepend=-1))  # where each sentence starts
    lengths = np.diff(starts, append=len(sent))
    return np.repeat(starts, lengths), np.repeat(starts + lengths - 1, lengths)


def make_cbow_batch(
    ids: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray],
    reach: np.ndarray,
    start: int,
    stop: int,
    negatives: Tensor,
) -> CbowBatch:
    """The CBOW centre words at positions ``start..stop`` of the (subsampled) ``ids`` with
    their contexts (``bounds``: :func:`sentence_bounds`); ``negatives`` ``(runs, K)``: the
    rows are padded with empty ones (which predict nothing) to ``runs x share`` rows.

    A context is two runs of words, ``left`` before the centre word and ``right`` after it
    (the reach, cut at the sentence's ends), so every index comes from arithmetic on the
    positions, in a few numpy operations per batch."""
    n, runs = stop - start, len(negatives)
    pad = runs * -(-n // runs) - n
    pos, r = np.arange(start, stop), reach[start:stop]
    left = np.minimum(r, pos - bounds[0][start:stop])
    right = np.minimum(r, bounds[1][start:stop] - pos)
    counts = np.concatenate([left + right, np.zeros(pad, dtype=left.dtype)]).astype(np.int8)
    order = np.argsort(-counts, kind="stable")  # most context words first, the padding last
    pos, left, counts = pos[order[:n]], left[order[:n]], counts[order].astype(np.int64)
    offsets = np.cumsum(counts) - counts

    def words(row: np.ndarray, j: np.ndarray) -> np.ndarray:  # the j-th word of each row
        q = pos[row] - left[row] + j
        return ids[q + (j >= left[row])]  # (skipping the centre word)

    row = np.repeat(np.arange(len(counts)), counts)
    contexts = words(row, np.arange(len(row)) - offsets[row])  # row by row
    widths = np.bincount(counts, minlength=1)[::-1].cumsum()[::-1][1:]  # rows with > j words
    col = np.repeat(np.arange(len(widths)), widths)
    columns = words(np.arange(len(col)) - np.repeat(widths.cumsum() - widths, widths), col)
    centres = np.concatenate([ids[pos], np.zeros(pad, dtype=ids.dtype)])
    arrays = (centres, counts, contexts, offsets, columns)
    tensors = [torch.from_numpy(x.astype(np.int64, copy=False)) for x in arrays]
    return CbowBatch(*tensors, [int(w) for w in widths], negatives)


@dataclass
class Batch:
    work: list[Group] | CbowBatch | None  # skip-gram groups or a CBOW batch
    alpha: float
    epoch: int
    words: float  # raw words done after this batch, over all epochs
    last: bool  # the epoch's last batch


def batches(
    ids_all: np.ndarray,
    sent_all: np.ndarray,
    keep_p: np.ndarray,
    raw_words: int,
    noise: NoiseSampler,
    cfg: Word2VecConfig,
) -> Iterator[Batch]:
    """Every epoch: subsample, draw the reaches, then cut the centre words into batches with
    their contexts and noise words; the learning rate falls linearly with the raw words
    done."""
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    total = raw_words * cfg.epochs
    per_id = raw_words / max(len(ids_all), 1)  # raw words each in-vocabulary word stands for
    for epoch in range(cfg.epochs):
        kept = rng.random(len(ids_all)) < keep_p
        ids, sent = ids_all[kept], sent_all[kept]
        where = np.flatnonzero(kept)  # positions before subsampling, for the progress
        reach = cfg.window - rng.integers(0, cfg.window, len(ids))
        starts = range(0, len(ids), cfg.batch)
        if not cfg.sg:  # the sentences' ends, and the noise words of every run of the epoch
            bounds = sentence_bounds(sent)
            runs = [-(-(min(cfg.batch, len(ids) - a)) // cfg.noise_share) for a in starts]
            epoch_neg = noise.draw((sum(runs), cfg.negative), gen).split(runs)
        for start in starts:
            stop = min(start + cfg.batch, len(ids))
            frac = (epoch * raw_words + where[start] * per_id) / total
            alpha = cfg.alpha - (cfg.alpha - cfg.min_alpha) * frac
            work: list[Group] | CbowBatch
            if cfg.sg:
                neg = noise.draw((stop - start, cfg.negative), gen)
                work = make_groups(ids, sent, reach, start, stop, cfg.window, neg)
            else:
                neg = epoch_neg[start // cfg.batch]
                work = make_cbow_batch(ids, bounds, reach, start, stop, neg)
            last = stop == len(ids)
            done = epoch * raw_words + (raw_words if last else (where[stop - 1] + 1) * per_id)
            yield Batch(work, alpha, epoch, done, last)
        if not len(ids):
            yield Batch(None, cfg.alpha, epoch, (epoch + 1) * raw_words, True)


def run_workers(work: Callable[[], None], workers: int) -> None:
    """``work`` in ``workers`` threads sharing the parameters without locks (Hogwild, as
    word2vec.c and gensim: a rare lost update is harmless); the first error is raised."""
    if workers == 1:
        work()
        return
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - raised in the caller
            errors.append(e)

    pool = [threading.Thread(target=run, daemon=True) for _ in range(workers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def prefetch(items: Iterator[Batch], depth: int = 4) -> Iterator[Batch]:
    """``items`` made in a background thread (numpy and torch release the GIL), as gensim's
    job producer feeds its workers."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(end)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(e)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
