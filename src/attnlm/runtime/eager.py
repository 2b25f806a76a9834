"""The ``eager`` backend: every family's own ``step`` in PyTorch (:class:`EagerRunner`), with one
fast path for the causal decoders: a decoding step written flat, one new token per row
through every block in one loop of tensor calls, for the case that dominates generation on a
CPU.

A one-token step multiplies one row per sequence by every weight matrix, which is bound by
how fast the weights stream from memory; everything else in the step is small tensor calls.
Through the modules (:class:`~attnlm.models.decoder.Decoder` -> block -> attention -> ...)
each of those calls also pays for its module's generality — masks, padding, packing, cross
attention, the training kernels, hooks — and on a small model that overhead is as large as
the matrix products themselves. :func:`flat_step` does the same arithmetic in one function:
per block a norm, the fused q/k/v product, the rotation of q and k, the cache write, attention
(the module's own :meth:`~attnlm.nn.attention.MultiHeadAttention._mix`), the output product,
a norm, the feed-forward (GELU or SwiGLU) and the two residual adds.

The numbers are the forward's, up to float rounding of a different summation order
(tested: logits within 1e-5 and the same greedy tokens for gpt and llama models, every
position scheme it serves, both caches). Linear layers that are not plain float
``nn.Linear`` (quantized weights, LoRA) are called as modules, so the step serves every
weight format. It runs where the model's blocks allow it (:func:`flat_model`: pre-norm blocks
without cross-attention, positions that are learned, sinusoidal, rotary or none, and the Llama
family's parts: q/k norms, windows, a local rotary base, scaled and capped scores, post-norms,
GeGLU, the embedding scale and final cap; ALiBi takes the forward) and the call does
(:meth:`EagerRunner.step`: evaluation, one token per row, a key/value cache in prefix mode, not
a compiled step's fixed buffers).

Shape legend
    B  rows           C  model width       H / Hkv  query / key-value heads
    D  head width     S  positions held    V  vocabulary
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.models.base import check_ids
from attnlm.nn import fused
from attnlm.nn.attention import MultiHeadAttention, ScaledScore
from attnlm.nn.blocks import ACTIVATIONS, FeedForward, SandwichBlock, SwiGLU, TransformerBlock
from attnlm.nn.cache import KVCache
from attnlm.nn.masks import window_mask

__all__ = [
    "EagerRunner",
    "flat_model",
    "flat_step",
    "flat_step_applies",
    "parted_block",
    "plain_block",
    "unplain_part",
]


def flat_model(model: nn.Module) -> bool:
    """Whether :func:`flat_step` computes ``model``'s one-token step: a causal decoder of
    pre-norm blocks (:func:`plain_block`, or :func:`parted_block` with the Llama family's
    parts) without ALiBi."""
    blocks = getattr(model, "blocks", None)
    return (
        blocks is not None
        and hasattr(model, "tok_emb")
        and getattr(model, "alibi", None) is None
        and all(plain_block(b) or parted_block(b) for b in blocks)
    )


def parted_block(block: nn.Module) -> bool:
    """A block of the Llama family with its optional parts (:mod:`attnlm.models.llama`):
    pre-norm, with or without post-norms (:class:`~attnlm.nn.blocks.SandwichBlock`),
    self-attention whose score is a kernel's or a scaled, soft-capped one
    (:class:`~attnlm.nn.attention.ScaledScore`), q/k norms and a window allowed; a gated or
    plain feed-forward; RMSNorm or LayerNorm everywhere."""
    attn = block.attn
    norms = [getattr(block, n, None) for n in ("ln_1", "ln_2", "ln_post_attn", "ln_post_mlp")]
    norms += [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)]
    return (
        type(block) in (TransformerBlock, SandwichBlock)
        and block.cross_attn is None
        and isinstance(attn, MultiHeadAttention)
        and not attn.cross
        and (attn.score.supports_sdpa or type(attn.score) is ScaledScore)
        and isinstance(block.mlp, (FeedForward, SwiGLU))
        and all(n is None or isinstance(n, (nn.LayerNorm, nn.RMSNorm)) for n in norms[2:])
        # no pre-norms (identities) only where the outputs are normed (OLMo 2)
        and all(
            isinstance(n, (nn.LayerNorm, nn.RMSNorm))
            or (isinstance(n, nn.Identity) and type(block) is SandwichBlock)
            for n in norms[:2]
        )  # fmt: skip
        and not (block.ln_1 is None or block.ln_2 is None)
    )


def unplain_part(model: nn.Module) -> str | None:
    """The first optional part of a Llama-family model (:mod:`attnlm.models.llama`) that the
    plain one-token step does not compute, as a short phrase, or None: an embedding scale,
    final or attention soft-capping, attention sinks, a second rotary base, sliding windows,
    q/k norms, post-norms, a GELU-gated feed-forward, a mixture of experts, a residual or
    logit scale.
    (Biases and a head width other than ``C / H`` it computes.)"""
    if getattr(model, "embed_scale", None) is not None:
        return "an embedding scale"
    if getattr(model, "final_softcap", None) is not None:
        return "final logit soft-capping"
    if getattr(model, "logit_scale", None) is not None:
        return "a logit scale"
    if getattr(model, "rotary_local", None) is not None:
        return "a second rotary base for the local layers"
    for block in getattr(model, "blocks", ()):
        attn = block.attn
        if getattr(attn, "window", None) is not None:
            return "sliding-window attention"
        if getattr(attn, "q_norm", None) is not None or getattr(attn, "k_norm", None) is not None:
            return "q/k norms"
        if getattr(attn.score, "softcap", None) is not None:
            return "attention soft-capping"
        if getattr(attn, "sinks", None) is not None:
            return "attention sinks"
        if getattr(block, "ln_post_attn", None) is not None:
            return "post-norms"
        if getattr(block.mlp, "gated_act", "silu") != "silu":
            gelu = block.mlp.gated_act == "gelu_tanh"
            return "a GELU-gated feed-forward" if gelu else "a clamped SwiGLU feed-forward"
        if getattr(block.mlp, "experts", None) is not None:
            return "a mixture of experts"
        if getattr(block, "residual_scale", None) is not None:
            return "a residual scale"
    return None


def flat_step_applies(model: nn.Module, tokens: Tensor, state: object) -> bool:
    """Whether :func:`flat_step` gives ``model.step(tokens, state)``'s logits (the model's
    blocks and this call, in evaluation)."""
    return flat_model(model) and not model.training and _flat_call(tokens, state)


def _flat_call(tokens: Tensor, state: object) -> bool:
    """Whether this call is one :func:`flat_step` takes: one token per row, a prefix-mode
    key/value cache, evaluation without gradients."""
    return (
        tokens.dim() == 2
        and tokens.shape[1] == 1
        and isinstance(state, KVCache)
        and not getattr(state, "fixed", False)
        and not torch.is_grad_enabled()
    )


class EagerRunner:
    """The ``eager`` backend (:mod:`attnlm.runtime`): the decoding-state protocol of one model
    in PyTorch. ``new_state(batch, max_len=)`` is the model's; ``step(tokens (B, T), state,
    last_only)`` -> logits ``(B, T, V)`` (``(B, 1, V)`` with ``last_only``, where the model's
    step takes it) feeds new tokens. ``reason``: why the planner chose it."""

    name = "eager"

    def __init__(self, model: nn.Module, reason: str = "") -> None:
        self.model, self.reason = model, reason
        self.flat = flat_model(model)  # decided once: the blocks do not change during a decode
        self.takes_last_only = bool(getattr(model, "step_last_only", False))

    def new_state(self, batch: object = None, *, max_len: int | None = None) -> object:
        if max_len is None:
            return self.model.new_state(batch)
        return self.model.new_state(batch, max_len=max_len)

    def step(self, tokens: Tensor, state: object, last_only: bool = False) -> Tensor:
        if self.flat and not self.model.training and _flat_call(tokens, state):
            return flat_step(self.model, tokens, state)  # one token: its logits are the last
        if self.takes_last_only:
            return self.model.step(tokens, state, last_only=last_only)
        return self.model.step(tokens, state)

    def last_logits(self, tokens: Tensor, state: object) -> Tensor:
        """Logits ``(B, V)`` after the last of ``tokens``: a decoder's LM head runs on that
        position alone (a prompt's prefill makes no ``(B, T, V)`` logits)."""
        return self.step(tokens, state, last_only=True)[:, -1]


def plain_block(block: nn.Module) -> bool:
    """A pre-norm block (exactly :class:`TransformerBlock`) of self-attention with a fused
    q/k/v projection and a kernel score, and a GELU or SwiGLU feed-forward."""
    attn = block.attn
    return (
        type(block) is TransformerBlock
        and block.cross_attn is None
        and isinstance(attn, MultiHeadAttention)
        and not attn.cross
        and attn.score.supports_sdpa
        and isinstance(block.mlp, (FeedForward, SwiGLU))
        and isinstance(block.ln_1, (nn.LayerNorm, nn.RMSNorm))
        and isinstance(block.ln_2, (nn.LayerNorm, nn.RMSNorm))
    )


def _norm(norm: nn.Module) -> Callable[[Tensor], Tensor]:
    """The norm as functional calls on ``(B, C)`` rows. RMSNorm in float32 is written out
    (``x / sqrt(mean(x²) + ε) γ``, the order of Hugging Face's ``LlamaRMSNorm``): five small
    calls cost less here than ``F.rms_norm``'s general kernel, between matrix products that
    have just pushed everything else out of the caches."""
    if isinstance(norm, nn.LayerNorm):
        shape, w, b, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
        return lambda x: F.layer_norm(x, shape, w, b, eps)
    if isinstance(norm, nn.RMSNorm):
        shape, w = norm.normalized_shape, norm.weight
        eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps

        def rms(x: Tensor) -> Tensor:
            if x.dtype != torch.float32 or w is None:
                return F.rms_norm(x, shape, w, eps)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps)) * w

        return rms
    return norm  # an identity (post-norm models end their blocks in a norm)


