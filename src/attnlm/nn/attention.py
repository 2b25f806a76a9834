"""Attention: the parameter-free lecture version, score functions, masks, multi-head
attention (self and cross) with a fused fast path, and a KV cache for incremental decoding.

Attention is a soft dictionary lookup: every query scores every key, the scores become weights
with a softmax over the keys, and the output is the weighted average of the values. The parts
are kept apart so each can be read (and swapped) on its own:

* score functions ``(q, k) -> scores``: additive (Bahdanau et al., 2015), bilinear and dot
  (Luong et al., 2015), scaled dot (Vaswani et al., 2017);
* masks as additive ``-inf`` tensors: causal (look-ahead), key padding, their sum;
* :func:`attend` turns scores + mask into weights and mixes the values;
* :class:`MultiHeadAttention` holds the projections ``W_Q, W_K, W_V`` (fused) and ``W_O``.

When the weights are not requested and the score is (scaled) dot,
:class:`MultiHeadAttention` calls ``torch.nn.functional.scaled_dot_product_attention``,
which gives the same numbers (tested) without materialising the T x S weights when the
backend does not need them.

Shape legend
    B  batch size
    T  query length (the tokens being processed now)
    S  key/value length: T in plain self-attention, cached + T with a KV cache, the source
       length in cross-attention
    H  number of heads
    D  width of one head (C // H)
    C  model width (d_model, n_embd)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.errors import ConfigError, InputError

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
# Score functions: one signature, (q, k) -> scores.  q (..., T, Dq), k (..., S, Dk) -> (..., T, S)


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


# ---------------------------------------------------------------------------------------------
# Masks: additive float tensors, 0 where attention is allowed and -inf where it is not.


def causal_mask(
    t: int, s: int | None = None, *, device: torch.device | None = None, dtype=torch.float32
) -> Tensor:
    """Look-ahead mask ``(T, S)``: query ``i`` sits at position ``S - T + i`` (the last ``T``
    of ``S`` positions, as with a KV cache) and may see keys ``j <= S - T + i``."""
    s = t if s is None else s
    allowed = torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)
    return torch.zeros(t, s, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


def padding_mask(keep: Tensor, dtype=torch.float32) -> Tensor:
    """Key padding mask ``(B, 1, 1, S)`` from ``keep`` ``(B, S)`` bool (False = padding)."""
    if keep.dtype != torch.bool:
        keep = keep.bool()
    mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return mask.masked_fill(~keep, float("-inf"))[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Sum the given additive masks (broadcasting), or None if none is given.

    A query row with every key masked (a padding query under a causal mask with left padding)
    would give NaN in the softmax; such rows are opened (set to 0) instead. Their outputs are
    meaningless but finite, and nothing downstream reads them.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    total = present[0]
    for m in present[1:]:
        total = total + m
    dead = torch.isneginf(total).all(dim=-1, keepdim=True)
    return total.masked_fill(dead, 0.0)


class Packing:
    """Where the real tokens of a padded ``(B, L)`` batch sit, for running the per-token
    layers (embeddings, projections, feed-forward, norms, dropout, head) on those tokens only.

    A packed tensor is ``(N, F)``: the ``N`` positions that ``keep`` ``(B, L)`` (bool) keeps,
    in row-major order. Attention needs the padded layout, so :class:`MultiHeadAttention`
    pads its projections with :meth:`pad` and packs its output again with :meth:`take` before
    ``W_O``. The zeros it pads with are never read: padding keys are masked, and a causal
    query never sees a later position, so a row that keeps a prefix (a decoder's targets)
    needs no mask beyond the causal one. Equal to running on the padded batch at the kept
    positions (tested); the data-dependent ``N`` makes it an eager-mode path.

    (Grouping the rows by length, so that attention pads each group only to its own longest
    row, was measured and not kept: -1% to +3.5% on the built-in task, -3% to -10% on the
    Tatoeba sample, whose batches carry less padding; docs/benchmarks.md.)
    """

    def __init__(self, keep: Tensor) -> None:
        self.rows, self.length = keep.shape
        self.index = keep.reshape(-1).nonzero().squeeze(1)  # (N,) flat positions row * L + t

    @property
    def positions(self) -> Tensor:
        """Position of each packed token within its row ``(N,)``."""
        return self.index % self.length

    def take(self, x: Tensor) -> Tensor:
        """``(B, L, ...) -> (N, ...)``: the kept positions of a padded tensor."""
        return x.reshape(self.rows * self.length, *x.shape[2:]).index_select(0, self.index)

    def pad(self, x: Tensor) -> Tensor:
        """Packed ``(N, F)`` -> ``(B, L, F)`` with zeros at the positions not kept."""
        out = x.new_zeros(self.rows * self.length, x.shape[-1])
        return out.index_copy(0, self.index, x).view(self.rows, self.length, x.shape[-1])


# ---------------------------------------------------------------------------------------------
# attend: scores + mask -> weights -> weighted values


def attend(
    scores: Tensor, mask: Tensor | None, v: Tensor, *, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Softmax over keys of ``scores + mask``, then the weighted sum of ``v``.

    ``scores`` ``(..., T, S)``, ``mask`` broadcastable to it or None, ``v`` ``(..., S, Dv)``.
    Returns ``(output (..., T, Dv), weights (..., T, S))``; ``weights`` are before dropout.
    """
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)  # (..., T, S)
    mixed = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return mixed @ v, weights  # (..., T, Dv)


