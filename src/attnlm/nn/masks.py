"""Attention masks as additive float tensors: 0 where attention is allowed, ``-inf`` where it
is not, added to the scores before the softmax (:func:`attnlm.nn.attention.attend`).

* :func:`causal_mask`: the look-ahead mask ``(T, S)`` of a decoder (also with a KV cache,
  where the ``T`` new queries are the last ``T`` of ``S`` positions);
* :func:`padding_mask`: the key padding mask ``(B, 1, 1, S)``, broadcast over heads and
  queries;
* :func:`window_mask`: a sliding window's band, keys at most ``W - 1`` positions back
  (Mistral, Gemma's local layers), from the positions of the queries and of the keys;
* :func:`segment_mask`: causal within each of the sequences packed into a row, nothing across
  them (``(B, 1, T, T)``), and :func:`segment_positions`, each token's position in its own;
* :func:`combine_masks`: their sum, with fully masked query rows opened so the softmax stays
  finite.

Shape legend (masks broadcast over what they leave out)
    B  batch size
    T  queries (the new tokens)
    S  keys: T without a cache, cached + T with one, the source in cross-attention
    H  heads (a padding mask holds 1 there)
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def window_mask(q_pos: Tensor, k_pos: Tensor, window: int, dtype=torch.float32) -> Tensor:
    """A sliding window's additive band: query at position ``i`` may see a key at position
    ``j`` when ``i - j < window`` (the causal rule, ``j <= i``, is the causal mask's).
    ``q_pos`` ``(T,)`` or ``(B, T)``, ``k_pos`` ``(S,)`` or ``(B, S)`` (each row's own
    positions under left padding); returns ``(T, S)``, or ``(B, 1, T, S)`` when batched."""
    far = (q_pos[..., :, None] - k_pos[..., None, :]) >= window  # (T, S) or (B, T, S)
    mask = torch.zeros(far.shape, dtype=dtype, device=far.device).masked_fill(far, float("-inf"))
    return mask[:, None] if mask.dim() == 3 else mask


def segment_mask(segments: Tensor, dtype=torch.float32) -> Tensor:
    """Block-causal mask ``(B, 1, T, T)`` of packed rows: ``segments`` ``(B, T)`` numbers the
    sequences of each row; query ``i`` may see key ``j <= i`` of the same segment only."""
    T = segments.shape[-1]
    same = segments[:, :, None] == segments[:, None, :]  # (B, T, T)
    allowed = same & torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segments.device)
    return mask.masked_fill(~allowed, float("-inf"))[:, None]


def segment_positions(segments: Tensor) -> Tensor:
    """Each token's position within its own segment ``(B, T)`` (segments are contiguous)."""
    T = segments.shape[-1]
    index = torch.arange(T, device=segments.device).expand_as(segments)  # (B, T)
    new = torch.ones_like(segments, dtype=torch.bool)
    new[:, 1:] = segments[:, 1:] != segments[:, :-1]  # a segment starts here
    starts = torch.where(new, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - starts


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
