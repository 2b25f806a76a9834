"""The decoding state of the encoder-decoder :class:`~attnlm.models.transformer.Transformer`:
a KV cache (:class:`~attnlm.nn.static_cache.StaticKVCache`) whose self-attention entries live
in preallocated buffers (of a fixed length, or growing by doubling), whose cross-attention
keys/values are computed once per source, and whose beam reordering copies only the rows that
move (docs/seq2seq.md).

In fixed mode (a compiled decode step, :mod:`attnlm.runtime.compiled`) the cross-attention
keys/values and the source mask are copied into buffers padded to a bucket of the source
length (:func:`~attnlm.nn.static_cache.padded_length`; the padding is masked), kept per bucket
from call to call: the compiled graph sees the same shapes for every source length of a bucket,
and the same addresses from call to call (what CUDA graphs need).

Shape legend
    B  rows (sources x beams)
    H  heads
    S  keys attended over: source tokens (cross-attention), target tokens held (self-attention)
    T  new target tokens in this call
    C  model width
    D  head width (C / H)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlm.base.errors import InputError
from attnlm.nn.masks import padding_mask
from attnlm.nn.static_cache import StaticKVCache, padded_length


class EncoderDecoderState(StaticKVCache):
    """Decoding state of the encoder-decoder: the decoder's KV cache (self-attention keys and
    values per layer in buffers written in place, :class:`StaticKVCache`; cross-attention keys
    and values computed once from the encoder output) plus the encoder output ``memory``
    ``(B, S, C)`` until the first step has turned it into the cross-attention slots, and the
    source padding mask ``context_mask`` ``(B, 1, 1, S)``. ``max_len``: buffers of that many
    target positions allocated once (the static state); None: buffers that grow by doubling."""

    def __init__(
        self, n_layer: int, memory: Tensor, context_mask: Tensor, max_len: int | None = None
    ) -> None:
        super().__init__(n_layer, max_len)
        # fixed mode: per source bucket, the padded cross-attention keys/values per layer
        # ``(B, H, S_pad, D)`` and the padded source mask ``(B, 1, 1, S_pad)``
        self._padded: dict[int, tuple[list[tuple[Tensor, Tensor]], Tensor]] = {}
        self.restart(memory, context_mask)

    def restart(self, memory: Tensor, context_mask: Tensor) -> None:
        """Empty the state and start on a new source batch (``memory`` ``(B, S, C)``, its
        additive mask ``(B, 1, 1, S)``); the buffers of the same shapes are kept and reused."""
        self.reset()
        self.memory: Tensor | None = memory
        self.context_mask = context_mask
        # the cross-attention row (of ``cross``, ``context_mask``, ``memory``) of each row:
        # row r uses cross-attention row r // cross_group
        self.rows = torch.arange(memory.shape[0], device=memory.device)

    @property
    def batch_size(self) -> int:
        """Rows decoded (sources x beams)."""
        return len(self.rows)

    def fix(self) -> None:
        """Enter fixed mode (see :meth:`StaticKVCache.fix`): after the first step, which made
        the cross-attention keys/values; they move into the padded buffers of their bucket."""
        if self.cross_group != 1 or any(c is None for c in self.cross):
            raise InputError(
                "fixed mode needs one row per source and the cross-attention keys/values of a "
                "first step"
            )
        super().fix()
        S = self.context_mask.shape[-1]
        cap = padded_length(S)
        kv, mask = self._padded.get(cap, (None, None))
        if kv is not None and kv[0][0] is self.cross[0][0]:
            return  # already padded (fixed again after an uncompiled step)
        B = self.context_mask.shape[0]
        if kv is None or mask.shape[0] != B:
            kv = [(k.new_zeros(*k.shape[:2], cap, k.shape[-1]),
                   v.new_zeros(*v.shape[:2], cap, v.shape[-1])) for k, v in self.cross]  # fmt: skip
            mask = self.context_mask.new_zeros(B, 1, 1, cap)
            self._padded[cap] = kv, mask
        for layer, (k, v) in enumerate(self.cross):
            # slots S.. may hold an earlier source's keys: finite and masked, weight exactly 0
            kv[layer][0][:, :, :S] = k
            kv[layer][1][:, :, :S] = v
            self.cross[layer] = kv[layer]
        keep = torch.zeros(B, cap, dtype=torch.bool, device=mask.device)
        keep[:, :S] = self.context_mask[:, 0, 0, :] == 0
        mask.copy_(padding_mask(keep, mask.dtype))
        self.context_mask = mask

    def fixed_tensors(self) -> list[Tensor]:
        """Fixed mode: the self-attention buffers and cursor, the padded cross-attention
        keys/values and source mask."""
        cross = [t for kv in self.cross for t in kv]
        return [*super().fixed_tensors(), *cross, self.context_mask]

    def trim(self, keep_last: int) -> None:
        raise InputError("an encoder-decoder's decoding state has no window to trim")

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices``. The self-attention entries of a row that keeps its own place
        (``indices[r] == r``, as most beams do from step to step) stay where they are: only
        the rows that take another row's entries are copied, in place. The cross-attention
        keys/values of a row depend only on its source, so they are kept once per source row
        (``cross_group`` consecutive rows share one, as the beams of a source do) and never
        copied when rows only change places among the rows of their source."""
        self.unfix()
        indices = indices.to(self.rows.device)
        n = len(indices)
        rows = self.rows.index_select(0, indices)
        same_rows = n == len(self.rows)
        for layer in range(len(self.keys)):  # self-attention entries
            k, v = self.keys[layer], self.values[layer]
            if k is None:
                continue
            if same_rows:
                moved = (indices != torch.arange(n, device=indices.device)).nonzero()[:, 0]
                if len(moved):  # gather first: a source row may itself be overwritten
                    src = indices.index_select(0, moved)
                    k.index_copy_(0, moved, k.index_select(0, src))
                    v.index_copy_(0, moved, v.index_select(0, src))
                continue
            new_k = k.new_empty(n, *self.k_buf[layer].shape[1:])
            new_v = v.new_empty(new_k.shape)
            torch.index_select(k, 0, indices, out=new_k[:, :, : k.shape[-2]])
            torch.index_select(v, 0, indices, out=new_v[:, :, : v.shape[-2]])
            self.k_buf[layer], self.v_buf[layer] = new_k, new_v
            self.keys[layer], self.values[layer] = (
                new_k[:, :, : k.shape[-2]],
                new_v[:, :, : v.shape[-2]],
            )
        if same_rows and torch.equal(rows, self.rows):
            return
        # rows = the cross-attention row of each new row; group runs of equal rows
        g = int((rows == rows[0]).sum())
        if n % g == 0 and bool((rows.view(-1, g) == rows.view(-1, g)[:, :1]).all()):
            pick = rows.view(-1, g)[:, 0]  # one cross-attention row per group of g rows
        else:
            g, pick = 1, rows
        n_cross = self.context_mask.shape[0]
        if len(pick) != n_cross or not torch.equal(pick, torch.arange(n_cross, device=pick.device)):
            self.cross = [None if c is None else (c[0].index_select(0, pick),
                          c[1].index_select(0, pick)) for c in self.cross]  # fmt: skip
            self.context_mask = self.context_mask.index_select(0, pick)
            if self.memory is not None:
                self.memory = self.memory.index_select(0, pick)
        self.cross_group = g
        self.rows = torch.arange(len(pick), device=pick.device).repeat_interleave(g)