# ---------------------------------------------------------------------------------------------
# KV cache


class KVCache:
    """Keys and values of the tokens seen so far, per layer, for incremental decoding.

    ``keys[l]`` and ``values[l]`` are ``(B, H, T_cached, D)`` (None before the first token).
    ``length`` is how many tokens are held, ``position`` the absolute position of the next
    token (it keeps counting after :meth:`trim`). Keys are stored after rotary embedding, so a
    trimmed cache stays usable for relative schemes (RoPE, ALiBi), whose scores depend only on
    offsets. For a one-layer model, trimming equals recomputing on the last window exactly. With
    several layers it does not: the cached keys of layer 2 and up were computed from hidden
    states that saw tokens which have since left the window, so decoding with a trimmed cache
    is sliding-window attention (receptive field growing with depth, as in Longformer or
    Mistral), a close relative of the cropped recompute but not equal to it.
    """

    def __init__(self, n_layer: int) -> None:
        self.keys: list[Tensor | None] = [None] * n_layer
        self.values: list[Tensor | None] = [None] * n_layer
        # cross-attention keys/values of an encoder-decoder, computed once per source
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layer
        # rows per cross-attention entry: batch row r attends with cross[l] row r // cross_group
        # (the beams of one source share one copy of its keys/values and source mask)
        self.cross_group = 1
        self.context_mask: Tensor | None = None  # (B, 1, 1, S) additive source padding mask
        self.position = 0

    @property
    def length(self) -> int:
        """Number of tokens currently held (the same in every layer between forward calls)."""
        k = self.keys[-1]
        return 0 if k is None else k.shape[-2]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new tokens' ``k, v`` ``(B, H, T, D)`` to ``layer``; return everything held,
        ``(B, H, S, D)`` each."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=-2)
            v = torch.cat([self.values[layer], v], dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def advance(self, t: int) -> None:
        """Move ``position`` on by ``t`` tokens (the model calls this after a forward)."""
        self.position += t

    def trim(self, keep_last: int) -> None:
        """Drop the oldest entries so that at most ``keep_last`` tokens remain."""
        if keep_last < 0:
            raise InputError(f"keep_last must be >= 0, got {keep_last}")
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None and k.shape[-2] > keep_last:
                self.keys[i] = k[..., k.shape[-2] - keep_last :, :]
                self.values[i] = v[..., v.shape[-2] - keep_last :, :]

    def reorder(self, indices: Tensor) -> None:
        """Keep batch rows ``indices`` ``(B',)`` in this order (beam search: each surviving
        hypothesis takes its parent's cache). Rows may repeat; self- and cross-attention
        entries and the source mask move together."""

        def pick(t: Tensor) -> Tensor:
            return t.index_select(0, indices.to(t.device))

        self.keys = [None if k is None else pick(k) for k in self.keys]
        self.values = [None if v is None else pick(v) for v in self.values]
        self.cross = [None if c is None else (pick(c[0]), pick(c[1])) for c in self.cross]
        if self.context_mask is not None:
            self.context_mask = pick(self.context_mask)

    def reset(self) -> None:
        """Empty the cache (cross-attention entries too)."""
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)
        self.cross = [None] * len(self.cross)
        self.cross_group = 1
        self.context_mask = None
        self.position = 0

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.keys)}, length={self.length}, position={self.position})"


