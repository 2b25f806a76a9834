"""The decoding state of :class:`~attnlm.models.rnn_seq2seq.RNNSeq2Seq`: what its decoder
carries from one target step to the next for a batch of sources (one row per hypothesis).

:meth:`RNNSeq2Seq.encode <attnlm.models.rnn_seq2seq.RNNSeq2Seq.encode>` builds it (the
encoder runs once per source), ``RNNSeq2Seq.step`` advances it, and :meth:`RNNDecoderState.reorder`
is the beam-search hook of the decoding protocol (``attnlm.generate``): each surviving
hypothesis takes its parent's state, and the source annotations move with it.

Shape legend
    B  batch size (sources x hypotheses)
    S  source length
    D  decoder hidden width (d_hidden)
    K  annotation width (2 * d_enc)
    L  decoder layers (n_layer)
"""

from __future__ import annotations

from torch import Tensor

Hidden = Tensor | tuple[Tensor, Tensor]  # GRU: (L, B, D); LSTM: (h, c), each (L, B, D)


class RNNDecoderState:
    """What the decoder carries between steps for a batch of sources (one row per hypothesis).

    ``memory``: encoder annotations ``(B, S, K)`` (zeros at padding); ``keys``: the score's
    key-only part of them (``score.prepare_keys(memory)``, computed once); ``mask``: additive
    source padding mask ``(B, 1, S)`` (``-inf`` at padding); ``hidden``: the decoder's state,
    ``(L, B, D)`` (GRU) or a pair ``(h, c)`` of those (LSTM); ``feed``: the last attentional
    vector ``h̃`` ``(B, D)`` (Luong input feeding; zeros before the first step, else None);
    ``length``: target tokens fed so far. :meth:`reorder` keeps batch rows ``indices``
    (beam search: each hypothesis takes its parent's state; the annotations follow).
    """

    def __init__(
        self,
        memory: Tensor,
        keys: Tensor,
        mask: Tensor,
        hidden: Hidden,
        feed: Tensor | None = None,
    ) -> None:
        self.memory = memory
        self.keys = keys
        self.mask = mask
        self.hidden = hidden
        self.feed = feed
        self.length = 0

    @property
    def batch_size(self) -> int:
        return int(self.memory.shape[0])

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices`` ``(B',)`` in this order (rows may repeat)."""
        idx = indices.to(self.memory.device)
        self.memory = self.memory.index_select(0, idx)
        self.keys = self.keys.index_select(0, idx)
        self.mask = self.mask.index_select(0, idx)
        if isinstance(self.hidden, tuple):
            self.hidden = tuple(h.index_select(1, idx) for h in self.hidden)  # type: ignore[assignment]
        else:
            self.hidden = self.hidden.index_select(1, idx)
        if self.feed is not None:
            self.feed = self.feed.index_select(0, idx)

    def __repr__(self) -> str:
        return (
            f"RNNDecoderState(batch={self.batch_size}, source_len={self.memory.shape[1]}, "
            f"length={self.length})"
        )
