"""Estimators: maximum likelihood, add-k, stupid backoff and interpolated modified Kneser-Ney
exactly as KenLM ``lmplz`` estimates it.

Modified Kneser-Ney (Chen & Goodman 1998, "An empirical study of smoothing techniques for
language modeling", section 3; Heafield et al. 2013, "Scalable modified Kneser-Ney language
model estimation", the ``lmplz`` algorithm):

* adjusted counts a(.): the highest order uses raw counts; a lower-order n-gram uses its
  continuation count N1+(. w1..wk), the number of distinct words seen before it, except
  n-grams that start with ``<s>`` (nothing can precede them), which keep their raw counts.
  ``<unk>`` has count 0.
* three discounts per order from the counts-of-counts t1..t4 of the adjusted counts:
  Y = t1 / (t1 + 2 t2), D_j = j - (j + 1) Y t_(j+1) / t_j for j = 1, 2, 3 (D3 is D3+).
* u(w | h) = (a(h w) - D(a(h w))) / sum_x a(h x);
  gamma(h) = (D1 N1(h .) + D2 N2(h .) + D3 N3+(h .)) / sum_x a(h x);
  p(w | h) = u(w | h) + gamma(h) p(w | h without its first word);
  the unigram level interpolates with the uniform distribution over the vocabulary that
  counts ``<unk>`` but not ``<s>``: p(w) = u(w) + gamma() / (|V| - 1).
* the ARPA entry of h w holds log10 p(w | h); its back-off weight is log10 gamma(h w) (0 when
  h w is never a context); ``<s>`` is written with log10 p = 0 as KenLM writes it.

When a discount falls outside (0, j] (tiny corpora: KenLM's ``BadDiscountException``) we warn
and use the fixed discounts 0.5 / 1.0 / 1.5 (what ``lmplz --discount_fallback`` uses).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from attnlm.base.errors import ConfigError
from attnlm.ngram.counts import NgramCounts
from attnlm.ngram.model import AddKModel, BackoffModel

SMOOTHINGS = ("mkn", "mle", "addk", "stupid")
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)
STUPID_ALPHA = 0.4


class DiscountWarning(UserWarning):
    """Counts-of-counts gave an invalid Kneser-Ney discount; fixed discounts were used."""


@dataclass(frozen=True)
class Discount:
    """The three modified Kneser-Ney discounts of one order: D1, D2, D3+."""

    d1: float
    d2: float
    d3: float

    def of(self, counts: np.ndarray) -> np.ndarray:
        """Discount for each adjusted count (0 for count 0)."""
        return np.select([counts == 0, counts == 1, counts == 2], [0.0, self.d1, self.d2], self.d3)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.d1, self.d2, self.d3)


def counts_of_counts(adjusted: np.ndarray) -> list[int]:
    """t1..t4: how many n-grams have adjusted count 1, 2, 3, 4."""
    return [int(np.count_nonzero(adjusted == j)) for j in range(1, 5)]


def estimate_discount(adjusted: np.ndarray, order: int) -> Discount:
    """Discounts from the counts-of-counts of ``adjusted`` (see :func:`discount_from`)."""
    return discount_from(counts_of_counts(adjusted), order)


def discount_from(t: list[int], order: int) -> Discount:
    """Discounts from counts-of-counts t1..t4 (Chen & Goodman eq. 26), falling back to fixed
    ones with a :class:`DiscountWarning` when any is invalid (outside (0, j]) or undefined."""
    try:
        y = t[0] / (t[0] + 2 * t[1])
        d = [j - (j + 1) * y * t[j] / t[j - 1] for j in (1, 2, 3)]
        bad = [j for j, dj in zip((1, 2, 3), d) if not (0.0 < dj <= j) or math.isnan(dj)]
    except ZeroDivisionError:
        d, bad = [], [0]
    if bad:
        warnings.warn(
            f"order {order}: counts-of-counts {t} give no valid Kneser-Ney discounts "
            f"(too little data); using fixed discounts {FALLBACK_DISCOUNTS}",
            DiscountWarning,
            stacklevel=4,
        )
        return Discount(*FALLBACK_DISCOUNTS)
    return Discount(*d)


def adjusted_counts(c: NgramCounts) -> list[np.ndarray]:
    """KenLM's adjusted counts per order (see the module docstring)."""
    N, bos = c.order, c.vocab.bos
    out: list[np.ndarray] = [np.empty(0)] * N
    out[N - 1] = c.counts[N - 1].copy()
    for k in range(N - 1, 0, -1):
        cont = np.bincount(c.suffix[k], minlength=len(c.keys[k - 1])).astype(np.int64)
        out[k - 1] = np.where(c.first[k - 1] == bos, c.counts[k - 1], cont)
    if N == 1:
        out[0] = c.counts[0].copy()
    # <s> is never predicted: it takes no mass at the unigram level
    out[0][bos] = 0
    return out