Linear = Callable[..., Tensor]  # (x (B, in), residual (B, out) or None) -> (B, out)


def _linear(layer: nn.Module) -> Linear:
    """``(x (B, in), residual=None) -> residual + x Wᵀ (+ b)`` ``(B, out)``: a plain float
    ``nn.Linear`` as one BLAS call on its weight (as :func:`~attnlm.nn.layout.
    decoding_layout` stored it, the residual added by the same call), anything else
    (quantized or adapted weights) through its own forward."""
    if isinstance(layer, nn.Linear) and type(layer).forward in _PLAIN_FORWARDS:
        wt, b = layer.weight.t(), layer.bias  # (in, out) view

        def plain(x: Tensor, residual: Tensor | None = None) -> Tensor:
            if residual is not None:
                out = torch.addmm(residual, x, wt)
                return out if b is None else out.add_(b)
            return torch.mm(x, wt) if b is None else torch.addmm(b, x, wt)

        return plain

    def module(x: Tensor, residual: Tensor | None = None) -> Tensor:
        out = layer.forward(x)
        return out if residual is None else residual + out

    return module


_PLAIN_FORWARDS = (nn.Linear.forward, fused.Linear.forward)


def _turn(rotary: nn.Module | None, positions: Tensor, dtype: torch.dtype):
    """The rotation of one position as ``(cos, ±sin)`` ``(2, R/2)`` each (``R`` the rotated
    features: ``D``, or fewer with partial rotary), or None."""
    if rotary is None:
        return None
    cos, sin = rotary(positions)  # (1, D), the two halves equal
    half = cos.shape[-1] // 2
    c, s = cos[0, :half].to(dtype), sin[0, :half].to(dtype)
    # rotate-half pairs (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) on (.., 2, D/2)
    return torch.stack([c, c]), torch.stack([-s, s])


