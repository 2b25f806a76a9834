"""The static decoding state: a KV cache whose keys and values live in buffers allocated once,
``(B, H_kv, max_len, D)`` per layer, and written in place at each step's positions.

The dynamic :class:`~attnlm.nn.cache.KVCache` concatenates every held key with the new ones at
every step: ``O(S)`` copying and a fresh allocation per layer per token. Here a step writes its
``T`` new keys into the buffer (``O(T)``) and attends over a view of the filled prefix, so the
shapes of the buffers never change from the first step to the last and nothing is allocated
after the first step. ``H_kv`` is whatever the attention module stores (the number of key/value
heads, smaller than the number of query heads under grouped-query attention): the buffers take
their shape from the first keys they are given.

Two ways of attending over the buffers:

* **prefix** (the default, eager decoding): :meth:`StaticKVCache.append` returns views of the
  filled prefix ``(B, H_kv, S, D)``; the attention sees exactly what the dynamic cache would
  hold, so the tokens are the same (tested) and no mask is needed.
* **fixed** (:meth:`StaticKVCache.fix`, a compiled decode step): the write position is a
  device tensor (:attr:`StaticKVCache.cursor`), :meth:`append` returns the whole buffers
  ``(B, H_kv, max_len, D)`` and :meth:`mask` is the additive mask that hides the slots not
  written yet. Every step then has the same shapes and the same Python values, which is what
  lets one ``torch.compile(fullgraph=True)`` graph (or one CUDA graph) serve every position
  without recompiling. The caller moves the cursor after each step (:meth:`commit`).

``max_len=None`` makes the buffers grow by doubling instead (for a state whose final length is
not known up front, such as the encoder-decoder's state under beam search).

A compiled graph is specialised on every shape it sees, so lengths that vary from call to call
(a translation's buffer length, its source length) are rounded up to :func:`padded_length`, a
power of two: a handful of graphs then serve every length.

Shape legend
    B       batch size (rows)
    H_kv    key/value heads
    T       tokens added by one forward call
    S       tokens held after it
    D       width of one head
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlm.base.errors import InputError
from attnlm.nn.cache import KVCache


def padded_length(n: int, least: int = 16) -> int:
    """The bucket of a length ``n`` in a compiled step's shapes: the smallest power of two
    ``>= max(n, least)`` (at most twice ``n``, so at most twice the work on the padded axis)."""
    if n < 1:
        raise InputError(f"a length must be a positive integer, got {n}")
    return max(least, 1 << (n - 1).bit_length())


class StaticKVCache(KVCache):
    """KV cache with preallocated per-layer buffers ``k_buf[l]``, ``v_buf[l]``
    ``(B, H_kv, max_len, D)`` written in place; ``keys[l]``/``values[l]`` are views of the
    filled prefix ``(B, H_kv, S, D)``, so :attr:`length`, :meth:`trim` and code that reads
    ``keys`` see what a :class:`KVCache` would hold."""

    def __init__(self, n_layer: int, max_len: int | None) -> None:
        super().__init__(n_layer)
        if max_len is not None and max_len <= 0:
            raise InputError(f"max_len must be a positive integer, got {max_len}")
        self.max_len = max_len
        self.k_buf: list[Tensor | None] = [None] * n_layer  # (B, H_kv, capacity, D)
        self.v_buf: list[Tensor | None] = [None] * n_layer
        self.fixed = False
        self.cursor: Tensor | None = None  # fixed mode: 0-dim long, the next write position
        self._held = 0  # fixed mode: positions written (keys/values are synced by unfix)

    # -- writing ----------------------------------------------------------------------------

    def _buffers(self, layer: int, k: Tensor, end: int) -> tuple[Tensor, Tensor]:
        """The layer's buffers, allocated (or, without ``max_len``, grown) to hold ``end``
        positions of rows shaped like ``k``."""
        buf = self.k_buf[layer]
        if buf is not None and buf.shape[-2] >= end and buf.shape[0] == k.shape[0]:
            return buf, self.v_buf[layer]
        if self.max_len is not None and end > self.max_len:
            raise InputError(
                f"the static decoding state holds {self.max_len} positions; {end} needed "
                f"(trim it first, or make a larger one)"
            )
        cap = self.max_len if self.max_len is not None else max(16, 2 * end)
        B, H, _, D = k.shape
        # zeros, not garbage: fixed mode multiplies the unwritten slots by a zero weight
        new_k, new_v = k.new_zeros(B, H, cap, D), k.new_zeros(B, H, cap, D)
        held = self.keys[layer]
        if held is not None and held.shape[0] == B:  # growing: keep what is held
            new_k[:, :, : held.shape[-2]] = held
            new_v[:, :, : held.shape[-2]] = self.values[layer]
        self.k_buf[layer], self.v_buf[layer] = new_k, new_v
        return new_k, new_v

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new ``k, v`` ``(B, H_kv, T, D)`` after what ``layer`` holds; return the
        filled prefix ``(B, H_kv, S, D)`` (fixed mode: the whole buffers)."""
        if self.fixed:
            k_buf, v_buf = self.k_buf[layer], self.v_buf[layer]
            where = self.cursor + torch.arange(k.shape[-2], device=k.device)  # (T,)
            k_buf.index_copy_(2, where, k)
            v_buf.index_copy_(2, where, v)
            return k_buf, v_buf
        held = self.keys[layer]
        start = 0 if held is None else held.shape[-2]
        end = start + k.shape[-2]
        k_buf, v_buf = self._buffers(layer, k, end)
        k_buf[:, :, start:end] = k
        v_buf[:, :, start:end] = v
        self.keys[layer], self.values[layer] = k_buf[:, :, :end], v_buf[:, :, :end]
        return self.keys[layer], self.values[layer]

    def allocate(self, batch: int, n_kv_head: int, d_head: int, *, like: Tensor) -> None:
        """Allocate every layer's buffers now (dtype and device of ``like``) instead of at the
        first :meth:`append`; needs ``max_len``."""
        if self.max_len is None:
            raise InputError("allocate needs a static decoding state with max_len")
        shape = (batch, n_kv_head, self.max_len, d_head)
        for layer in range(len(self.keys)):
            if self.k_buf[layer] is None or tuple(self.k_buf[layer].shape) != shape:
                self.k_buf[layer] = like.new_zeros(shape)
                self.v_buf[layer] = like.new_zeros(shape)
            self.keys[layer] = self.k_buf[layer][:, :, :0]
            self.values[layer] = self.v_buf[layer][:, :, :0]

    # -- fixed mode (one compiled graph for every position) --------------------------------

    def fix(self) -> None:
        """Enter fixed mode at the current length: the buffers must exist (after a prefill in
        prefix mode, or :meth:`allocate`)."""
        if self.max_len is None or any(b is None for b in self.k_buf):
            raise InputError("fixed mode needs allocated buffers of a fixed max_len")
        self._held = self.length
        pos = torch.tensor(self._held, device=self.k_buf[0].device)
        if self.cursor is None:
            self.cursor = pos
        else:
            self.cursor.copy_(pos)  # the same tensor from call to call
        self.fixed = True

    def fixed_tensors(self) -> list[Tensor]:
        """Fixed mode: the tensors a compiled step reads and writes in place (on CUDA they are
        marked as static addresses for CUDA graphs)."""
        return [*self.k_buf, *self.v_buf, self.cursor]

    def positions(self, t: int, device: torch.device, keep: Tensor | None = None) -> Tensor:
        """Fixed mode: the positions ``(T,)`` of the next ``t`` tokens in the buffers (which
        are also their absolute positions: a fixed state never trims), a device tensor, so
        that every step is the same graph. Prefix mode: :meth:`KVCache.positions`."""
        if not self.fixed:
            return super().positions(t, device, keep)
        if keep is not None:
            raise InputError("a fixed decoding state takes no attention_mask")
        return self.cursor + torch.arange(t, device=self.cursor.device)

    def key_positions(self, t: int, device: torch.device, keep: Tensor | None = None) -> Tensor:
        """Fixed mode: the slots of the whole buffers ``(max_len,)``, which are the keys'
        positions (a fixed state never trims). Prefix mode: :meth:`KVCache.key_positions`."""
        if not self.fixed:
            return super().key_positions(t, device, keep)
        return torch.arange(self.max_len, device=self.cursor.device)

    def mask(self, t: int, dtype: torch.dtype) -> Tensor | None:
        """Fixed mode: the additive mask ``(T, max_len)`` of the next ``t`` queries over the
        whole buffers: 0 on the slots at or before each query's position, ``-inf`` after (not
        written yet, or in the query's future). Prefix mode: None (causal, as
        :class:`KVCache`)."""
        if not self.fixed:
            return None
        slots = torch.arange(self.max_len, device=self.cursor.device)  # (max_len,)
        hidden = slots[None, :] > self.positions(t, self.cursor.device)[:, None]  # (T, max_len)
        zero = torch.zeros((), dtype=dtype, device=self.cursor.device)
        return zero.masked_fill(hidden, float("-inf"))

    @property
    def length(self) -> int:
        return self._held if self.fixed else self._held_keys()

    def commit(self, t: int) -> None:
        """Fixed mode: record the ``t`` tokens the last step wrote (outside the compiled
        graph: the Python counters and the cursor move here; ``keys``/``values`` are brought
        up to date by :meth:`unfix`)."""
        self._held += t
        self.cursor.add_(t)
        self.position += t

    def unfix(self) -> None:
        """Back to prefix mode (the held entries stay)."""
        if self.fixed:
            self.fixed = False
            self.keys = [b[:, :, : self._held] for b in self.k_buf]
            self.values = [b[:, :, : self._held] for b in self.v_buf]

    def advance(self, t: int) -> None:
        if not self.fixed:  # fixed mode: :meth:`commit` counts, outside the compiled graph
            super().advance(t)

    # -- window and beams -------------------------------------------------------------------

    def trim(self, keep_last: int) -> None:
        """Keep the newest ``keep_last`` entries, moved to the front of the buffers."""
        if keep_last < 0:
            raise InputError(f"keep_last must be >= 0, got {keep_last}")
        self.unfix()
        held = self.length
        if held <= keep_last:
            return
        for layer, (k_buf, v_buf) in enumerate(zip(self.k_buf, self.v_buf)):
            if k_buf is None:
                continue
            # the source and destination overlap: copy through a temporary
            k_buf[:, :, :keep_last] = k_buf[:, :, held - keep_last : held].clone()
            v_buf[:, :, :keep_last] = v_buf[:, :, held - keep_last : held].clone()
            self.keys[layer] = k_buf[:, :, :keep_last]
            self.values[layer] = v_buf[:, :, :keep_last]

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices`` (beam search). With as many rows as before the buffers are
        rewritten in place; otherwise new buffers of the new batch size are made."""
        self.unfix()
        held = self.length
        self.keys = [None] * len(self.keys)  # the base class moves cross-attention entries
        self.values = [None] * len(self.values)
        super().reorder(indices)
        for layer, (k_buf, v_buf) in enumerate(zip(self.k_buf, self.v_buf)):
            if k_buf is None:
                continue
            idx = indices.to(k_buf.device)
            if len(idx) == k_buf.shape[0]:
                k_buf.copy_(k_buf.index_select(0, idx))
                v_buf.copy_(v_buf.index_select(0, idx))
            else:
                self.k_buf[layer], self.v_buf[layer] = (
                    k_buf.index_select(0, idx),
                    v_buf.index_select(0, idx),
                )
            self.keys[layer] = self.k_buf[layer][:, :, :held]
            self.values[layer] = self.v_buf[layer][:, :, :held]

    def reset(self) -> None:
        """Empty the state; the buffers are kept for the next sequence of the same shape."""
        self.fixed = False
        super().reset()

    def __repr__(self) -> str:
        return (
            f"StaticKVCache(layers={len(self.keys)}, length={self.length}, "
            f"max_len={self.max_len}, position={self.position}, fixed={self.fixed})"
        )