# ---------------------------------------------------------------------------------------------
# Multi-head attention


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs of features of ``x`` ``(B, H, T, D)`` by the angles in ``cos, sin``
    (broadcastable to ``(B, H, T, D)``); see :class:`attnlm.nn.positional.RotaryEmbedding`."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)  # "rotate half": (x1, x2) -> (-x2, x1)
    return x * cos + rotated * sin


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2).

    ``head_h = attend(score(X W_Q^h, Y W_K^h), mask, Y W_V^h)`` and the output is
    ``concat(head_1..head_H) W_O``. For self-attention ``Y = X`` and the three projections are
    one fused ``Linear(C, 3C)`` (``qkv_proj``); for cross-attention (``cross=True``) the
    queries come from ``x`` ``(B, T, C)`` and keys/values from ``context`` ``(B, S, C_ctx)``
    through ``q_proj`` and a fused ``kv_proj``. ``out_proj`` is ``W_O``.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        cross: bool = False,
        d_context: int | None = None,
        score: str = "scaled_dot",
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ConfigError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.d_model, self.n_head, self.d_head = d_model, n_head, d_model // n_head
        self.cross = cross
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_context or d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.score = make_score(score, self.d_head)
        self.dropout = dropout

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_head, self.d_head).transpose(1, 2)  # (B, H, n, D)

    def context_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of ``context`` ``(B, S, C_ctx)``, split into heads
        ``(B, H, S, D)`` each: computed once per source and reused at every decoding step."""
        k, v = self.kv_proj(context).split(self.d_model, dim=-1)  # (B, S, C) each
        return self._heads(k), self._heads(v)

    def _grouped(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, g: int, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Cross-attention of queries ``q`` ``(B, H, T, D)`` whose rows come in groups of
        ``g`` sharing one row of ``k, v`` ``(B / g, H, S, D)`` and of ``mask``: the ``g * T``
        queries of a group are scored in one matmul against one copy of the keys."""
        B, H, T, D = q.shape
        n = B // g
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
        y = y.view(n, H, g, T, D).permute(0, 2, 3, 1, 4).reshape(B, T, H * D)  # (B, T, C)
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
            q, k, v = self.qkv_proj(x).split(C, dim=-1)  # (B, T, C) each
            q, k, v = self._heads(q), self._heads(k), self._heads(v)  # (B, H, T, D)
            if rotary is not None:
                cos, sin = rotary
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            if cache is not None:
                k, v = cache.append(layer, k, v)  # (B, H, S, D)
        y, weights = self._mix(q, k, v, mask, is_causal, need_weights)
        y = y.transpose(1, 2).reshape(B, T, C)  # concatenate the heads: (B, T, C)
        return self.out_proj(y), weights

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
        C = self.d_model
        if self.cross:
            if context is None or context_packing is None:
                raise InputError("packed cross-attention needs a packed context and its packing")
            q = packing.pad(self.q_proj(x))  # (B, T, C)
            k, v = context_packing.pad(self.kv_proj(context)).split(C, dim=-1)  # (B, S, C)
        else:
            q, k, v = packing.pad(self.qkv_proj(x)).split(C, dim=-1)  # (B, T, C) each
        B, T = q.shape[:2]
        y, _ = self._mix(self._heads(q), self._heads(k), self._heads(v), mask, is_causal, False)
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
        """Heads ``q`` ``(B, H, T, D)``, ``k, v`` ``(B, H, S, D)`` -> ``(mixed values (B, H,
        T, D), weights (B, H, T, S) or None)``: the fused kernel unless the weights are
        wanted, the score has none, or (on CPU) there is one query per row."""
        T, S = q.shape[-2], k.shape[-2]
        if is_causal and T == 1:
            is_causal = False  # the newest token may see everything held
        dropout_p = self.dropout if self.training else 0.0

        # one query per row (incremental decoding): two small matmuls beat the fused kernel's
        # setup on CPU (about 1.7x at 200 rows, 40 keys, head width 16)
        single = T == 1 and not self.training and q.device.type == "cpu"
        if need_weights or not self.score.supports_sdpa or single:
            if is_causal:
                mask = combine_masks(mask, causal_mask(T, S, device=q.device, dtype=q.dtype))
            y, weights = attend(self.score(q, k), mask, v, dropout_p=dropout_p)
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
            )  # (B, H, T, D)
        return y, weights
