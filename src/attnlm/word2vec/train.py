"""Training word2vec: skip-gram and CBOW with negative sampling, batched in PyTorch on a CPU.

(Over 500 lines on purpose: the two batched steps with their hand-written gradients, the
windows, the schedule and the worker threads they share are one algorithm read together.)

The model (Mikolov et al. 2013) has two tables of ``V x dim`` vectors: the input vectors
``syn0`` (the word vectors kept at the end, initialised uniform in ``[-0.5, 0.5) / dim``) and
the output vectors ``syn1neg`` (initialised to zero). For each position of a sentence, after
subsampling frequent words, a *reach* ``r`` is drawn uniformly from ``1..window`` (the
dynamic window: near words count more often) and the context is the up to ``2r`` words
within ``r`` positions in the same sentence.

* **Skip-gram** (``sg``): every context word ``c`` predicts the centre word ``w``. With the
  input vector ``v_c`` and output vectors ``u``, the pair's objective is
  ``log s(u_w . v_c) + sum_k log s(-u_nk . v_c)`` over ``K = negative`` noise words ``n_k``
  drawn from ``count ** 0.75`` (word2vec.c's orientation, as gensim).
* **CBOW**: the mean ``h`` of the context words' input vectors predicts ``w``:
  ``log s(u_w . h) + sum_k log s(-u_nk . h)``; the gradient of ``h`` is added, undivided, to
  each context word's input vector (word2vec.c and gensim with ``cbow_mean=1``).

Plain SGD, one step per centre word, with the learning rate falling linearly from ``alpha``
to ``min_alpha`` over all epochs' words; a noise word equal to the centre word is skipped.

**Batching.** word2vec.c and gensim walk the text one pair at a time (``K + 1`` dot products
per pair, in C). Here ``batch`` centre words at a time are one set of tensor operations:
the skip-gram pairs of one centre word share their ``K`` noise words (the *HogBatch*
arrangement of Ji et al. 2016, "Parallelizing Word2Vec in Shared and Distributed Memory"):
each pair still has ``K`` noise words from the same distribution, so the objective is the
same in expectation, and a window becomes a small matrix product
``(2r x dim) @ (dim x (K + 1))`` instead of ``2r (K + 1)`` separate dot products and
``2r (K + 2)`` rows to touch. The centre words of a batch are grouped by reach, so each
group is one dense ``bmm`` with little padding.

CBOW does only ``K + 1`` dot products per centre word, so there the fixed costs decide:
``cbow_step`` is a dozen tensor operations per batch whatever its size. The contexts are
built by arithmetic on positions (a context is the run of words left of the centre word and
the run right of it, each cut at the sentence's end); ``h`` is one ``embedding_bag`` (mean);
``noise_share`` centre words share their ``K`` noise words (each centre word still has ``K``
draws from the noise distribution, so the expected update is unchanged), so their scores and
the noise rows' gradients are small matrix products and a batch touches ``K / noise_share``
noise rows per centre word instead of ``K``; the rows are sorted by their number of context
words so that the ``j``-th context words of all rows are one ``index_add_`` of a prefix of
the ``dh`` rows, with nothing copied.

All gradients of a batch are computed from the same parameters and added with
``index_add_`` (a word seen several times in a batch gets the sum of its updates, as it
would get them one after the other). ``reference_step`` is the same update written one
centre word at a time; the tests hold both batched steps to it.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlm.errors import ConfigError
from attnlm.validate import fraction, positive
from attnlm.word2vec.vectors import WordVectors
from attnlm.word2vec.vocab import Vocab, alias_table, split_sentences


@dataclass(frozen=True)
class Word2VecConfig:
    """Settings, named and defaulted as gensim's ``Word2Vec`` (``sg=True`` is skip-gram)."""

    dim: int = 100
    window: int = 5
    negative: int = 5
    min_count: int = 5
    epochs: int = 5
    sg: bool = True
    sample: float = 1e-3
    alpha: float = 0.025
    min_alpha: float = 0.0001
    seed: int = 1
    workers: int = 1
    batch: int = 4096  # centre words per batched step
    noise_share: int = 8  # CBOW: centre words of a batch that share their noise words

    def __post_init__(self) -> None:
        counts = ("dim", "window", "negative", "min_count", "epochs", "workers", "batch")
        positive(self, *counts, "noise_share", where="word2vec")
        fraction(self, "sample", where="word2vec")
        if not (0 <= self.min_alpha <= self.alpha) or not math.isfinite(self.alpha):
            raise ConfigError(
                f"word2vec needs 0 <= min_alpha <= alpha, got {self.min_alpha} and {self.alpha}"
            )


