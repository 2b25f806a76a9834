"""Transformer building blocks: the position-wise feed-forward network (plain or gated,
SwiGLU), the norms (LayerNorm, RMSNorm) and the transformer block (attention and
feed-forward sublayers with residual connections, the norm placed before (pre-norm) or after
(post-norm) each sublayer, and dropout).

* post-norm, ``x = LN(x + f(x))``: the original Transformer (Vaswani et al., 2017);
* pre-norm, ``x = x + f(LN(x))``: GPT-2 (Radford et al., 2019) and most later models; it
  keeps an identity path from input to output and trains without warm-up tricks
  (Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture").

Shape legend
    B  batch size
    T  sequence length (queries)
    S  key length (context length for cross-attention)
    C  model width
    F  feed-forward width (4C by default)
"""

from __future__ import annotations

import functools

import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.errors import ConfigError
from attnlm.nn import fused
from attnlm.nn.attention import KVCache, MultiHeadAttention, Packing

ACTIVATIONS = {
    "gelu": F.gelu,  # exact: x Φ(x) (Hendrycks & Gimpel, 2016)
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "relu": F.relu,  # the original Transformer
    "silu": F.silu,  # x sigmoid(x), "swish" (Ramachandran et al., 2017; Marian's default)
}
NORMS = ("pre", "post")
NORM_TYPES = ("layer", "rms")
FEED_FORWARDS = ("mlp", "swiglu")


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
        onednn_linear: bool = False,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            known = ", ".join(ACTIVATIONS)
            raise ConfigError(f"unknown activation {activation!r} (known: {known})")
        d_ff = d_ff or 4 * d_model
        linear = fused.Linear if onednn_linear else nn.Linear
        self.fc = linear(d_model, d_ff, bias=bias)  # W₁: (B, T, C) -> (B, T, F)
        self.act = ACTIVATIONS[activation]
        self.proj = linear(d_ff, d_model, bias=bias)  # W₂: (B, T, F) -> (B, T, C)
        self.drop = dropout_layer(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class SwiGLU(nn.Module):
    """Gated feed-forward network ``FFN(x) = (SiLU(x W_gate) ⊙ x W_up) W_down`` (Shazeer,
    2020, "GLU Variants Improve Transformer"; Llama, PaLM): one branch gates the other
    elementwise. Three matrices instead of two, so a width ``F ≈ 8C/3`` keeps the ``8C²``
    weights of a ``4C`` plain network. ``W_gate`` and ``W_up`` are fused into ``fc``
    ``(2F, C)`` (gate rows first); ``proj`` is ``W_down``. ``(B, T, C) -> (B, T, C)``."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        bias: bool = False,
        dropout: float = 0.0,
        onednn_linear: bool = False,
    ):
        super().__init__()
        linear = fused.Linear if onednn_linear else nn.Linear
        self.fc = linear(d_model, 2 * d_ff, bias=bias)  # [W_gate; W_up]: (B, T, C) -> 2F
        self.proj = linear(d_ff, d_model, bias=bias)  # W_down: (B, T, F) -> (B, T, C)
        self.drop = dropout_layer(dropout)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.drop(self.proj(F.silu(gate) * up))


def make_norm(kind: str, d_model: int, *, eps: float, bias: bool = True) -> nn.Module:
    """``"layer"``: LayerNorm, ``(x - mean) / sqrt(var + eps) · γ + β``; ``"rms"``: RMSNorm
    (Zhang & Sennrich, 2019), ``x / sqrt(mean(x²) + eps) · γ``: no centring, no bias, one
    reduction fewer (Llama); computed by :func:`attnlm.nn.fused.rms_norm`."""
    if kind == "rms":
        return fused.RMSNorm(d_model, eps=eps)
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    raise ConfigError(f"unknown norm type {kind!r} (known: {', '.join(NORM_TYPES)})")


class TransformerBlock(nn.Module):
    """Self-attention sublayer, an optional cross-attention sublayer (decoder of an
    encoder-decoder), then the feed-forward sublayer; each wrapped in a residual connection
    with a norm in the ``norm`` arrangement ("pre" or "post") and dropout on its output.

    ``norm_type``: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm); ``feed_forward``:
    ``"mlp"`` (:class:`FeedForward`) or ``"swiglu"`` (:class:`SwiGLU`); ``n_kv_head``:
    grouped-query attention (see :class:`~attnlm.nn.attention.MultiHeadAttention`);
    ``onednn_linear``: every projection is :class:`attnlm.nn.fused.Linear`. GPT-2's block is
    the defaults with ``norm="pre"``; Llama's is ``norm_type="rms"``,
    ``feed_forward="swiglu"``, ``bias=False``, ``onednn_linear=True``.

    ``forward(x (B, T, C), ...) -> (x (B, T, C), self-attention weights (B, H, T, S) or None,
    cross-attention weights (B, H, T, S_ctx) or None)``.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        d_ff: int | None = None,
        norm: str = "pre",
        activation: str = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
        eps: float = 1e-5,
        score: str = "scaled_dot",
        cross_attention: bool = False,
        attention_dropout: float | None = None,
        n_kv_head: int | None = None,
        norm_type: str = "layer",
        feed_forward: str = "mlp",
        onednn_linear: bool = False,
    ) -> None:
        super().__init__()
        # dropout on the attention weights; None: the same rate as the residual dropout.
        # Nonzero rates make the fused attention kernel fall back to the explicit formula.
        attn_p = dropout if attention_dropout is None else attention_dropout
        if norm not in NORMS:
            raise ConfigError(f"unknown norm placement {norm!r} (known: pre, post)")
        if feed_forward not in FEED_FORWARDS:
            raise ConfigError(
                f"unknown feed-forward {feed_forward!r} (known: {', '.join(FEED_FORWARDS)})"
            )
        self.pre_norm = norm == "pre"
        self.ln_1 = make_norm(norm_type, d_model, eps=eps, bias=bias)
        onednn = {"onednn_linear": onednn_linear}
        self.attn = MultiHeadAttention(
            d_model, n_head, score=score, bias=bias, dropout=attn_p, n_kv_head=n_kv_head, **onednn
        )
        if cross_attention:
            self.ln_cross = make_norm(norm_type, d_model, eps=eps, bias=bias)
            self.cross_attn = MultiHeadAttention(
                d_model, n_head, cross=True, score=score, bias=bias, dropout=attn_p,
                n_kv_head=n_kv_head, **onednn,
            )  # fmt: skip
        else:
            self.cross_attn = None
        self.ln_2 = make_norm(norm_type, d_model, eps=eps, bias=bias)
        if feed_forward == "swiglu":
            self.mlp: nn.Module = SwiGLU(
                d_model, d_ff or 4 * d_model, bias=bias, dropout=dropout, **onednn
            )
        else:
            self.mlp = FeedForward(
                d_model, d_ff, activation=activation, bias=bias, dropout=dropout, **onednn
            )
        self.drop = dropout_layer(dropout)

    def _residual(self, x: Tensor, ln: nn.Module, out: Tensor) -> Tensor:
        """Add a sublayer's output to its input, with the norm after it for post-norm."""
        return x + self.drop(out) if self.pre_norm else ln(x + self.drop(out))

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        need_weights: bool = False,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        packing: Packing | None = None,
        context_packing: Packing | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``mask, is_causal, rotary, cache, layer, need_weights`` go to self-attention (see
        :class:`MultiHeadAttention`); ``context (B, S, C)`` and ``context_mask`` to
        cross-attention (whose keys/values ``cache`` keeps after the first call).
        ``packing``/``context_packing``: ``x``/``context`` are packed ``(N, C)`` (see
        :class:`~attnlm.nn.attention.Packing`); every per-token layer then runs on real
        tokens only."""
        pre = self.pre_norm  # pre-norm: x + f(LN(x)); post-norm: LN(x + f(x))
        out, weights = self.attn(
            self.ln_1(x) if pre else x,
            mask=mask,
            is_causal=is_causal,
            rotary=rotary,
            cache=cache,
            layer=layer,
            need_weights=need_weights,
            packing=packing,
        )
        x = self._residual(x, self.ln_1, out)
        cross_weights = None
        if self.cross_attn is not None:
            out, cross_weights = self.cross_attn(
                self.ln_cross(x) if pre else x,
                context,
                mask=context_mask,
                cache=cache,
                layer=layer,
                need_weights=need_weights,
                packing=packing,
                context_packing=context_packing,
            )
            x = self._residual(x, self.ln_cross, out)
        out = self.mlp(self.ln_2(x) if pre else x)  # FeedForward applies its own dropout
        x = x + out if pre else self.ln_2(x + out)
        return x, weights, cross_weights
