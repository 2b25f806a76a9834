"""Modified Kneser-Ney from a corpus larger than memory, as KenLM's ``lmplz -S`` does it:
:mod:`attnlm.ngram.bounded_count` reads the corpus in chunks, counts each into a sorted shard
spilled to a temporary folder and merges the shards order by order (k-way);
:mod:`attnlm.ngram.bounded_kn` streams the modified Kneser-Ney estimate over the merged files
and writes the ARPA file from disk. The file is byte for byte the one
:func:`attnlm.ngram.train` + :func:`attnlm.ngram.write_arpa` write in memory (tested).

Temporary files go to ``.NAME.ngram-tmp`` beside the output file (or a fresh folder under
``tmp_dir``) and are removed at the end, also on error or interrupt; what a killed run left
beside the output is removed by the next run into it. The ARPA file is written atomically.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlm.base.errors import ConfigError
from attnlm.ngram.arpa_write import write_arpa
from attnlm.ngram.bounded_count import Budget, Counted, count_streamed, parse_memory, read_chunks
from attnlm.ngram.bounded_kn import estimate_and_write
from attnlm.ngram.counts import PADDINGS, NgramCounts, check_order
from attnlm.ngram.smoothing import modified_kneser_ney

__all__ = ["BoundedResult", "parse_memory", "train_arpa"]


@dataclass
class BoundedResult:
    """What :func:`train_arpa` built: n-grams per order, discounts (D1, D2, D3+ per order),
    sentences, vocabulary size and the number of shards the corpus was counted in."""

    sizes: list[int]
    discounts: list[tuple[float, float, float]]
    sentences: int
    vocab_size: int
    shards: int


def train_arpa(
    source: str | os.PathLike[str] | Iterable[str] | None,
    order: int,
    path: str | os.PathLike[str],
    memory: str | int = "2G",
    pad: str = "kenlm",
    tokenize: bool = False,
    progress: bool = False,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> BoundedResult:
    """Modified Kneser-Ney of ``order`` from ``source`` (a text file, a folder of ``.txt``
    files, None for the built-in corpus, or an iterable of text chunks that each end at a line
    end), written as an ARPA file at ``path`` (``.gz`` compresses), with the arrays held under
    about ``memory`` (bytes, or a size such as ``"2G"``). The file is byte for byte what
    ``write_arpa(train(split_sentences(text), order, pad=pad), path)`` writes."""
    check_order(order)
    if pad not in PADDINGS:
        raise ConfigError(f"padding must be one of {', '.join(PADDINGS)}, got {pad!r}")
    budget = Budget(parse_memory(memory))
    if source is None or isinstance(source, (str, os.PathLike)):
        chunks = read_chunks(source, budget.text_bytes)
    else:
        chunks = iter(source)
    with _work_dir(path, tmp_dir) as tmp:
        counted = count_streamed(chunks, order, pad, tokenize, Path(tmp), budget, progress)
        if order == 1:  # nothing but the vocabulary: the in-memory path
            return _unigram_model(counted, pad, path, progress)
        sizes, discounts = estimate_and_write(counted, order, path, Path(tmp), budget, progress)
    return BoundedResult(sizes, discounts, counted.sentences, len(counted.vocab), counted.shards)


@contextlib.contextmanager
def _work_dir(path, tmp_dir) -> Iterator[str]:
    """The shards' folder: ``.NAME.ngram-tmp`` beside the output (one per output file, so the
    next run into it removes what a killed run left), or a fresh one under ``tmp_dir``."""
    if tmp_dir is not None:
        with tempfile.TemporaryDirectory(prefix="attnlm-ngram-", dir=tmp_dir) as tmp:
            yield tmp
        return
    p = Path(path)
    work = p.with_name(f".{p.name}.ngram-tmp")
    shutil.rmtree(work, ignore_errors=True)  # left by a killed run
    work.mkdir(parents=True)
    try:
        yield str(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _unigram_model(counted: Counted, pad: str, path, progress: bool) -> BoundedResult:
    V = len(counted.vocab)
    ids = np.arange(V, dtype=np.int64)
    c = NgramCounts(counted.vocab, 1, pad, [ids], [counted.unigrams], [ids * 0 - 1], [ids], 0, 0)
    model, discounts = modified_kneser_ney(c)
    write_arpa(model, path, progress=progress)
    return BoundedResult(
        [V], [d.as_tuple() for d in discounts], counted.sentences, V, counted.shards
    )