def _log10(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log10(x)


def interpolation_terms(
    adjusted: np.ndarray, d: Discount, ctx: np.ndarray, n_ctx: int
) -> tuple[np.ndarray, np.ndarray]:
    """One order's u(w | h) (n,) and gamma(h) (n_ctx,) from its adjusted counts (n,) and the
    context id of each n-gram (``ctx`` (n,) in 0..n_ctx-1, non-decreasing). Sums run in table
    order, so a block holding whole contexts gives the same bits as the full table."""
    a = adjusted.astype(np.float64)
    disc = d.of(adjusted)
    denom = np.bincount(ctx, weights=a, minlength=n_ctx)
    mass = np.bincount(ctx, weights=disc, minlength=n_ctx)
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(denom > 0, mass / denom, 0.0)
        u = np.where(denom[ctx] > 0, (a - disc) / denom[ctx], 0.0)
    return u, gamma


def backoff_log10(gamma: np.ndarray) -> np.ndarray:
    """ARPA back-off weights log10 gamma, 0 where gamma is 0 (never a context)."""
    return np.where(gamma > 0, _log10(np.where(gamma > 0, gamma, 1.0)), 0.0)


def modified_kneser_ney(
    c: NgramCounts, discounts: list[Discount] | None = None
) -> tuple[BackoffModel, list[Discount]]:
    """Interpolated modified Kneser-Ney in ARPA form, as ``lmplz`` estimates it."""
    N, V = c.order, c.V
    adj = adjusted_counts(c)
    if discounts is None:
        # counts-of-counts of the adjusted counts, n-grams starting with <s> included
        discounts = [estimate_discount(adj[k - 1], k) for k in range(1, N + 1)]
    probs: list[np.ndarray] = []
    gammas: list[np.ndarray] = []
    for k in range(1, N + 1):
        if k == 1:
            ctx = np.zeros(len(adj[0]), dtype=np.int64)
            n_ctx = 1
        else:
            ctx = c.keys[k - 1] // V
            n_ctx = len(c.keys[k - 2])
        u, gamma = interpolation_terms(adj[k - 1], discounts[k - 1], ctx, n_ctx)
        if k == 1:
            p = u + gamma[0] / (V - 1)
        else:
            p = u + gamma[ctx] * probs[k - 2][c.suffix[k - 1]]
        probs.append(p)
        gammas.append(gamma)
    logp = [_log10(p) for p in probs]
    logp[0][c.vocab.bos] = 0.0  # as KenLM writes it
    bo = []
    for k in range(1, N + 1):
        if k < N:
            bo.append(backoff_log10(gammas[k]))  # gamma of order-k n-grams as contexts
        else:
            bo.append(np.zeros(len(c.keys[k - 1])))
    meta = {"discounts": [d.as_tuple() for d in discounts]}
    model = BackoffModel(c.vocab, list(c.keys), logp, bo, "mkn", c.pad, True, meta)
    return model, discounts


def maximum_likelihood(c: NgramCounts) -> BackoffModel:
    """Maximum likelihood p(w | h) = C(h w) / C(h .) in back-off form: the longest context
    seen in training is used; a word never seen after it gets probability 0 (back-off weight
    log10 0 = -inf, written -99 in ARPA), so the perplexity of unseen events is infinite."""
    return _relative_freq(c, alpha=0.0, smoothing="mle")


def stupid_backoff(c: NgramCounts, alpha: float = STUPID_ALPHA) -> BackoffModel:
    """Stupid backoff (Brants et al. 2007, "Large language models in machine translation"):
    S(w | h) = C(h w) / C(h .) if C(h w) > 0 else alpha * S(w | h minus its first word),
    S(w) = C(w) / N. Scores, not probabilities: they do not sum to 1 (unnormalised), and an
    unknown word scores 0."""
    if not 0 < alpha <= 1:
        raise ConfigError(f"stupid backoff alpha must be in (0, 1], got {alpha}")
    return _relative_freq(c, alpha=alpha, smoothing="stupid")


def _relative_freq(c: NgramCounts, alpha: float, smoothing: str) -> BackoffModel:
    N, V = c.order, c.V
    logp, bo = [], []
    for k in range(1, N + 1):
        cnt = c.counts[k - 1].astype(np.float64)
        if k == 1:
            cnt = cnt.copy()
            cnt[c.vocab.bos] = 0.0
            p = cnt / cnt.sum()
        else:
            ctx = c.keys[k - 1] // V
            denom = np.bincount(ctx, weights=cnt, minlength=len(c.keys[k - 2]))
            p = cnt / denom[ctx]
        lp = _log10(p)
        if k == 1:
            lp[c.vocab.bos] = 0.0
        logp.append(lp)
    for k in range(1, N + 1):
        b = np.zeros(len(c.keys[k - 1]))
        if k < N:
            is_ctx = np.bincount(c.keys[k] // V, minlength=len(c.keys[k - 1])) > 0
            b[is_ctx] = -math.inf if alpha == 0 else math.log10(alpha)
        bo.append(b)
    meta = {"alpha": alpha} if smoothing == "stupid" else {}
    return BackoffModel(
        c.vocab, list(c.keys), logp, bo, smoothing, c.pad, smoothing != "stupid", meta
    )


def add_k(c: NgramCounts, k: float = 1.0) -> AddKModel:
    """Add-k smoothing (Laplace when k = 1); see :class:`AddKModel`."""
    return AddKModel(c.vocab, list(c.keys), list(c.counts), k, c.pad)