def flat_step(model: nn.Module, tokens: Tensor, state: KVCache) -> Tensor:
    """Logits ``(B, 1, V)`` of one new token per row ``tokens`` ``(B, 1)`` after what
    ``state`` holds; ``state`` takes the new keys and values (as ``model.step`` does). The
    Llama family's parts as the forward computes them: the embedding scale, q/k norms before
    the rotation, a sliding layer's window (a band over the keys' positions) and rotary base,
    the score's scale and cap, post-norms, GeGLU, the final soft-cap."""
    check_ids(tokens, model.config.vocab_size, "tokens")
    B = tokens.shape[0]
    positions = state.positions(1, tokens.device)  # (1,)
    x = flat_embed(model, tokens[:, 0], positions)  # (B, C); (1, C) positions broadcast
    turns = flat_turns(model, lambda rotary: _turn(rotary, positions, x.dtype))
    bands: dict[int, Tensor] = {}  # window -> (1, S): the keys a sliding layer may see
    for block in model.blocks:
        w = getattr(block.attn, "window", None)
        if w is not None and w not in bands:
            keys = state.key_positions(1, tokens.device)  # (S,), before any layer appends
            bands[w] = window_mask(positions, keys, w, x.dtype)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        qk, v = flat_qkv(block, x, turns)  # (B, H + Hkv, 1, D), (B, Hkv, 1, D)
        k_all, v_all = state.append(layer, qk[:, attn.n_head :], v)  # (B, Hkv, S, D)
        window = getattr(attn, "window", None)
        mask = None if window is None else bands[window]
        y, _ = attn._mix(qk[:, : attn.n_head], k_all, v_all, mask, False, False)  # (B, H, 1, D)
        x = flat_block_rest(block, x, y.reshape(B, -1))
    state.advance(1)
    return flat_head(model, x).unsqueeze(1)  # (B, 1, V)


# -- the pieces of one flat step, shared with the server's batched step (attnlm.api.batch) --