@dataclass
class Progress:
    """What a progress callback sees after each batch: ``words`` (raw words of the text
    processed so far, over all epochs, of ``total_words``), ``epoch`` (1-based), ``alpha``,
    ``elapsed`` seconds, ``loss`` (mean loss per predicted word so far this epoch)."""

    words: int
    total_words: int
    epoch: int
    alpha: float
    elapsed: float
    loss: float

    @property
    def words_per_s(self) -> float:
        return self.words / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float:
        rate = self.words_per_s
        return (self.total_words - self.words) / rate if rate > 0 else float("inf")


@dataclass
class TrainResult:
    """The vectors, the vocabulary counts, the mean loss of each epoch, words/s; ``seconds``
    of training (wall clock) and ``cpu_seconds`` (CPU time of all the process's threads
    meanwhile)."""

    vectors: WordVectors
    vocab: Vocab
    epoch_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    words: int = 0
    cpu_seconds: float = 0.0

    @property
    def words_per_s(self) -> float:
        return self.words / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# one batched step


@dataclass
class Group:
    """The centre words of one batch that have reach ``r``. Skip-gram: ``contexts``
    ``(B, 2r)`` word ids (padding points at word 0) and ``valid`` ``(B, 2r)``. CBOW (the
    form :func:`reference_step` reads; :meth:`CbowBatch.as_group`): ``contexts`` flat
    ``(M,)`` with ``owner`` ``(M,)`` (the row of the centre word each belongs to).
    ``centres`` ``(B,)``, ``negatives`` ``(B, K)``."""

    centres: Tensor
    contexts: Tensor
    negatives: Tensor
    valid: Tensor | None = None
    owner: Tensor | None = None


def _loss_and_grad(s: Tensor, weight: Tensor, alpha: float) -> tuple[Tensor, float]:
    """For scores ``s`` whose last dimension is [centre word, noise words...]: the SGD step
    ``alpha * (label - sigmoid(s)) * weight`` and the summed loss ``-log sigmoid(+-s)``."""
    p = torch.sigmoid(s)
    p_label = p.clone()
    p_label[..., 1:] = 1.0 - p[..., 1:]
    loss = -float((torch.log(p_label.clamp_(min=1e-30)) * weight).sum())
    grad = p.neg_()
    grad[..., 0] += 1.0
    return grad.mul_(weight).mul_(alpha), loss


def batched_step(
    syn0: Tensor, syn1: Tensor, groups: Sequence[Group], alpha: float
) -> tuple[float, int]:
    """Apply one batch of skip-gram SGD updates in place; return (summed loss, predicted
    words)."""
    total_loss = 0.0
    total_n = 0
    dim = syn0.shape[1]
    for g in groups:
        assert g.valid is not None
        outputs = torch.cat([g.centres[:, None], g.negatives], dim=1)  # (B, 1+K)
        keep = torch.ones(outputs.shape, dtype=syn0.dtype)
        keep[:, 1:] = g.negatives != g.centres[:, None]  # a noise word equal to w is skipped
        u = syn1.index_select(0, outputs.view(-1)).view(*outputs.shape, dim)  # (B, 1+K, C)
        v = syn0.index_select(0, g.contexts.view(-1)).view(*g.contexts.shape, dim)
        s = torch.bmm(v, u.transpose(1, 2))  # (B, 2r, 1+K)
        weight = g.valid.to(syn0.dtype)[:, :, None] * keep[:, None, :]
        grad, loss = _loss_and_grad(s, weight, alpha)
        total_n += int(g.valid.sum())
        syn0.index_add_(0, g.contexts.view(-1), torch.bmm(grad, u).view(-1, dim))
        du = torch.bmm(grad.transpose(1, 2), v)  # (B, 1+K, C)
        total_loss += loss
        syn1.index_add_(0, outputs.view(-1), du.view(-1, dim))
    return total_loss, total_n


