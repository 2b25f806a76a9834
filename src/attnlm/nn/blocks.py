"""Transformer building blocks: the position-wise feed-forward network (plain or gated,
SwiGLU), RMSNorm, and the transformer block that a family file composes from its parts
(attention, feed-forward, two norms), with the norm before (pre-norm) or after (post-norm)
each sublayer.

* post-norm, ``x = LN(x + f(x))`` (:class:`PostNormBlock`): the original Transformer
  (Vaswani et al., 2017), BERT;
* pre-norm, ``x = x + f(LN(x))`` (:class:`TransformerBlock`): GPT-2 (Radford et al., 2019) and
  most later models; it keeps an identity path from input to output and trains without
  warm-up tricks (Xiong et al., 2020, "On Layer Normalization in the Transformer
  Architecture").

Shape legend
    B  batch size
    T  sequence length (queries)
    S  key length (context length for cross-attention)
    C  model width
    F  feed-forward width (4C by default)
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.base.errors import ConfigError

# RMSNorm (Zhang & Sennrich, 2019), ``x / sqrt(mean(x²) + eps) · γ``: no centring, no bias,
# one reduction fewer than LayerNorm (Llama); ``nn.RMSNorm`` on the fused CPU kernel
from attnlm.nn.fused import RMSNorm, swiglu
from attnlm.nn.packing import Packing

__all__ = [
    "ACTIVATIONS",
    "NORMS",
    "FeedForward",
    "GeGLU",
    "PostNormBlock",
    "RMSNorm",
    "SandwichBlock",
    "SwiGLU",
    "TransformerBlock",
    "block_class",
    "dropout_layer",
]

ACTIVATIONS = {
    "gelu": F.gelu,  # exact: x Φ(x) (Hendrycks & Gimpel, 2016)
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "relu": F.relu,  # the original Transformer
    "silu": F.silu,  # x sigmoid(x), "swish" (Ramachandran et al., 2017; Marian's default)
}
NORMS = ("pre", "post")  # where a block puts its norms (TransformerBlock, PostNormBlock)


def dropout_layer(p: float) -> nn.Module:
    """``nn.Dropout(p)``, or an identity when ``p == 0`` (no kernel call at all)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``FFN(x) = act(x W₁ + b₁) W₂ + b₂``
    (Vaswani et al., 2017, section 3.3), applied to each position alone: ``(B, T, C) ->
    (B, T, C)`` through a hidden width ``F``."""

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        *,
        activation: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            known = ", ".join(ACTIVATIONS)
            raise ConfigError(f"unknown activation {activation!r} (known: {known})")
        d_ff = d_ff or 4 * d_model
        self.fc = nn.Linear(d_model, d_ff, bias=bias)  # W₁: (B, T, C) -> (B, T, F)
        self.act = ACTIVATIONS[activation]
        self.proj = nn.Linear(d_ff, d_model, bias=bias)  # W₂: (B, T, F) -> (B, T, C)
        self.drop = dropout_layer(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class SwiGLU(nn.Module):
    """Gated feed-forward network ``FFN(x) = (SiLU(x W_gate) ⊙ x W_up) W_down`` (Shazeer,
    2020, "GLU Variants Improve Transformer"; Llama, PaLM): one branch gates the other
    elementwise. Three matrices instead of two, so a width ``F ≈ 8C/3`` keeps the ``8C²``
    weights of a ``4C`` plain network. ``W_gate`` and ``W_up`` are fused into ``fc``
    ``(2F, C)`` (gate rows first); ``proj`` is ``W_down``. ``(B, T, C) -> (B, T, C)``."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(d_model, 2 * d_ff, bias=bias)  # [W_gate; W_up]: (B, T, C) -> 2F
        self.proj = nn.Linear(d_ff, d_model, bias=bias)  # W_down: (B, T, F) -> (B, T, C)
        self.drop = dropout_layer(dropout)

    gated_act = "silu"  # the gate's activation (ACTIVATIONS)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(self.gate(self.fc(x))))

    def gate(self, gu: Tensor) -> Tensor:
        """``act(gate) ⊙ up`` of the fused ``(..., 2F)`` projection -> ``(..., F)``. SiLU here:
        :func:`~attnlm.nn.fused.swiglu` keeps only the projection for the backward (the plain
        ops keep SiLU(gate) as well)."""
        return swiglu(gu)


class GeGLU(SwiGLU):
    """The GELU-gated feed-forward ``(GELU_tanh(x W_gate) ⊙ x W_up) W_down`` (Shazeer, 2020;
    Gemma): :class:`SwiGLU`'s parts and names with the tanh approximation of GELU on the
    gate."""

    gated_act = "gelu_tanh"

    def gate(self, gu: Tensor) -> Tensor:
        g, u = gu.chunk(2, dim=-1)  # (..., F) each
        return ACTIVATIONS[self.gated_act](g) * u


class ClampedSwiGLU(SwiGLU):
    """gpt-oss's clamped SwiGLU (its experts): the gate capped above and the up branch within
    ``[-limit, limit]`` (``limit`` 7), then ``g σ(α g) ⊙ (u + 1)`` with ``α`` 1.702 (SiLU's
    sharper cousin: ``x σ(1.702 x)`` is the sigmoid approximation of GELU). :class:`SwiGLU`'s
    parts and names."""

    gated_act = "swiglu_oai"
    alpha, limit = 1.702, 7.0

    def gate(self, gu: Tensor) -> Tensor:
        g, u = gu.chunk(2, dim=-1)  # (..., F) each
        g = g.clamp(max=self.limit)
        return g * torch.sigmoid(g * self.alpha) * (u.clamp(-self.limit, self.limit) + 1)