def flat_embed(model: nn.Module, ids: Tensor, positions: Tensor) -> Tensor:
    """The embeddings ``(N, C)`` of one token per row: scaled where the model scales them,
    its learned positions added (``positions`` ``(1,)`` or ``(N,)``)."""
    x = model.tok_emb(ids)  # (N, C)
    if getattr(model, "embed_scale", None) is not None:
        x = x * model.embed_scale
    if model.pos_emb is not None:
        x = x + model.pos_emb(positions).to(x.dtype)
    return x


def flat_turns(model: nn.Module, turn: Callable[[nn.Module | None], Any]) -> tuple:
    """``(full layers' rotation, sliding layers' rotation)``, each ``turn(rotary)``
    (``(cos, ±sin)`` or None); the sliding layers' is the full one without a local rotary
    base."""
    full = turn(model.rotary)
    local = getattr(model, "rotary_local", None)
    return full, full if local is None else turn(local)


def flat_qkv(block: nn.Module, x: Tensor, turns: tuple) -> tuple[Tensor, Tensor]:
    """``block``'s q and k ``(N, H + Hkv, 1, D)`` (each head's norm, then the rotation of
    its layer: ``turns[1]`` on a sliding layer) and v ``(N, Hkv, 1, D)`` of ``x`` ``(N, C)``;
    a rotation broadcasts over ``(N, H + Hkv, 2, D/2)``."""
    attn = block.attn
    N, H, Hkv, D = x.shape[0], attn.n_head, attn.n_kv_head, attn.d_head
    qkv = _linear(attn.qkv_proj)(_norm(block.ln_1)(x))  # (N, (H + 2 Hkv) D)
    qk = qkv[:, : (H + Hkv) * D].view(N, H + Hkv, D)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is not None or k_norm is not None:  # each head's norm, before the rotation
        q, k = qk[:, :H], qk[:, H:]
        if getattr(attn, "qk_norm_all", False):  # all heads' at once (OLMo 2)
            q = q if q_norm is None else q_norm(q.reshape(N, H * D)).view(N, H, D)
            k = k if k_norm is None else k_norm(k.reshape(N, Hkv * D)).view(N, Hkv, D)
        else:
            q = q if q_norm is None else q_norm(q)
            k = k if k_norm is None else k_norm(k)
        qk = torch.cat([q, k], 1)
    t = turns[0] if getattr(attn, "window", None) is None else turns[1]
    if t is not None and not getattr(attn, "nope", False):  # (a NoPE layer is not rotated)
        r = 2 * t[0].shape[-1]  # the features rotated: all, or the first R (partial rotary)
        turned = qk[..., :r].reshape(N, H + Hkv, 2, r // 2)
        turned = torch.addcmul(turned * t[0], turned.flip(2), t[1])  # q and k rotated
        qk = turned.reshape(N, H + Hkv, r) if r == D else torch.cat(
            [turned.reshape(N, H + Hkv, r), qk[..., r:]], dim=-1)  # fmt: skip
    return qk.reshape(N, H + Hkv, 1, D), qkv[:, (H + Hkv) * D :].reshape(N, Hkv, 1, D)


def flat_block_rest(block: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The rest of ``block`` after attention: the heads' output ``y`` ``(N, H D)`` projected
    and added to ``x`` ``(N, C)`` (through the post-attention norm where there is one), then
    the feed-forward (gated: SiLU or GELU-tanh) likewise; each output times the block's
    ``residual_scale`` before it is added, where it has one (Granite)."""
    attn, mlp = block.attn, block.mlp
    post = getattr(block, "ln_post_attn", None)
    if getattr(block, "residual_scale", None) is not None:
        post = post or nn.Identity()  # outputs apart from the adds, to be scaled
    if post is None:
        x = _linear(attn.out_proj)(y, x)
    else:
        x = x + block.scaled(_norm(post)(_linear(attn.out_proj)(y)))
    h = _norm(block.ln_2)(x)
    if isinstance(mlp, SwiGLU):  # gated: SiLU (SwiGLU) or GELU-tanh (GeGLU)
        gate, up = _linear(mlp.fc)(h).chunk(2, dim=-1)  # (N, F) each
        h = ACTIVATIONS[mlp.gated_act](gate) * up
    else:
        h = mlp.act(_linear(mlp.fc)(h))
    if post is None:
        return _linear(mlp.proj)(h, x)
    last = getattr(block, "ln_post_mlp", None) or nn.Identity()
    return x + block.scaled(_norm(last)(_linear(mlp.proj)(h)))


def flat_head(model: nn.Module, x: Tensor) -> Tensor:
    """Logits ``(N, V)`` of ``x`` ``(N, C)``: the final norm, the LM head, the final soft-cap
    and divisor (the model's own, :meth:`~attnlm.models.decoder.Decoder._cap`)."""
    logits = _linear(model.lm_head)(_norm(model.ln_f)(x))
    return getattr(model, "_cap", lambda v: v)(logits)
