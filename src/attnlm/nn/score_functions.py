"""Attention score functions: one signature, ``(q, k) -> scores``.

* :class:`DotScore` and :class:`BilinearScore`: Luong, Pham & Manning (2015), "dot" and
  "general";
* :class:`AdditiveScore`: Bahdanau, Cho & Bengio (2015), the one-hidden-layer MLP ("concat");
* :class:`ScaledDotScore`: Vaswani et al. (2017), ``qᵀ k / sqrt(d_k)``.

:func:`make_score` builds one by name (:data:`SCORES`, or an alias in :data:`SCORE_ALIASES`).
Each score also splits into a key-only part (``prepare_keys``) and the rest (``prepared``), so
a recurrent decoder attending over fixed encoder states prepares the keys once per source.
``supports_sdpa`` / ``sdpa_scale`` tell :class:`attnlm.nn.attention.MultiHeadAttention` whether
``torch.nn.functional.scaled_dot_product_attention`` computes the same scores.

Shape legend
    T   query length
    S   key length
    Dq  query width, Dk key width (equal for the dot scores)
    ... any leading dimensions (batch, heads)

``q`` ``(..., T, Dq)``, ``k`` ``(..., S, Dk)`` -> scores ``(..., T, S)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlm.base.errors import ConfigError


class DotScore(nn.Module):
    """``score(q, k) = qᵀ k`` (Luong et al., 2015, "dot")."""

    supports_sdpa = True
    sdpa_scale: float | None = 1.0

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return q @ k.transpose(-2, -1)  # (..., T, S)

    def prepare_keys(self, k: Tensor) -> Tensor:
        """The part of the score that depends on the keys only (see :func:`make_score`)."""
        return k

    def prepared(self, q: Tensor, pk: Tensor) -> Tensor:
        """``forward(q, k)`` from ``pk = prepare_keys(k)``."""
        return q @ pk.transpose(-2, -1)


class ScaledDotScore(nn.Module):
    """``score(q, k) = qᵀ k / sqrt(d_k)`` (Vaswani et al., 2017, "Attention Is All You Need").

    For q, k with independent unit-variance entries, ``qᵀ k`` has variance ``d_k``; dividing
    by ``sqrt(d_k)`` brings it back to 1 so the softmax does not saturate at large ``d_k``.
    """

    supports_sdpa = True
    sdpa_scale: float | None = None  # SDPA's default scale is 1 / sqrt(D)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)  # (..., T, S)

    def prepare_keys(self, k: Tensor) -> Tensor:
        return k * (k.shape[-1] ** -0.5)

    def prepared(self, q: Tensor, pk: Tensor) -> Tensor:
        return q @ pk.transpose(-2, -1)


class BilinearScore(nn.Module):
    """``score(q, k) = qᵀ W k`` (Luong et al., 2015, "general"); ``W`` is ``(d_q, d_k)``."""

    supports_sdpa = False

    def __init__(self, d_q: int, d_k: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_q, d_k or d_q))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return (q @ self.weight) @ k.transpose(-2, -1)  # (..., T, Dk) @ (..., Dk, S)

    def prepare_keys(self, k: Tensor) -> Tensor:
        return k @ self.weight.T  # (..., S, Dq): W k for every key

    def prepared(self, q: Tensor, pk: Tensor) -> Tensor:
        return q @ pk.transpose(-2, -1)


class AdditiveScore(nn.Module):
    """``score(q, k) = w₂ᵀ tanh(W₁ [q; k])`` (Bahdanau, Cho & Bengio, 2015, "additive"/MLP).

    ``W₁ [q; k]`` is computed as ``W₁_q q + W₁_k k`` (the two column blocks of ``W₁``) so the
    concatenation is never built for all ``T x S`` pairs; only the hidden activations are.
    """

    supports_sdpa = False

    def __init__(self, d_q: int, d_k: int | None = None, d_hidden: int | None = None) -> None:
        super().__init__()
        self.d_q, d_k = d_q, d_k or d_q
        self.w1 = nn.Linear(d_q + d_k, d_hidden or d_q, bias=False)  # W₁ acting on [q; k]
        self.w2 = nn.Linear(d_hidden or d_q, 1, bias=False)  # w₂

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.prepared(q, self.prepare_keys(k))

    def prepare_keys(self, k: Tensor) -> Tensor:
        return k @ self.w1.weight[:, self.d_q :].T  # (..., S, h): W₁_k k for every key

    def prepared(self, q: Tensor, pk: Tensor) -> Tensor:
        w_q = self.w1.weight[:, : self.d_q]
        hidden = torch.tanh((q @ w_q.T).unsqueeze(-2) + pk.unsqueeze(-3))  # (..., T, S, h)
        return self.w2(hidden).squeeze(-1)  # (..., T, S)


SCORES = ("dot", "scaled_dot", "bilinear", "additive")
# Luong et al. (2015) names for the same functions: "general" is bilinear, "concat" is additive.
SCORE_ALIASES = {"general": "bilinear", "concat": "additive", "bahdanau": "additive"}


def make_score(
    name: str, d_q: int, d_k: int | None = None, d_hidden: int | None = None
) -> nn.Module:
    """Build a score module by name (one of :data:`SCORES` or a Luong/Bahdanau alias in
    :data:`SCORE_ALIASES`) for queries of width ``d_q`` and keys of width ``d_k`` (default
    ``d_q``). Dot products need equal widths; bilinear and additive scores bridge different
    ones (a recurrent decoder state attending over bidirectional encoder states)."""
    name = SCORE_ALIASES.get(name, name)
    d_k = d_k or d_q
    if name in ("dot", "scaled_dot") and d_k != d_q:
        raise ConfigError(
            f"the {name} score needs queries and keys of one width, got {d_q} and {d_k} "
            "(use bilinear or additive)"
        )
    if name == "dot":
        return DotScore()
    if name == "scaled_dot":
        return ScaledDotScore()
    if name == "bilinear":
        return BilinearScore(d_q, d_k)
    if name == "additive":
        return AdditiveScore(d_q, d_k, d_hidden)
    known = ", ".join(SCORES + tuple(SCORE_ALIASES))
    raise ConfigError(f"unknown attention score {name!r} (known: {known})")
