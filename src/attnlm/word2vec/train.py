"""Training word2vec: skip-gram and CBOW with negative sampling, batched in PyTorch on a CPU.

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

The steps and their hand-written gradients are in :mod:`attnlm.word2vec.steps`, the windows,
batches and noise words in :mod:`attnlm.word2vec.batches`; this module holds the settings,
the schedule and the worker threads (and re-exports the other two modules' names).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnlm.word2vec.batches import (
    Batch,
    NoiseSampler,
    batches,
    make_cbow_batch,
    make_groups,
    prefetch,
    run_workers,
    sentence_bounds,
)
from attnlm.word2vec.config import Word2VecConfig
from attnlm.word2vec.steps import CbowBatch, Group, batched_step, cbow_step, reference_step
from attnlm.word2vec.vectors import WordVectors
from attnlm.word2vec.vocab import Vocab, split_sentences

__all__ = [
    "Batch",
    "CbowBatch",
    "Group",
    "NoiseSampler",
    "Progress",
    "TrainResult",
    "Word2VecConfig",
    "batched_step",
    "batches",
    "cbow_step",
    "make_cbow_batch",
    "make_groups",
    "reference_step",
    "sentence_bounds",
    "train_word2vec",
]


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
# the loop


def _worker(
    items: Iterator[Batch],
    lock: threading.Lock,
    syn0: torch.Tensor,
    syn1: torch.Tensor,
    sums: np.ndarray,
    progress: Callable[[Progress], None] | None,
    total_words: int,
    t0: float,
) -> Callable[[], None]:
    """The loop of one worker thread: take the next batch (under ``lock``) until there is none,
    step on it, add its loss and predicted words to its epoch's row of ``sums`` (epochs, 2) and
    report the progress (``total_words``: over all epochs; ``t0``: the start time)."""

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
                    progress(Progress(round(b.words), total_words, b.epoch + 1,
                                      b.alpha, time.perf_counter() - t0, mean))  # fmt: skip

    return work


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
        items = prefetch(batches(ids_all, sent_all, keep_p, raw_words, noise, cfg))
        t0, cpu0 = time.perf_counter(), time.process_time()
        work = _worker(items, lock, syn0, syn1, sums, progress, raw_words * cfg.epochs, t0)
        try:
            run_workers(work, cfg.workers)
        finally:
            items.close()  # stops the batch maker
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - cpu0
    finally:
        torch.set_num_threads(threads)
    losses = [float(x / max(n, 1)) for x, n in sums]
    vectors = WordVectors(list(vocab.words), syn0.numpy())
    return TrainResult(vectors, vocab, losses, seconds, raw_words * cfg.epochs, cpu_seconds)
