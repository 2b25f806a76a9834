"""Count-based n-gram language models that match KenLM (see docs/ngram.md).

Typical use::

    from attnlm.ngram import train, read_arpa, split_sentences
    model = train(split_sentences(text), order=3)            # modified Kneser-Ney
    model.score_text(test_text).ppl                          # KenLM `query` perplexity
    write_arpa(model, "lm.arpa"); model.save("lm.npz")
"""

from __future__ import annotations

from collections.abc import Sequence

from attnlm.base.errors import ConfigError
from attnlm.ngram.arpa import read_arpa, write_arpa
from attnlm.ngram.counts import NgramCounts, Vocabulary, count_ngrams, split_sentences
from attnlm.ngram.files import load_model
from attnlm.ngram.model import AddKModel, BackoffModel, NgramModel, ScoreResult
from attnlm.ngram.progress import progress_bar
from attnlm.ngram.smoothing import (
    SMOOTHINGS,
    Discount,
    DiscountWarning,
    add_k,
    maximum_likelihood,
    modified_kneser_ney,
    stupid_backoff,
)

__all__ = [
    "SMOOTHINGS",
    "AddKModel",
    "BackoffModel",
    "Discount",
    "DiscountWarning",
    "NgramCounts",
    "NgramModel",
    "ScoreResult",
    "Vocabulary",
    "add_k",
    "count_ngrams",
    "load_model",
    "maximum_likelihood",
    "parse_memory",
    "modified_kneser_ney",
    "read_arpa",
    "split_sentences",
    "stupid_backoff",
    "train",
    "train_arpa",
    "write_arpa",
]


def __getattr__(name: str):
    """``parse_memory`` and ``train_arpa`` (the bounded-memory trainer: shards, temporary
    files) load on first use, so that ``attnlm ngram train`` without ``--memory`` and
    ``import attnlm.ngram`` do not pay for them at start-up."""
    if name in ("parse_memory", "train_arpa"):
        from attnlm.ngram import bounded

        return getattr(bounded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(
    sentences: Sequence[Sequence[str]],
    order: int,
    smoothing: str = "mkn",
    k: float = 1.0,
    alpha: float = 0.4,
    pad: str = "kenlm",
    progress: bool = False,
) -> NgramModel:
    """Count ``sentences`` (token lists) and estimate a model of the given order.

    ``smoothing``: ``mkn`` (interpolated modified Kneser-Ney as KenLM ``lmplz``), ``mle``,
    ``addk`` (with ``k``; Laplace when k = 1) or ``stupid`` (stupid backoff with ``alpha``,
    unnormalised). ``pad``: ``kenlm`` (one ``<s>``/``</s>``) or ``nltk`` (n-1 of each).
    ``progress``: bars with n-grams/s on stderr for counting and estimating. For a corpus
    larger than memory, :func:`attnlm.ngram.bounded.train_arpa` (``--memory``).
    """
    if smoothing not in SMOOTHINGS:
        raise ConfigError(f"smoothing must be one of {', '.join(SMOOTHINGS)}, got {smoothing!r}")
    with progress_bar(None, "count", progress) as bar:
        counts = count_ngrams(sentences, order, pad=pad)
        total = sum(len(keys) for keys in counts.keys)
        bar.update(total)
    with progress_bar(total, "estimate", progress) as bar:
        if smoothing == "mkn":
            model = modified_kneser_ney(counts)[0]
        elif smoothing == "mle":
            model = maximum_likelihood(counts)
        elif smoothing == "addk":
            model = add_k(counts, k)
        else:
            model = stupid_backoff(counts, alpha)
        bar.update(total)
    return model