class TransformerBlock(nn.Module):
    """A pre-norm transformer block built from its parts (GPT-2, Llama): ``x = x + attn(LN₁(x))``
    then ``x = x + mlp(LN₂(x))``; a decoder of an encoder-decoder also has a cross-attention
    sublayer ``x = x + cross_attn(LN_cross(x), context)`` between the two.

    The family file chooses the parts: ``attn`` (a self-attention
    :class:`~attnlm.nn.attention.MultiHeadAttention`), ``mlp`` (:class:`FeedForward`,
    :class:`SwiGLU`), the norms ``sa_norm`` / ``mlp_norm`` (``nn.LayerNorm``, :class:`RMSNorm`),
    and for a decoder ``cross_attn`` with ``cross_norm``. ``dropout`` is the residual dropout
    on the attention outputs (the feed-forward applies its own). Module names (the checkpoint
    keys): ``ln_1``, ``attn``, ``ln_cross``, ``cross_attn``, ``ln_2``, ``mlp``.

    ``forward(x (B, T, C), **attend) -> (x (B, T, C), self-attention weights (B, H, T, S) or
    None, cross-attention weights (B, H, T, S_ctx) or None)``; ``attend`` (``mask``,
    ``is_causal``, ``rotary``, ``cache``, ``layer``, ``need_weights``, ``packing``) goes to
    self-attention as it is.

    ``residual_scale`` (an attribute; None by default): each sublayer's output is multiplied
    by it before it is added to the residual stream (Granite's ``residual_multiplier``).
    """

    residual_scale: float | None = None

    def scaled(self, h: Tensor) -> Tensor:
        """A sublayer's output as it is added to the residual stream (``residual_scale``)."""
        return h if self.residual_scale is None else h * self.residual_scale

    def __init__(
        self,
        attn: nn.Module,
        mlp: nn.Module,
        *,
        sa_norm: nn.Module,
        mlp_norm: nn.Module,
        cross_attn: nn.Module | None = None,
        cross_norm: nn.Module | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if (cross_attn is None) != (cross_norm is None):
            raise ConfigError("a cross-attention sublayer needs both cross_attn and cross_norm")
        self.ln_1, self.attn = sa_norm, attn
        self.ln_cross, self.cross_attn = cross_norm, cross_attn
        self.ln_2, self.mlp = mlp_norm, mlp
        self.drop = dropout_layer(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        context_packing: Packing | None = None,
        **attend,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h, weights = self.attn(self.ln_1(x), **attend)
        x = x + self.scaled(self.drop(h))
        cross = None
        if self.cross_attn is not None:
            h, cross = self._cross(self.ln_cross(x), context, context_mask, context_packing, attend)
            x = x + self.drop(h)
        x = x + self.scaled(self.mlp(self.ln_2(x)))
        return x, weights, cross

    def _cross(
        self,
        x: Tensor,
        context: Tensor | None,
        context_mask: Tensor | None,
        context_packing: Packing | None,
        attend: dict,
    ) -> tuple[Tensor, Tensor | None]:
        """Cross-attention from ``x`` to ``context`` ``(B, S_ctx, C)``: the cache (which keeps
        its keys/values after the first call), layer, weights and packing of self-attention."""
        shared = ("cache", "layer", "need_weights", "packing")
        return self.cross_attn(
            x,
            context,
            mask=context_mask,
            context_packing=context_packing,
            **{k: v for k, v in attend.items() if k in shared},
        )


class PostNormBlock(TransformerBlock):
    """The post-norm arrangement of the same parts (the original Transformer, BERT, Marian):
    ``x = LN₁(x + attn(x))`` then ``x = LN₂(x + mlp(x))``; the norm follows each residual
    add, so every block output is normalised and no final norm is needed."""

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        context_packing: Packing | None = None,
        **attend,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h, weights = self.attn(x, **attend)
        x = self.ln_1(x + self.drop(h))
        cross = None
        if self.cross_attn is not None:
            h, cross = self._cross(x, context, context_mask, context_packing, attend)
            x = self.ln_cross(x + self.drop(h))
        x = self.ln_2(x + self.mlp(x))
        return x, weights, cross


class SandwichBlock(TransformerBlock):
    """A pre-norm block whose sublayer outputs are normalised again before the residual adds
    (Gemma 2 and 3): ``x = x + LN_post_attn(attn(LN₁(x)))`` then ``x = x +
    LN_post_mlp(mlp(LN₂(x)))``. Module names: :class:`TransformerBlock`'s and
    ``ln_post_attn``, ``ln_post_mlp``. No cross-attention."""

    def __init__(
        self,
        attn: nn.Module,
        mlp: nn.Module,
        *,
        sa_norm: nn.Module,
        mlp_norm: nn.Module,
        post_attn_norm: nn.Module,
        post_mlp_norm: nn.Module,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(attn, mlp, sa_norm=sa_norm, mlp_norm=mlp_norm, dropout=dropout)
        self.ln_post_attn, self.ln_post_mlp = post_attn_norm, post_mlp_norm

    def forward(self, x: Tensor, **attend) -> tuple[Tensor, Tensor | None, None]:
        h, weights = self.attn(self.ln_1(x), **attend)
        x = x + self.scaled(self.drop(self.ln_post_attn(h)))
        x = x + self.scaled(self.ln_post_mlp(self.mlp(self.ln_2(x))))
        return x, weights, None


def block_class(norm: str) -> type[TransformerBlock]:
    """The block of a norm placement: ``"pre"`` :class:`TransformerBlock`, ``"post"``
    :class:`PostNormBlock` (for configs that offer both)."""
    if norm not in NORMS:
        raise ConfigError(f"unknown norm placement {norm!r} (known: {', '.join(NORMS)})")
    return TransformerBlock if norm == "pre" else PostNormBlock
