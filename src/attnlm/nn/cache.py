"""The KV cache of incremental decoding: the keys and values of the tokens seen so far, per
layer, so that each new token's attention costs one query against what is held instead of a
full recompute; for an encoder-decoder also the cross-attention keys and values of the source,
computed once per source.

Every decoding state answers the same two questions, so a model's forward has one path for
all of them: :meth:`NoCache.positions` (the positions of the ``T`` new tokens) and
:meth:`NoCache.mask` (the additive mask of their attention, or None when attention's own
causal rule is the whole mask). :class:`NoCache` is the case without a cache (a full
forward), :class:`KVCache` the dynamic cache, and
:class:`~attnlm.nn.static_cache.StaticKVCache` the static one (whose fixed mode has a mask).

Shape legend
    B         batch size (rows; beams of one source are consecutive rows)
    H         number of key/value heads (fewer than the query heads with grouped-query
              attention: the cache holds only these)
    T         tokens added by one forward call
    T_cached  tokens held before the call
    S         tokens held after it (T_cached + T); in a cross-attention entry, the source length
    D         width of one head (C // H)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlm.base.errors import InputError


class NoCache:
    """The decoding-state protocol without a cache: nothing is held (``length`` 0), the new
    tokens are the whole sequence, at positions from ``position`` (0) on."""

    position = 0
    fixed = False  # a fixed state (StaticKVCache.fix) attends over whole buffers

    @property
    def length(self) -> int:
        """Tokens held before this call."""
        return 0

    def positions(self, t: int, device: torch.device, keep: Tensor | None = None) -> Tensor:
        """Positions of the ``t`` new tokens: ``(T,)`` from ``position`` on; with ``keep``
        ``(B, S)`` bool (False at left padding, over the held tokens and the new ones),
        ``(B, T)``: each row counts its real tokens only, so a left-padded row gets the
        positions it would have alone."""
        if keep is None:
            return torch.arange(self.position, self.position + t, device=device)  # (T,)
        counted = keep.long().cumsum(-1) - 1  # (B, S): index among the row's real tokens
        return counted[:, -t:].clamp(min=0) + (self.position - self.length)  # (B, T)

    def key_positions(self, t: int, device: torch.device, keep: Tensor | None = None) -> Tensor:
        """Positions of every key the ``t`` new queries attend over (the held tokens and the
        new ones): ``(S,)``, or with ``keep`` ``(B, S)`` each row's count of its real tokens
        (as :meth:`positions`; padding keys get positions below their row's first token).
        A sliding window compares them with the queries' positions
        (:func:`~attnlm.nn.masks.window_mask`)."""
        start = self.position - self.length
        if keep is None:
            return torch.arange(start, self.position + t, device=device)  # (S,)
        return keep.long().cumsum(-1) - 1 + start  # (B, S)

    def mask(self, t: int, dtype: torch.dtype) -> Tensor | None:
        """The additive mask ``(T, S)`` of the ``t`` new queries over the keys attended, or
        None: the look-ahead (causal) rule alone, which attention applies itself (query ``i``
        sits at position ``S - T + i``) without building a ``T x S`` tensor."""
        return None

    def advance(self, t: int) -> None:
        """After a forward of ``t`` tokens (nothing to count without a cache)."""


class KVCache(NoCache):
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
        return self._held_keys()

    def _held_keys(self) -> int:
        """The keys held by the last layer (a method, not only the property, so that a
        subclass's property can use it under torch.compile, which cannot trace ``super()``
        on a property)."""
        k = self.keys[-1]
        return 0 if k is None else k.shape[-2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the self-attention keys and values (all layers; cross-attention
        entries not included): ``2 · L · B · Hkv · S · D`` elements."""
        return sum(t.nbytes for t in (*self.keys, *self.values) if t is not None)

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
        self.position += t  # an instance attribute, shadowing NoCache's class-level 0

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
