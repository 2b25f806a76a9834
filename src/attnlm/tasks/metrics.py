"""Per-example scores and their aggregates, under lm-evaluation-harness's names and rules.

* multiple choice: ``acc`` (the choice of highest log-likelihood is the gold one; the first of
  equal ones wins, as ``numpy.argmax``) and ``acc_norm`` (the same with each log-likelihood
  divided by its choice's length in characters, the delimiter not counted);
* cloze: ``perplexity`` (``exp`` of minus the mean log-likelihood of the targets) and ``acc``
  (greedy decoding reproduces the target: every target token is the argmax after what precedes
  it);
* generation: ``exact_match`` after normalisation: surrounding whitespace is stripped from the
  generated text and the answer, then, when the task says so, case (``ignore_case``) and
  punctuation (``ignore_punctuation``) are ignored. (lm-evaluation-harness compares without
  stripping unless a task's filter strips; a prompt ending in the target delimiter makes the
  answer start with a space, which stripping forgives.)

Standard errors as lm-evaluation-harness reports them: for a mean, the sample standard deviation
(n - 1) over the square root of n (``acc_stderr``, ``acc_norm_stderr``, ``exact_match_stderr``);
for perplexity, a bootstrap estimate (the standard deviation of the statistic over resamples of
the examples; lm-evaluation-harness bootstraps too, with its own draws, so the digits differ
within the estimate's noise).
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 1234


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value, the first of equal ones (as ``numpy.argmax``)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def choice_scores(lls: Sequence[float], choices: Sequence[str], gold: int) -> dict[str, Any]:
    """A multiple-choice example's ``acc`` and ``acc_norm`` (1.0 or 0.0) and the predictions."""
    pred = argmax(lls)
    pred_norm = argmax([ll / float(len(c)) for ll, c in zip(lls, choices, strict=True)])
    return {"acc": float(pred == gold), "acc_norm": float(pred_norm == gold),
            "pred": pred, "pred_norm": pred_norm}  # fmt: skip


def normalise(text: str, ignore_case: bool = False, ignore_punctuation: bool = False) -> str:
    """Generation's normalisation (see the module docstring)."""
    text = text.strip()
    if ignore_case:
        text = text.lower()
    if ignore_punctuation:
        text = text.translate(str.maketrans("", "", string.punctuation))
    return text


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def mean_stderr(xs: Sequence[float]) -> float | None:
    """Sample standard deviation over the square root of n (None for fewer than two)."""
    n = len(xs)
    if n < 2:
        return None
    mu = mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


def perplexity(lls: Sequence[float]) -> float:
    """``exp(-mean(ll))`` (lm-evaluation-harness's ``perplexity`` aggregate)."""
    return math.exp(-mean(lls))


def perplexity_stderr(lls: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES) -> float | None:
    """Bootstrap standard error of :func:`perplexity` (seeded, so runs repeat)."""
    import numpy as np

    if len(lls) < 2:
        return None
    values = np.asarray(lls, dtype=np.float64)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    stats = []
    chunk = max(1, 2_000_000 // len(values))  # bounded memory: resamples in chunks
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        idx = rng.integers(0, len(values), size=(rows, len(values)))
        stats.append(np.exp(-values[idx].mean(axis=1)))
    return float(np.concatenate(stats).std(ddof=1))


def aggregate(kind: str, rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The task's metrics and their standard errors from its per-example ``rows``."""
    if kind == "multiple_choice":
        names = ("acc", "acc_norm")
    elif kind == "cloze":
        names = ("acc",)
    else:
        names = ("exact_match",)
    out: dict[str, float | None] = {}
    for name in names:
        values = [float(r[name]) for r in rows]
        out[name], out[f"{name}_stderr"] = mean(values), mean_stderr(values)
    if kind == "cloze":
        lls = [r["loglikelihood"] for r in rows]
        out["perplexity"], out["perplexity_stderr"] = perplexity(lls), perplexity_stderr(lls)
    return out
