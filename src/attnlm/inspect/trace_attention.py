"""The attention sublayer of a traced pass (:mod:`attnlm.inspect.trace`): the fast path's own
q/k/v, ``z`` and output, with the scores, pattern and per-head results computed beside it when
asked. Points (TransformerLens's names, under ``blocks.{L}.attn.``): ``hook_q``, ``hook_k``,
``hook_v`` (after the projection), ``q_norm.hook_scale`` / ``q_norm.hook_normalized`` and
``k_norm.*`` (a model with per-head q/k norms: Qwen3, Gemma 3; ``(B, T, H, 1)`` and
``(B, T, H, D)``; norms over all heads, OLMo 2: ``(B, T, 1, 1)`` and
``(B, T, H, D)``), ``hook_rot_q`` / ``hook_rot_k`` (after rotary), ``hook_attn_scores``,
``hook_pattern``, ``hook_z``, ``hook_result``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlm.base.errors import InputError


def attention(tr: Any, p: str, attn: Any, h: Tensor, layer: int, attend: dict[str, Any]):
    """``attn(h)`` (``(B, T, C)`` -> ``(B, T, C)``) with its points: the fast path's own
    q/k/v, ``z`` and output, and the scores, pattern and per-head results computed beside it
    when asked; an edit of q/k (before rotary), the scores or the pattern takes the explicit
    formula instead."""
    from attnlm.nn import fused
    from attnlm.nn.attention import apply_rotary

    a = f"{p}.attn"
    rotary, cache = attend.get("rotary"), attend.get("cache")
    if getattr(attn, "nope", False):  # a layer without positions: no rotation, no rot points
        rotary = None
    B, T, _ = h.shape
    qkv = attn.qkv_proj(h)
    q0, k0, v0 = (attn._heads(t) for t in attn._split_qkv(qkv))  # (B, H|Hkv, T, D)
    pre_edit = any(tr.edits(f"{a}.hook_{n}") for n in ("q", "k", "v"))
    q0, k0, v0 = (_bhtd(tr.point(f"{a}.hook_{n}", _bthd(t)))
                  for n, t in (("q", q0), ("k", k0), ("v", v0)))  # fmt: skip
    normed = attn.q_norm is not None or attn.k_norm is not None
    if normed:  # the norms of q and k (their points), then the rotation
        norm = _wide_norm if getattr(attn, "qk_norm_all", False) else _head_norm
        q0, k0 = (
            norm(tr, f"{a}.q_norm", attn.q_norm, q0),
            norm(tr, f"{a}.k_norm", attn.k_norm, k0),
        )
    if rotary is None:
        q, k, v = q0, k0, v0
    elif pre_edit or normed or rotary[0].shape[-1] != attn.d_head:  # (partial: apply_rotary)
        q, k, v = apply_rotary(q0, *rotary), apply_rotary(k0, *rotary), v0
    elif torch.compiler.is_compiling():
        q, k, v = apply_rotary(q0, *rotary), apply_rotary(k0, *rotary), v0
    else:  # the fast path's own kernel, on the same projection
        q, k, v = fused.rotary_heads(qkv, *rotary, attn.n_head, attn.n_kv_head)
    if rotary is not None:
        q = _bhtd(tr.point(f"{a}.hook_rot_q", _bthd(q)))
        k = _bhtd(tr.point(f"{a}.hook_rot_k", _bthd(k)))
    if cache is not None:
        k, v = cache.append(layer, k, v)
    explicit = tr.edits(f"{a}.hook_attn_scores") or tr.edits(f"{a}.hook_pattern")
    if explicit or tr.wants(f"{a}.hook_attn_scores") or tr.wants(f"{a}.hook_pattern"):
        pattern = _pattern(tr, a, attn, q, k, attend.get("mask"), attend.get("is_causal", False))
    if explicit:
        y = pattern @ attn._shared(v)  # (B, H, T, D)
    else:
        y, _ = attn._mix(q, k, v, attend.get("mask"), attend.get("is_causal", False), False)
    z = tr.point(f"{a}.hook_z", _bthd(y))  # (B, T, H, D)
    if tr.wants(f"{a}.hook_result"):
        result = tr.point(f"{a}.hook_result", head_results(attn, z))
        if tr.edits(f"{a}.hook_result"):
            bias = attn.out_proj.bias
            return result.sum(2) + (0 if bias is None else bias)
    return attn.out_proj(z.reshape(B, T, -1))


def _head_norm(tr: Any, prefix: str, norm: Any, t: Tensor) -> Tensor:
    """A per-head norm of ``t`` ``(B, H, T, D)`` through ``PREFIX.hook_scale`` and
    ``PREFIX.hook_normalized`` (in TransformerLens's ``(B, T, H, .)`` layout)."""
    if norm is None:
        return t
    scale, normalized = f"{prefix}.hook_scale", f"{prefix}.hook_normalized"
    if tr.edits(scale) or tr.edits(normalized):
        return _bhtd(tr.norm(prefix, norm, _bthd(t)))
    if tr.wants(scale) or tr.wants(normalized):
        tr.norm(prefix, norm, _bthd(t))  # captured beside the pass
    return norm(t)  # the forward's own call, on the forward's layout (the same bits)


def _wide_norm(tr: Any, prefix: str, norm: Any, t: Tensor) -> Tensor:
    """A norm over all heads at once (OLMo 2) of ``t`` ``(B, H, T, D)``: the scale ``(B, T,
    1, 1)`` and the normalized heads ``(B, T, H, D)`` through ``PREFIX.hook_scale`` and
    ``PREFIX.hook_normalized``."""
    B, H, T, D = t.shape
    x = _bthd(t)  # (B, T, H, D)
    scale, normalized = f"{prefix}.hook_scale", f"{prefix}.hook_normalized"
    if not (tr.wants(scale) or tr.wants(normalized)):
        return _bhtd(norm(x.reshape(B, T, H * D)).view(B, T, H, D))
    s, n = norm_parts(norm, x.reshape(B, T, H * D))  # (B, T, 1), (B, T, H D)
    s = tr.point(scale, s[..., None])
    n = x / s if tr.edits(scale) else n.view(B, T, H, D)
    n = tr.point(normalized, n)
    if tr.edits(scale) or tr.edits(normalized):
        out = norm_apply(norm, n.reshape(B, T, H * D))
    else:
        out = norm(x.reshape(B, T, H * D))  # the forward's own call (the same bits)
    return _bhtd(out.view(B, T, H, D))


def _bthd(t: Tensor) -> Tensor:
    return t.transpose(1, 2)  # (B, H, T, D) <-> (B, T, H, D)


_bhtd = _bthd


def _pattern(tr: Any, a: str, attn: Any, q: Tensor, k: Tensor, mask, is_causal) -> Tensor:
    """Scores ``(B, H, T, S)`` (scaled, plus the additive mask; a masked key holds the dtype's
    lowest value, as in TransformerLens) and their softmax (with the layer's attention sinks,
    gpt-oss: a row's weights then sum to less than one), through their points."""
    from attnlm.nn.attention import sink_softmax
    from attnlm.nn.masks import causal_mask, combine_masks

    T, S = q.shape[-2], k.shape[-2]
    scores = attn.score(q, attn._shared(k))
    if is_causal and T > 1:
        mask = combine_masks(mask, causal_mask(T, S, device=q.device, dtype=q.dtype))
    if mask is not None:
        scores = scores + mask
    lowest = torch.finfo(scores.dtype).min  # masked: the dtype's lowest (TransformerLens's)
    scores = scores.masked_fill(scores <= lowest / 2, lowest)
    scores = tr.point(f"{a}.hook_attn_scores", scores)
    sink = attn._sink() if getattr(attn, "sinks", None) is not None else None
    return tr.point(f"{a}.hook_pattern", sink_softmax(scores, sink))


def head_results(attn: Any, z: Tensor) -> Tensor:
    """Each head's write into the residual stream ``(B, T, H, C)``: its ``z`` ``(B, T, H, D)``
    through its slice of the output projection ``W_O[:, h D:(h + 1) D]``, without the bias
    (the sum over heads plus the bias is the attention output); one batched product over the
    heads, as many multiply-adds as the projection itself."""
    H, D = z.shape[-2:]
    proj = attn.out_proj
    w = proj.dequantized() if hasattr(proj, "dequantized") else proj.weight  # (C, H D)
    w_heads = w.view(w.shape[0], H, D).transpose(0, 1)  # (H, C, D)
    out = torch.matmul(z.permute(0, 2, 1, 3), w_heads.transpose(1, 2))  # (B, H, T, C)
    return out.permute(0, 2, 1, 3)  # (B, T, H, C)


# -- norms (the trace's, attnlm.inspect.trace) --------------------------------------------------


def norm_mean(norm: Any, x: Tensor) -> Tensor | float:
    return 0.0 if _is_rms(norm) else x.mean(-1, keepdim=True)


def _is_rms(norm: Any) -> bool:
    return isinstance(norm, torch.nn.RMSNorm)


def _eps(norm: Any, x: Tensor) -> float:
    eps = getattr(norm, "eps", None)
    return float(eps) if eps is not None else float(torch.finfo(x.dtype).eps)


def norm_parts(norm: Any, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(scale (B, T, 1), normalized (B, T, C))`` of a LayerNorm or RMSNorm: ``x`` (centred
    for LayerNorm) divided by ``scale = sqrt(mean of squares + eps)``."""
    if not isinstance(norm, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        raise InputError(f"tracing a {type(norm).__name__} norm is not supported")
    centred = x - norm_mean(norm, x)
    scale_ = (centred.pow(2).mean(-1, keepdim=True) + _eps(norm, x)).sqrt()
    return scale_, centred / scale_


def norm_apply(norm: Any, normalized: Tensor) -> Tensor:
    """The norm's weight (and LayerNorm's bias) applied to ``normalized``."""
    out = normalized if norm.weight is None else normalized * norm.weight
    bias = getattr(norm, "bias", None)
    return out if bias is None else out + bias
