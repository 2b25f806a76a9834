"""Attention: the parameter-free lecture version, :func:`attend`, and multi-head attention
(self and cross) with a fused fast path.

Attention is a soft dictionary lookup: every query scores every key, the scores become weights
with a softmax over the keys, and the output is the weighted average of the values. The parts
are kept apart so each can be read (and swapped) on its own, one file each:

* score functions ``(q, k) -> scores`` (:mod:`.score_functions`): additive (Bahdanau et al.,
  2015), bilinear and dot (Luong et al., 2015), scaled dot (Vaswani et al., 2017);
* masks as additive ``-inf`` tensors (:mod:`.masks`): causal (look-ahead), key padding, their
  sum;
* :func:`attend` (here) turns scores + mask into weights and mixes the values;
* :class:`MultiHeadAttention` (here) holds the projections ``W_Q, W_K, W_V`` (fused) and
  ``W_O``;
* the KV cache of incremental decoding (:mod:`.cache`) and the packed-token layout
  (:mod:`.packing`) that :class:`MultiHeadAttention` reads and writes.

Every one of these names is importable from this module too (``attnlm.nn.attention``).

When the weights are not requested and the score is (scaled) dot,
:class:`MultiHeadAttention` calls ``torch.nn.functional.scaled_dot_product_attention``,
which gives the same numbers (tested) without materialising the T x S weights when the
backend does not need them.

Shape legend
    B  batch size
    T  query length (the tokens being processed now)
    S  key/value length: T in plain self-attention, cached + T with a KV cache, the source
       length in cross-attention
    H  number of (query) heads
    Hkv number of key/value heads (H for multi-head attention; fewer with grouped-query
       attention, 1 for multi-query attention)
    G  query heads per key/value head (H // Hkv)
    D  width of one head (C // H)
    C  model width (d_model, n_embd)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.nn import fused
from attnlm.nn.cache import KVCache
from attnlm.nn.masks import causal_mask, combine_masks, padding_mask
from attnlm.nn.packing import Packing
from attnlm.nn.score_functions import (
    SCORE_ALIASES,
    SCORES,
    AdditiveScore,
    BilinearScore,
    DotScore,
    ScaledDotScore,
    make_score,
)

# decoding one query per row: above this many rows x heads the two explicit matmuls beat the
# fused kernel on CPU, below it the fused kernel wins (measured)
SINGLE_QUERY_ROWS = 64


def single_query_explicit(q: Tensor) -> bool:
    """The CPU decoding rule: queries ``q`` ``(B, H, 1, D)`` (one per row) take the explicit
    formula when there are more than :data:`SINGLE_QUERY_ROWS` rows x heads, where two small
    matmuls cost less than the fused kernel's setup (and under ``torch.compile``, whose
    kernels for them fuse); fewer rows keep the fused kernel. The same numbers either way."""
    return (
        q.shape[-2] == 1
        and q.device.type == "cpu"
        and (q.shape[0] * q.shape[1] > SINGLE_QUERY_ROWS or torch.compiler.is_compiling())
    )


__all__ = [
    "SCORES",
    "SCORE_ALIASES",
    "AdditiveScore",
    "BilinearScore",
    "DotScore",
    "KVCache",
    "MultiHeadAttention",
    "Packing",
    "ScaledDotScore",
    "ScaledScore",
    "apply_rotary",
    "attend",
    "sink_softmax",
    "causal_mask",
    "combine_masks",
    "make_score",
    "padding_mask",
    "simple_self_attention",
]

# ---------------------------------------------------------------------------------------------
# The lectures' parameter-free self-attention


def simple_self_attention(x: Tensor) -> tuple[Tensor, Tensor]:
    """``Z = softmax_rows(X Xᵀ) X``: every token is a query, a key and a value at once.

    ``x`` is ``(T, D)`` or ``(B, T, D)``; returns ``(z, weights)`` with ``z`` shaped like
    ``x`` and ``weights`` ``(..., T, T)`` (each row sums to 1). No scaling, no projections,
    no mask: the lecture's first picture of attention.
    """
    if x.dim() not in (2, 3):
        raise InputError(f"simple_self_attention expects (T, D) or (B, T, D), got {tuple(x.shape)}")
    scores = x @ x.transpose(-2, -1)  # (..., T, T)
    weights = torch.softmax(scores, dim=-1)  # (..., T, T)
    return weights @ x, weights  # (..., T, D), (..., T, T)


# ---------------------------------------------------------------------------------------------
# attend: scores + mask -> weights -> weighted values


def sink_softmax(scores: Tensor, sink: Tensor | None) -> Tensor:
    """The softmax over keys of ``scores`` ``(..., T, S)``, with an **attention sink** where
    ``sink`` (broadcastable to ``(..., T, 1)``) is given: one more logit per row that takes its
    share of the softmax and has no value (gpt-oss's learned per-head sinks: a head may attend
    to nothing, so its weights sum to less than one)."""
    if sink is None:
        return torch.softmax(scores, dim=-1)
    extra = sink.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, extra], dim=-1), dim=-1)[..., :-1]


def attend(
    scores: Tensor,
    mask: Tensor | None,
    v: Tensor,
    *,
    dropout_p: float = 0.0,
    sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Softmax over keys of ``scores + mask`` (with a ``sink`` logit per row:
    :func:`sink_softmax`), then the weighted sum of ``v``.

    ``scores`` ``(..., T, S)``, ``mask`` broadcastable to it or None, ``v`` ``(..., S, Dv)``.
    Returns ``(output (..., T, Dv), weights (..., T, S))``; ``weights`` are before dropout.
    """
    if mask is not None:
        scores = scores + mask
    weights = sink_softmax(scores, sink)  # (..., T, S)
    mixed = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return mixed @ v, weights  # (..., T, Dv)