@dataclass
class CbowBatch:
    """The centre words of one CBOW batch, sorted by their number of context words (most
    first) so that the ``j``-th context words of all rows are one contiguous run:
    ``centres`` ``(B,)``; ``counts`` ``(B,)`` context words each; ``contexts`` ``(M,)`` row by
    row from ``offsets`` ``(B,)`` (``embedding_bag``'s input); ``columns`` ``(M,)`` the same
    words column by column (the ``j``-th context words of rows ``0..widths[j]``, then the
    ``j+1``-th...); ``negatives`` ``(B / share, K)``: each run of ``share`` consecutive rows
    shares its ``K`` noise words."""

    centres: Tensor
    counts: Tensor
    contexts: Tensor
    offsets: Tensor
    columns: Tensor
    widths: list[int]
    negatives: Tensor

    def as_group(self) -> Group:
        """The same batch as one CBOW :class:`Group` for :func:`reference_step` (each row
        with its own copy of its run's noise words)."""
        share = len(self.centres) // len(self.negatives)
        owner = torch.repeat_interleave(torch.arange(len(self.centres)), self.counts)
        negatives = self.negatives.repeat_interleave(share, dim=0)
        return Group(self.centres, self.contexts, negatives, owner=owner)


def cbow_step(syn0: Tensor, syn1: Tensor, b: CbowBatch, alpha: float) -> tuple[float, int]:
    """Apply one batch of CBOW SGD updates in place; return (summed loss, predicted words).

    ``h`` (the mean of each row's context vectors) is one ``embedding_bag``; the centre
    word's score is a row-wise dot product; the ``share`` rows of a run score their shared
    noise words with one small matrix product, and the gradients of ``h`` and of the noise
    rows are two more; the updates are written with ``index_add_``, to the context words one
    column at a time (the rows sorted by width make every column a prefix of ``dh``)."""
    n, dim = len(b.centres), syn0.shape[1]
    runs, k = b.negatives.shape
    share = n // runs
    has = (b.counts > 0).to(syn0.dtype)  # a centre word with no context predicts nothing
    h = F.embedding_bag(b.contexts, syn0, b.offsets, mode="mean")  # (B, C)
    u = syn1.index_select(0, b.centres)  # (B, C)
    un = syn1.index_select(0, b.negatives.view(-1)).view(runs, k, dim)  # (runs, K, C)
    h3 = h.view(runs, share, dim)
    s_pos = torch.linalg.vecdot(h, u)  # (B,)
    s_neg = torch.bmm(h3, un.transpose(1, 2))  # (runs, share, K)
    keep = (b.negatives[:, None, :] != b.centres.view(runs, share, 1)).to(syn0.dtype)
    keep *= has.view(runs, share, 1)  # a noise word equal to the centre word is skipped
    loss = -float(F.logsigmoid(s_pos) @ has + (F.logsigmoid(-s_neg) * keep).sum())
    g_pos = torch.sigmoid(s_pos).neg_().add_(1.0).mul_(has).mul_(alpha)  # (B,)
    g_neg = torch.sigmoid(s_neg).mul_(keep).mul_(-alpha)  # (runs, share, K)
    dh = torch.bmm(g_neg, un).view(n, dim).addcmul_(u, g_pos[:, None])  # (B, C)
    syn1.index_add_(0, b.centres, torch.mul(h, g_pos[:, None], out=u))  # u is spent
    syn1.index_add_(0, b.negatives.view(-1), torch.bmm(g_neg.transpose(1, 2), h3).view(-1, dim))
    start = 0
    for width in b.widths:  # every context word gets dh, undivided (gensim's cbow_mean=1)
        syn0.index_add_(0, b.columns[start : start + width], dh[:width])
        start += width
    return loss, int(has.sum())


