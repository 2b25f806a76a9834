"""Packed tokens: the real (non-padding) positions of a padded ``(B, L)`` batch as one
``(N, F)`` tensor, so the per-token layers of a transformer skip the padding.

Shape legend
    B  batch size (rows)
    L  padded row length
    N  kept (real) tokens in the whole batch
    F  feature width
"""

from __future__ import annotations

from torch import Tensor


class Packing:
    """Where the real tokens of a padded ``(B, L)`` batch sit, for running the per-token
    layers (embeddings, projections, feed-forward, norms, dropout, head) on those tokens only.

    A packed tensor is ``(N, F)``: the ``N`` positions that ``keep`` ``(B, L)`` (bool) keeps,
    in row-major order. Attention needs the padded layout, so
    :class:`~attnlm.nn.attention.MultiHeadAttention` pads its projections with :meth:`pad` and
    packs its output again with :meth:`take` before ``W_O``. The zeros it pads with are never
    read: padding keys are masked, and a causal query never sees a later position, so a row
    that keeps a prefix (a decoder's targets) needs no mask beyond the causal one. Equal to
    running on the padded batch at the kept positions (tested); the data-dependent ``N`` makes
    it an eager-mode path.

    (Grouping the rows by length, so that attention pads each group only to its own longest
    row, was measured and not kept: its extra kernel calls cost as much as the padding saved.)
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