# ---------------------------------------------------------------------------------------------
# Multi-head attention


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs of features of ``x`` ``(B, H, T, D)`` by the angles in ``cos, sin``
    (broadcastable to ``(B, H, T, R)``); see :class:`attnlm.nn.positional.RotaryEmbedding`.
    With ``R < D`` (partial rotary: Phi-4 mini's 3/4) the first ``R`` features rotate, in
    pairs ``(i, i + R/2)``, and the rest pass as they are."""
    if cos.shape[-1] < x.shape[-1]:
        r = cos.shape[-1]
        return torch.cat([apply_rotary(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)  # "rotate half": (x1, x2) -> (-x2, x1)
    return x * cos + rotated * sin


class ScaledScore(nn.Module):
    """``score(q, k) = qᵀ k · scale`` with a chosen ``scale`` (None: ``1 / sqrt(D)``), soft-capped
    to ``cap · tanh(score / cap)`` when ``softcap`` is given (Gemma 2's attention logits:
    bounded in ``(-cap, cap)``, smooth). Capped scores have no fused kernel
    (``supports_sdpa`` False): attention takes the explicit formula."""

    def __init__(self, scale: float | None = None, softcap: float | None = None) -> None:
        super().__init__()
        self.scale, self.softcap = scale, softcap
        self.supports_sdpa = softcap is None
        self.sdpa_scale = scale

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        scale = q.shape[-1] ** -0.5 if self.scale is None else self.scale
        scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        return scores


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2).

    ``head_h = attend(score(X W_Q^h, Y W_K^h), mask, Y W_V^h)`` and the output is
    ``concat(head_1..head_H) W_O``. For self-attention ``Y = X`` and the three projections are
    one fused ``Linear(C, 3C)`` (``qkv_proj``); for cross-attention (``cross=True``) the
    queries come from ``x`` ``(B, T, C)`` and keys/values from ``context`` ``(B, S, C_ctx)``
    through ``q_proj`` and a fused ``kv_proj``. ``out_proj`` is ``W_O``.

    Grouped-query attention (GQA, Ainslie et al., 2023): with ``n_kv_head`` < ``n_head``
    key/value heads, each key/value head serves ``G = n_head / n_kv_head`` consecutive query
    heads (query head ``h`` reads key/value head ``h // G``). The key and value projections
    shrink to ``C · n_kv_head / n_head`` outputs each, and so does the KV cache, which stores
    only the ``n_kv_head`` heads. ``n_kv_head = n_head`` (the default) is multi-head
    attention, ``n_kv_head = 1`` multi-query attention (Shazeer, 2019).

    Rotary positions are applied by :func:`apply_rotary` (under ``torch.compile``) or by
    :func:`attnlm.nn.fused.rotary_heads` in eager mode (the same rotation fused with the head
    split, with a hand-written backward), in :meth:`_project`.

    Optional parts (the Llama family's members): ``d_head``, a head width other than
    ``C / H`` (q is ``H D`` wide, ``out_proj`` maps ``H D`` back to ``C``); ``out_bias``, the
    output projection's bias when it differs from ``bias`` (Qwen2: q/k/v biases only);
    ``q_norm`` / ``k_norm``, norms of each head's q and k over ``D`` before the rotation
    (Qwen3, Gemma 3), or with ``qk_norm_all`` of all heads' q (``H D``) and k (``Hkv D``) at
    once (OLMo 2); ``window``, a sliding window the model's mask applies to this layer
    (read by :class:`~attnlm.models.decoder.Decoder`, which builds the masks); ``nope``, a
    layer without positions (NoPE, Kazemnejad et al., 2023): the rotation the model hands
    every layer is not applied here (SmolLM3's every fourth layer); ``score`` may be a score
    module (:class:`ScaledScore`); ``sinks``, gpt-oss's sink logit per head (:func:`sink_softmax`).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        cross: bool = False,
        d_context: int | None = None,
        score: str | nn.Module = "scaled_dot",
        bias: bool = True,
        dropout: float = 0.0,
        n_kv_head: int | None = None,
        d_head: int | None = None,
        out_bias: bool | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        qk_norm_all: bool = False,
        window: int | None = None,
        nope: bool = False,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        if d_head is None and d_model % n_head != 0:
            raise ConfigError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if n_kv_head <= 0 or n_head % n_kv_head != 0:
            raise ConfigError(f"n_kv_head ({n_kv_head}) must divide n_head ({n_head})")
        self.d_model, self.n_head = d_model, n_head
        self.d_head = d_model // n_head if d_head is None else d_head
        self.d_q = n_head * self.d_head  # width of the queries (C unless d_head is chosen)
        self.n_kv_head, self.groups = n_kv_head, n_head // n_kv_head
        self.d_kv = n_kv_head * self.d_head  # width of the keys (and of the values)
        self.cross = cross
        if cross:
            self.q_proj = nn.Linear(d_model, self.d_q, bias=bias)
            self.kv_proj = nn.Linear(d_context or d_model, 2 * self.d_kv, bias=bias)
        else:  # W_Q, W_K, W_V fused: (H D + 2 C_kv, C)
            self.qkv_proj = nn.Linear(d_model, self.d_q + 2 * self.d_kv, bias=bias)
        out_bias = bias if out_bias is None else out_bias
        self.out_proj = nn.Linear(self.d_q, d_model, bias=out_bias)
        self.q_norm, self.k_norm, self.qk_norm_all = q_norm, k_norm, qk_norm_all
        self.window, self.nope = window, nope
        self.score = score if isinstance(score, nn.Module) else make_score(score, self.d_head)
        self.dropout = dropout
        if sinks and cross:
            raise ConfigError("attention sinks are for self-attention")
        self.sinks = nn.Parameter(torch.zeros(n_head)) if sinks else None

    def _sink(self, grouped_rows: int = 0) -> Tensor | None:
        """The sink logits as a column broadcastable to the scores: ``(H, 1, 1)``, or with
        ``grouped_rows`` ``T`` the grouped layout's ``(Hkv, G T, 1)`` (None without sinks)."""
        if self.sinks is None:
            return None
        if not grouped_rows:
            return self.sinks.view(-1, 1, 1)
        s = self.sinks.view(self.n_kv_head, self.groups, 1)
        return s.expand(-1, -1, grouped_rows).reshape(self.n_kv_head, -1)[..., None]

    def _heads(self, t: Tensor) -> Tensor:
        b, n, width = t.shape
        return t.view(b, n, width // self.d_head, self.d_head).transpose(1, 2)  # (B, H, n, D)

    def _split_qkv(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection's output ``(..., H D + 2 C_kv)`` -> q ``(..., H D)``, k, v
        ``(..., C_kv)``."""
        return qkv.split([self.d_q, self.d_kv, self.d_kv], dim=-1)

    def _shared(self, k: Tensor) -> Tensor:
        """Keys or values ``(B, Hkv, S, D)`` repeated for the query heads that share them,
        ``(B, H, S, D)`` (the explicit formula's view of grouped-query attention)."""
        if self.groups == 1:
            return k
        B, Hkv, S, D = k.shape
        return k[:, :, None].expand(B, Hkv, self.groups, S, D).reshape(B, self.n_head, S, D)

    def _group_mask(self, mask: Tensor | None, H: int, T: int, S: int) -> Tensor | None:
        """A mask broadcastable to ``(B, H, T, S)`` in the grouped layout ``(B, Hkv, G T, S)``
        (a mask that is the same for every query row and head broadcasts as it is)."""
        if mask is None:
            return None
        m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B | 1, ., ., S | 1)
        if m.shape[1] == 1 and m.shape[2] == 1:
            return m
        m = m.expand(m.shape[0], H, T, S)
        return m.reshape(m.shape[0], self.n_kv_head, self.groups * T, S)

    def context_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of ``context`` ``(B, S, C_ctx)``, split into heads
        ``(B, Hkv, S, D)`` each: computed once per source and reused at every decoding step."""
        k, v = self.kv_proj(context).split(self.d_kv, dim=-1)  # (B, S, C_kv) each
        return self._heads(k), self._heads(v)

    def _grouped(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, g: int, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Cross-attention of queries ``q`` ``(B, H, T, D)`` whose rows come in groups of
        ``g`` sharing one row of ``k, v`` ``(B / g, H, S, D)`` and of ``mask``: the ``g * T``
        queries of a group are scored in one matmul against one copy of the keys."""
        B, H, T, D = q.shape
        n = B // g
        k, v = self._shared(k), self._shared(v)  # (B / g, H, S, D)
        q = q.view(n, g, H, T, D).transpose(1, 2).reshape(n, H, g * T, D)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights or not self.score.supports_sdpa or not self.training:
            y, weights = attend(self.score(q, k), mask, v, dropout_p=dropout_p)
            if need_weights:
                S = k.shape[-2]
                weights = weights.view(n, H, g, T, S).transpose(1, 2).reshape(B, H, T, S)
        else:
            weights = None
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.score.sdpa_scale
            )
        y = y.view(n, H, g, T, D).permute(0, 2, 3, 1, 4).reshape(B, T, H * D)  # (B, T, H D)
        return self.out_proj(y), weights

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        need_weights: bool = False,
        packing: Packing | None = None,
        context_packing: Packing | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` ``(B, T, C)`` to itself (or to ``context`` when ``cross``).

        Cross-attention with a ``cache``: the keys and values of ``context`` are computed on
        the first call and kept in ``cache.cross[layer]``; later calls (``context`` may then
        be None) reuse them.

        ``mask``: additive, broadcastable to ``(B, H, T, S)``. ``is_causal``: also apply the
        look-ahead mask (query ``i`` is at position ``S - T + i``). ``rotary``: ``(cos, sin)``
        for the new tokens' positions, applied to q and k (self-attention only). ``cache``:
        append this call's k, v to ``cache`` slot ``layer`` and attend over everything held
        (self-attention only; cross-attention keys do not grow). Returns ``(output (B, T, C),
        weights (B, H, T, S) or None)``; the weights are computed only when ``need_weights``
        (or the score has no fused kernel).

        ``packing``: ``x`` is packed ``(N, C)`` (see :class:`Packing`; so is ``context`` by
        ``context_packing``) and so is the output; no cache, no weights, no rotary.
        """
        if packing is not None:
            return self._packed(x, context, packing, context_packing, mask, is_causal), None
        B, T, C = x.shape
        if self.cross:
            if rotary is not None:
                raise InputError("rotary positions apply to self-attention only")
            q = self._heads(self.q_proj(x))  # (B, H, T, D)
            held = cache.cross[layer] if cache is not None else None
            if held is None:
                if context is None:
                    raise InputError("cross-attention needs a context sequence")
                held = self.context_kv(context)  # (B, H, S, D) each
                if cache is not None:
                    cache.cross[layer] = held
            k, v = held
            g = cache.cross_group if cache is not None else 1
            if g > 1:  # g consecutive rows share a source: its queries attend together
                return self._grouped(q, k, v, mask, g, need_weights)
        else:
            # (B, H, T, D), (B, Hkv, T, D) x 2; a NoPE layer's q and k are not rotated
            q, k, v = self._project(x, None if self.nope else rotary)
            if cache is not None:
                k, v = cache.append(layer, k, v)  # (B, Hkv, S, D): only Hkv heads are kept
        y, weights = self._mix(q, k, v, mask, is_causal, need_weights)
        y = y.transpose(1, 2).reshape(B, T, self.d_q)  # concatenate the heads: (B, T, H D)
        return self.out_proj(y), weights

    def _project(
        self, x: Tensor, rotary: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's q ``(B, H, T, D)``, k, v ``(B, Hkv, T, D)`` of ``x`` ``(B, T, C)``,
        q and k rotated when ``rotary`` gives ``(cos, sin)``."""
        qkv = self.qkv_proj(x)  # (B, T, H D + 2 C_kv)
        normed = self.q_norm is not None or self.k_norm is not None
        whole = rotary is not None and rotary[0].shape[-1] == self.d_head  # (not partial)
        if whole and not normed and not torch.compiler.is_compiling():
            # fast path: heads split with q, k rotated in one kernel (apply_rotary's math)
            return fused.rotary_heads(qkv, *rotary, self.n_head, self.n_kv_head)
        q, k, v = self._split_qkv(qkv)  # (B, T, H D), (B, T, C_kv) x 2
        q, k, v = self._normed(q, k, v)
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v

    def _normed(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q ``(B, T, H D)``, k, v ``(B, T, C_kv)`` -> heads ``(B, H|Hkv, T, D)``, q and k
        normalised where the layer has norms: each head's over ``D``, or all heads' at once
        (``qk_norm_all``, before the split)."""
        wide = self.qk_norm_all
        if wide and self.q_norm is not None:
            q = self.q_norm(q)
        if wide and self.k_norm is not None:
            k = self.k_norm(k)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if not wide and self.q_norm is not None:  # each head's q and k over D, before rotary
            q = self.q_norm(q)
        if not wide and self.k_norm is not None:
            k = self.k_norm(k)
        return q, k, v

    def _packed(
        self,
        x: Tensor,
        context: Tensor | None,
        packing: Packing,
        context_packing: Packing | None,
        mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        """:meth:`forward` on packed tokens ``x`` ``(N, C)`` -> ``(N, C)``: the projections
        run on the real tokens only, attention on the padded layout."""
        C = self.d_q
        if self.cross:
            if context is None or context_packing is None:
                raise InputError("packed cross-attention needs a packed context and its packing")
            q = packing.pad(self.q_proj(x))  # (B, T, H D)
            k, v = context_packing.pad(self.kv_proj(context)).split(self.d_kv, dim=-1)
        else:
            q, k, v = self._split_qkv(packing.pad(self.qkv_proj(x)))  # (B, T, C), (B, T, C_kv)
        B, T = q.shape[:2]
        q, k, v = self._normed(q, k, v)
        y, _ = self._mix(q, k, v, mask, is_causal, False)
        return self.out_proj(packing.take(y.transpose(1, 2).reshape(B, T, C)))  # (N, C)

    def _mix(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Heads ``q`` ``(B, H, T, D)``, ``k, v`` ``(B, Hkv, S, D)`` -> ``(mixed values (B, H,
        T, D), weights (B, H, T, S) or None)``: the fused kernel unless the weights are
        wanted, the score has none, or (on CPU) there is one query per row. With grouped
        query heads the fused kernel shares the key/value heads itself (``enable_gqa``); the
        explicit formula scores the ``G`` query heads of a group as ``G T`` rows against their
        one key/value head, so nothing is copied per query head."""
        T, S = q.shape[-2], k.shape[-2]
        if is_causal and T == 1:
            is_causal = False  # the newest token may see everything held
        dropout_p = self.dropout if self.training else 0.0

        explicit = need_weights or not self.score.supports_sdpa or self.sinks is not None
        if explicit or (not self.training and single_query_explicit(q)):
            if is_causal:
                mask = combine_masks(mask, causal_mask(T, S, device=q.device, dtype=q.dtype))
            G = self.groups
            if G > 1:  # the G query heads of a group are scored at once against their key head
                B, H = q.shape[:2]
                q = q.reshape(B, self.n_kv_head, G * T, q.shape[-1])  # (B, Hkv, G T, D)
                mask = self._group_mask(mask, H, T, S)
            sink = self._sink(T if G > 1 else 0)
            y, weights = attend(self.score(q, k), mask, v, dropout_p=dropout_p, sink=sink)
            if G > 1:
                y, weights = y.view(B, H, T, -1), weights.view(B, H, T, S)
        else:
            weights = None
            if is_causal and (mask is not None or T != S):  # SDPA's is_causal is top-left
                mask = combine_masks(mask, causal_mask(T, S, device=q.device, dtype=q.dtype))
                is_causal = False
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=self.score.sdpa_scale,
                enable_gqa=self.groups > 1,
            )  # (B, H, T, D)
        return y, weights