def reference_step(
    syn0: Tensor, syn1: Tensor, groups: Sequence[Group], alpha: float, sg: bool
) -> tuple[float, int]:
    """:func:`batched_step` written one centre word and one pair at a time (float64 sums),
    every gradient computed from the parameters as they were before the batch."""
    s0, s1 = syn0.clone(), syn1.clone()
    total_loss, total_n = 0.0, 0
    for g in groups:
        for b in range(len(g.centres)):
            w = int(g.centres[b])
            outs = [(w, 1.0)] + [(int(n), 0.0) for n in g.negatives[b] if int(n) != w]
            if sg:
                ctx = [int(c) for c, ok in zip(g.contexts[b], g.valid[b]) if ok]
            else:
                ctx = [int(c) for c, o in zip(g.contexts, g.owner) if int(o) == b]
            if sg:
                for c in ctx:
                    v = s0[c].double()
                    for o, label in outs:
                        dot = float(s1[o].double() @ v)
                        total_loss -= math.log(_sigmoid(dot if label else -dot))
                        step = (label - _sigmoid(dot)) * alpha
                        syn0[c] += (step * s1[o].double()).to(syn0.dtype)
                        syn1[o] += (step * v).to(syn1.dtype)
                    total_n += 1
            elif ctx:
                h = torch.stack([s0[c].double() for c in ctx]).mean(0)
                dh = torch.zeros_like(h)
                for o, label in outs:
                    dot = float(s1[o].double() @ h)
                    total_loss -= math.log(_sigmoid(dot if label else -dot))
                    step = (label - _sigmoid(dot)) * alpha
                    dh += step * s1[o].double()
                    syn1[o] += (step * h).to(syn1.dtype)
                for c in ctx:
                    syn0[c] += dh.to(syn0.dtype)
                total_n += 1
    return total_loss, total_n


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


# ---------------------------------------------------------------------------------------------
# windows and noise words


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


def _run_workers(work: Callable[[], None], workers: int) -> None:
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


def _prefetch(items: Iterator[Batch], depth: int = 4) -> Iterator[Batch]:
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


# ---------------------------------------------------------------------------------------------
# the loop


def train_word2vec(
    text_or_sentences: str | Sequence[Sequence[str]],
    config: Word2VecConfig | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> TrainResult:
    """Train word vectors on a text (split with :func:`split_sentences`) or on sentences
    (lists of words); ``progress`` is called after every batch. ``config.workers`` threads
    each take whole batches (one torch thread each), one more thread makes the batches:
    gensim's arrangement. With one worker the result depends only on the seed."""
    cfg = config or Word2VecConfig()
    sentences = (
        split_sentences(text_or_sentences)
        if isinstance(text_or_sentences, str)
        else text_or_sentences
    )
    vocab = Vocab.build(sentences, cfg.min_count)
    raw_words = sum(len(s) for s in sentences)
    ids_all, sent_all = vocab.encode(sentences)
    keep_p = vocab.keep_probabilities(cfg.sample)[ids_all]
    noise = NoiseSampler(vocab.noise())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # parallel over batches (worker threads), not inside each op
    try:
        gen = torch.Generator().manual_seed(cfg.seed)
        syn0 = (torch.rand(len(vocab), cfg.dim, generator=gen) - 0.5) / cfg.dim
        syn1 = torch.zeros(len(vocab), cfg.dim)
        sums = np.zeros((cfg.epochs, 2))  # per epoch: summed loss, predicted words
        lock = threading.Lock()
        items = _prefetch(batches(ids_all, sent_all, keep_p, raw_words, noise, cfg))
        t0, cpu0 = time.perf_counter(), time.process_time()

        def work() -> None:
            while True:
                with lock:
                    b = next(items, None)
                if b is None:
                    return
                if b.work is None:
                    loss, n = 0.0, 0
                elif isinstance(b.work, CbowBatch):
                    loss, n = cbow_step(syn0, syn1, b.work, b.alpha)
                else:
                    loss, n = batched_step(syn0, syn1, b.work, b.alpha)
                with lock:
                    sums[b.epoch] += (loss, n)
                    if progress is not None:
                        mean = sums[b.epoch, 0] / max(sums[b.epoch, 1], 1)
                        progress(Progress(round(b.words), raw_words * cfg.epochs, b.epoch + 1,
                                          b.alpha, time.perf_counter() - t0, mean))  # fmt: skip

        try:
            _run_workers(work, cfg.workers)
        finally:
            items.close()  # stops the batch maker
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - cpu0
    finally:
        torch.set_num_threads(threads)
    losses = [float(x / max(n, 1)) for x, n in sums]
    vectors = WordVectors(list(vocab.words), syn0.numpy())
    return TrainResult(vectors, vocab, losses, seconds, raw_words * cfg.epochs, cpu_seconds)
