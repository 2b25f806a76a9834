"""RNN encoder-decoder with attention: Bahdanau (additive) and Luong (dot / general / concat).

source ids -> embedding -> bidirectional GRU/LSTM encoder -> annotations ``h_j = [→h_j; ←h_j]``
-> a GRU/LSTM decoder that attends over the annotations at every target step -> logits.

Two attention styles (``config.attention``):

* ``bahdanau`` (Bahdanau, Cho & Bengio, 2015, "Neural Machine Translation by Jointly Learning
  to Align and Translate"): the score uses the *previous* decoder state,
  ``e_ij = a(s_{i-1}, h_j)`` (additive ``vᵀ tanh(W s_{i-1} + U h_j)`` by default); the context
  ``c_i = Σ_j α_ij h_j`` is fed *into* the cell, ``s_i = RNN([E y_{i-1}; c_i], s_{i-1})``;
  the readout is ``t_i = tanh(W_r [s_i; c_i; E y_{i-1}])`` (the paper's deep output without
  maxout) and ``logits = W_o t_i``.
* ``luong`` (Luong, Pham & Manning, 2015, "Effective Approaches to Attention-based Neural
  Machine Translation", global attention): the cell runs first, ``h_t = RNN(E y_{t-1},
  h_{t-1})``; the score uses the *current* state, ``score(h_t, h̄_s)`` (``dot``,
  ``general`` = bilinear, ``concat`` = additive); the attentional hidden state is
  ``h̃_t = tanh(W_c [c_t; h_t])`` and ``logits = W_s h̃_t``. With ``input_feeding`` the cell
  input is ``[E y_{t-1}; h̃_{t-1}]`` (section 3.3).

Scores come from :func:`attnlm.nn.attention.make_score` (queries of width ``d_hidden``, keys
of width ``2 * d_enc``); source padding gets ``-inf`` before the softmax
(:func:`~attnlm.nn.attention.padding_mask`). The decoder's initial state is
``tanh(W_b [→h_S; ←h_1])`` (every decoder layer; LSTM cells start at zero).

Teacher forcing (``forward``) and incremental decoding (``new_state`` / ``step``) run the
same per-step code: a decoding state (:class:`~.rnn_seq2seq_state.RNNDecoderState`, in its
own file) holds the encoder annotations, the source mask, the decoder's hidden state and
(input feeding) the last attentional vector; its ``reorder`` moves all of them together for
beam search. Luong attention without input feeding attends once over all the steps of a call
(the cell does not depend on attention then). The recurrences are ``GRUCell``/``LSTMCell``
loops, so the training forward compiles into one graph; the backward encoder direction reads
each row's real tokens in reverse (:func:`reverse_rows`), so padding never reaches it.

The file reads in the lecture's order: the config; the recurrences; :class:`RNNSeq2Seq`'s
encoder, attention step and decoder cell, forward pass and loss, and decoding hooks. Every
name stays importable from here.

Shape legend
    B  batch size
    S  source length
    T  target (decoder) steps in this call
    E  embedding width (d_emb)
    D  decoder hidden width (d_hidden)
    K  annotation width (2 * d_enc)
    L  layers (n_layer, encoder and decoder each)
    V  target vocabulary size
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import fraction, non_negative, one_of, positive
from attnlm.models.base import (
    RECURRENT,
    DecodingSetup,
    Family,
    ModelOutput,
    check_ids,
    count_params,
    token_loss,
)
from attnlm.models.rnn_seq2seq_state import Hidden, RNNDecoderState
from attnlm.nn.attention import SCORE_ALIASES, SCORES, attend, make_score, padding_mask

# ---------------------------------------------------------------------------------------------
# Config

CELLS = ("gru", "lstm")
ATTENTIONS = ("bahdanau", "luong")
DEFAULT_SCORE = {"bahdanau": "additive", "luong": "general"}


@dataclass(frozen=True)
class RNNSeq2SeqConfig:
    """Shape and options of an :class:`RNNSeq2Seq`. Invalid values raise
    :class:`~attnlm.base.errors.ConfigError` naming the field (``model.<field>``).

    ``vocab_size`` is the *target* vocabulary (the logits' width); ``src_vocab_size`` the
    source one (None: the same, a shared tokenizer). ``pad_id``, ``bos_id``, ``eos_id`` are
    target-side ids (the ``seq2seq`` objective pads, starts and ends targets with them). All
    five come from the tokenizers: ``registry.complete_table(table, vocab_size=...,
    src_vocab_size=..., pad_id=..., bos_id=..., eos_id=...)`` with the values of
    ``PairTokenizers.target_ids`` / ``source_ids`` (``.vocab_size``, ``.pad``, ``.bos``,
    ``.eos``).
    """

    vocab_size: int
    src_vocab_size: int | None = None
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    cell: str = "gru"  # "gru" | "lstm" (encoder and decoder)
    attention: str = "bahdanau"  # "bahdanau" | "luong"
    score: str | None = None  # None: additive for bahdanau, general for luong
    input_feeding: bool = False  # luong only: feed h̃_{t-1} into the cell
    d_emb: int = 64
    d_hidden: int = 128  # decoder width
    d_enc: int | None = None  # encoder width per direction; None: d_hidden // 2
    d_attn: int | None = None  # hidden width of the additive score; None: d_hidden
    n_layer: int = 1  # layers of the encoder and of the decoder
    dropout: float = 0.0
    max_target_len: int = 128  # default length limit of greedy translation when inspecting

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "d_emb", "d_hidden", "n_layer", "max_target_len")
        positive(self, "src_vocab_size", "d_enc", "d_attn", optional=True)
        non_negative(self, "pad_id", "bos_id", "eos_id")
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(self, name) >= self.vocab_size:
                raise ConfigError(
                    f"model.{name}={getattr(self, name)} is out of range for "
                    f"model.vocab_size={self.vocab_size}"
                )
        one_of(self, "cell", CELLS)
        one_of(self, "attention", ATTENTIONS)
        if self.score is None:
            object.__setattr__(self, "score", DEFAULT_SCORE[self.attention])
        one_of(self, "score", SCORES + tuple(SCORE_ALIASES))
        if self.d_enc is None:
            if self.d_hidden % 2:
                raise ConfigError(
                    f"model.d_hidden ({self.d_hidden}) must be even when model.d_enc is not "
                    "given (the bidirectional encoder uses d_hidden // 2 per direction)"
                )
            object.__setattr__(self, "d_enc", self.d_hidden // 2)
        score = SCORE_ALIASES.get(self.score, self.score)
        if score in ("dot", "scaled_dot") and 2 * self.d_enc != self.d_hidden:
            raise ConfigError(
                f"model.score {self.score!r} needs 2 * model.d_enc == model.d_hidden, got "
                f"2 * {self.d_enc} and {self.d_hidden} (use general or additive)"
            )
        if self.input_feeding and self.attention != "luong":
            raise ConfigError(
                "model.input_feeding applies to luong attention only (bahdanau attention "
                "already feeds its context into the cell)"
            )
        if not isinstance(self.input_feeding, bool):
            raise ConfigError(
                f"model.input_feeding must be true or false, got {self.input_feeding!r}"
            )
        fraction(self, "dropout")

    @property
    def source_vocab_size(self) -> int:
        return self.src_vocab_size or self.vocab_size

    @property
    def d_key(self) -> int:
        """Width of an encoder annotation (both directions)."""
        return 2 * int(self.d_enc or 0)


# ---------------------------------------------------------------------------------------------
# The recurrences: stacked GRU/LSTM cells (encoder and decoder), row-wise reversal (the
# encoder's backward direction)


class StackedCells(nn.Module):
    """``n_layer`` GRU or LSTM cells (``torch.nn.GRUCell`` / ``LSTMCell``) stacked, run one
    time step per call: ``step(x (B, I), hidden) -> (top output (B, H), hidden)`` with
    ``hidden`` ``(L, B, H)`` (GRU) or a pair ``(h, c)`` of those (LSTM), dropout between
    layers. Cells rather than ``nn.GRU``/``nn.LSTM`` so that the whole model traces into one
    ``torch.compile`` graph (Dynamo does not trace the fused RNN modules) and the decoder's
    per-step loop pays no sequence-module overhead."""

    def __init__(self, cell: str, d_in: int, d_out: int, n_layer: int, dropout: float) -> None:
        super().__init__()
        cls = nn.GRUCell if cell == "gru" else nn.LSTMCell
        self.lstm = cell == "lstm"
        self.cells = nn.ModuleList(cls(d_in if i == 0 else d_out, d_out) for i in range(n_layer))
        self.drop = nn.Dropout(dropout)
        self.d_out = d_out

    def zeros(self, x: Tensor) -> Hidden:
        h = x.new_zeros(len(self.cells), x.shape[0], self.d_out)
        return (h, torch.zeros_like(h)) if self.lstm else h

    def step(self, x: Tensor, hidden: Hidden) -> tuple[Tensor, Hidden]:
        hs, cs = [], []
        for i, cell in enumerate(self.cells):
            if i > 0:
                x = self.drop(x)
            if isinstance(hidden, tuple):
                h, c = cell(x, (hidden[0][i], hidden[1][i]))
                cs.append(c)
            else:
                h = cell(x, hidden[i])
            hs.append(h)
            x = h
        new: Hidden = (torch.stack(hs), torch.stack(cs)) if cs else torch.stack(hs)
        return x, new

    def run(self, x: Tensor) -> Tensor:
        """Outputs ``(B, S, H)`` of the top layer over a whole sequence ``(B, S, I)`` from a
        zero state."""
        hidden = self.zeros(x)
        outs = []
        for t in range(x.shape[1]):
            out, hidden = self.step(x[:, t], hidden)
            outs.append(out)
        return torch.stack(outs, dim=1)


def reverse_rows(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse the first ``lengths[b]`` positions of each row of ``x`` ``(B, S, ...)``, leaving
    the padding after them in place (applying it twice gives ``x`` back). A backward RNN run
    on the result starts at each row's last real token, as on the unpadded row."""
    S = x.shape[1]
    t = torch.arange(S, device=x.device)[None, :]  # (1, S)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, S)
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x))


# ---------------------------------------------------------------------------------------------
# The model


class RNNSeq2Seq(nn.Module):
    """RNN encoder-decoder with Bahdanau or Luong attention (see the module docstring).

    ``forward(src (B, S), src_mask (B, S) bool, tgt_in (B, T), targets (B, T) or None,
    return_attention=False) -> ModelOutput`` with ``logits`` ``(B, T, V)`` and, when asked,
    ``cross_attentions = [weights (B, 1, T, S)]`` (one layer, one head). Sources must be
    right-padded (``src_mask`` a prefix of True per row, as ``collate_pairs`` makes them).

    Modules: ``src_emb``, ``enc_fwd`` / ``enc_bwd`` (per encoder layer, the forward and
    backward :class:`StackedCells` of one layer; layer ``l + 1`` reads both directions of
    layer ``l``), ``bridge`` (initial decoder state), ``tgt_emb``, ``decoder``
    (:class:`StackedCells`), ``score`` (from :func:`~attnlm.nn.attention.make_score`),
    ``combine`` (``W_r`` or ``W_c``), ``lm_head``.
    """

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        self.config = c = config
        D, K, E, H = c.d_hidden, c.d_key, c.d_emb, int(c.d_enc or 0)
        self.src_emb = nn.Embedding(c.source_vocab_size, E)
        self.tgt_emb = nn.Embedding(c.vocab_size, E)
        self.drop = nn.Dropout(c.dropout)
        widths = [E] + [K] * (c.n_layer - 1)  # input width of each encoder layer
        self.enc_fwd = nn.ModuleList(StackedCells(c.cell, w, H, 1, 0.0) for w in widths)
        self.enc_bwd = nn.ModuleList(StackedCells(c.cell, w, H, 1, 0.0) for w in widths)
        self.bridge = nn.Linear(K, c.n_layer * D)
        self.bahdanau = c.attention == "bahdanau"
        if self.bahdanau:
            d_in, d_combine = E + K, D + K + E  # cell input [E y; c]; readout [s; c; E y]
        else:
            d_in = E + D if c.input_feeding else E  # [E y; h̃_{t-1}] with input feeding
            d_combine = K + D  # [c; h]
        self.decoder = StackedCells(c.cell, d_in, D, c.n_layer, c.dropout)
        self.score = make_score(str(c.score), D, K, c.d_attn or D)
        self.combine = nn.Linear(d_combine, D, bias=False)
        self.lm_head = nn.Linear(D, c.vocab_size)

    # -- the encoder: annotations h_j = [→h_j; ←h_j] and the decoder's initial state --------
    def _check_source(self, src: Tensor, src_mask: Tensor, lengths: Tensor) -> None:
        if src_mask.shape != src.shape:
            raise InputError(
                f"src_mask must have the shape of src {tuple(src.shape)}, "
                f"got {tuple(src_mask.shape)}"
            )
        if torch.compiler.is_compiling():
            return  # the data-dependent checks below would break the graph
        if bool((lengths == 0).any()):
            raise InputError("every source needs at least one token (src_mask has an empty row)")
        prefix = torch.arange(src.shape[1], device=src.device)[None, :] < lengths[:, None]
        if not torch.equal(prefix, src_mask):
            raise InputError("sources must be right-padded (src_mask True then False per row)")

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> RNNDecoderState:
        """Run the encoder once: the decoding state at the start of the target."""
        c = self.config
        if src_mask is None:
            src_mask = torch.ones_like(src, dtype=torch.bool)
        src_mask = src_mask.bool()
        if src_mask.shape == src.shape:  # padding ids are never read: the objective pads
            src = src.masked_fill(~src_mask, 0)  # with the target's pad id, maybe >= S-vocab
        check_ids(src, c.source_vocab_size, "src")
        lengths = src_mask.sum(dim=1)  # (B,)
        self._check_source(src, src_mask, lengths)
        x = self.drop(self.src_emb(src))  # (B, S, E)
        for i, (fwd, bwd) in enumerate(zip(self.enc_fwd, self.enc_bwd)):
            if i > 0:
                x = self.drop(x)
            ahead = fwd.run(x)  # (B, S, d_enc): →h_j
            back = reverse_rows(bwd.run(reverse_rows(x, lengths)), lengths)  # ←h_j
            x = torch.cat([ahead, back], dim=-1)  # (B, S, K)
        memory = x * src_mask[:, :, None]  # (B, S, K), zeros at padding
        B, D, L = src.shape[0], c.d_hidden, c.n_layer
        rows = torch.arange(B, device=src.device)
        last = torch.cat([ahead[rows, lengths - 1], back[:, 0]], dim=-1)  # (B, K): →h_S, ←h_1
        h0 = torch.tanh(self.bridge(last)).view(B, L, D).transpose(0, 1).contiguous()  # (L,B,D)
        hidden: Hidden = (h0, torch.zeros_like(h0)) if c.cell == "lstm" else h0
        feed = memory.new_zeros(B, D) if c.input_feeding else None
        mask = padding_mask(src_mask, dtype=memory.dtype)[:, 0]  # (B, 1, S)
        memory = self.drop(memory)
        return RNNDecoderState(memory, self.score.prepare_keys(memory), mask, hidden, feed)

    # -- the attention step and the decoder cell ----------------------------------------
    def _attend(self, query: Tensor, state: RNNDecoderState) -> tuple[Tensor, Tensor]:
        """Context ``(B, T, K)`` and weights ``(B, T, S)`` for queries ``(B, T, D)``."""
        scores = self.score.prepared(query, state.keys)  # (B, T, S) = score(query, memory)
        return attend(scores, state.mask, state.memory)

    @staticmethod
    def _top(hidden: Hidden) -> Tensor:
        """The top layer's hidden state ``(B, 1, D)``."""
        h = hidden[0] if isinstance(hidden, tuple) else hidden
        return h[-1].unsqueeze(1)

    def _decode(self, emb: Tensor, state: RNNDecoderState) -> tuple[Tensor, Tensor]:
        """Feed target embeddings ``(B, T, E)``; returns readout vectors ``(B, T, D)`` (before
        ``lm_head``) and attention weights ``(B, T, S)``; updates ``state``."""
        T = emb.shape[1]
        outs, readouts, all_weights = [], [], []
        for t in range(T):
            e = emb[:, t]  # (B, E)
            if self.bahdanau:
                context, weights = self._attend(self._top(state.hidden), state)  # from s_{i-1}
                c_i = context[:, 0]  # (B, K)
                out, state.hidden = self.decoder.step(torch.cat([e, c_i], -1), state.hidden)
                readouts.append(torch.tanh(self.combine(torch.cat([out, c_i, e], dim=-1))))
                all_weights.append(weights)
            elif state.feed is not None:  # Luong with input feeding
                out, state.hidden = self.decoder.step(torch.cat([e, state.feed], -1), state.hidden)
                context, weights = self._attend(out[:, None], state)
                state.feed = torch.tanh(self.combine(torch.cat([context[:, 0], out], dim=-1)))
                readouts.append(state.feed)
                all_weights.append(weights)
            else:  # Luong: the cell does not depend on attention; attend once after the loop
                out, state.hidden = self.decoder.step(e, state.hidden)
                outs.append(out)
        state.length += T
        if outs:
            h = torch.stack(outs, dim=1)  # (B, T, D)
            context, weights = self._attend(h, state)  # (B, T, K), (B, T, S)
            return torch.tanh(self.combine(torch.cat([context, h], dim=-1))), weights  # h̃
        return torch.stack(readouts, dim=1), torch.cat(all_weights, dim=1)

    # -- the model and its loss (teacher forcing) -------------------------------------------
    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None,
        tgt_in: Tensor,
        targets: Tensor | None = None,
        *,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """Teacher forcing: logits ``(B, T, V)`` for decoder inputs ``tgt_in`` ``(B, T)``
        (``[bos] + target``) given ``src`` ``(B, S)`` and ``src_mask`` ``(B, S)`` (True at
        real tokens; None: no padding); the summed loss and target count when
        ``targets`` (``target + [eos]``, ``-100`` at padding) are given.
        ``return_hidden`` adds the readout vectors ``(B, T, D)`` as ``hidden_states``."""
        check_ids(tgt_in, self.config.vocab_size, "tgt_in")
        if tgt_in.shape[0] != src.shape[0]:
            raise InputError(
                f"src and tgt_in must have the same batch size, got {src.shape[0]} and "
                f"{tgt_in.shape[0]}"
            )
        state = self.encode(src, src_mask)
        readout, weights = self._decode(self.drop(self.tgt_emb(tgt_in)), state)
        logits = self.lm_head(self.drop(readout))  # (B, T, V)
        out = ModelOutput(logits=logits)
        if targets is not None:
            out.loss, out.loss_sum, out.n_targets = token_loss(logits, targets)
        if return_attention:
            out.cross_attentions = [weights.unsqueeze(1)]  # (B, 1, T, S)
        if return_hidden:
            out.hidden_states = [readout]
        return out

    # -- decoding hooks: new_state, step (beam search: RNNDecoderState.reorder) -------------
    def new_state(self, batch: dict[str, Tensor] | None) -> RNNDecoderState:
        """The decoding state for ``batch = {"src": (B, S), "src_mask": (B, S)}`` (the
        encoder runs here, once)."""
        if batch is None or "src" not in batch:
            raise InputError("an encoder-decoder needs a source batch {'src', 'src_mask'}")
        return self.encode(batch["src"], batch.get("src_mask"))

    def step(self, tokens: Tensor, state: RNNDecoderState) -> Tensor:
        """Feed target tokens ``(B, n)``; logits ``(B, n, V)`` for the token after each."""
        check_ids(tokens, self.config.vocab_size, "tokens")
        if tokens.shape[0] != state.batch_size:
            raise InputError(
                f"tokens have {tokens.shape[0]} rows but the state holds {state.batch_size}"
            )
        readout, _ = self._decode(self.drop(self.tgt_emb(tokens)), state)
        return self.lm_head(self.drop(readout))

    def source_batch(self, sources: list[list[int]]) -> dict[str, Tensor]:
        """Right-padded ``{"src": (B, S), "src_mask": (B, S)}`` of source id lists."""
        if not sources or any(len(s) == 0 for s in sources):
            raise InputError("every source needs at least one token")
        device = self.lm_head.weight.device
        S = max(len(s) for s in sources)
        src = torch.zeros(len(sources), S, dtype=torch.long)
        mask = torch.zeros(len(sources), S, dtype=torch.bool)
        for r, s in enumerate(sources):
            src[r, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[r, : len(s)] = True
        return {"src": src.to(device), "src_mask": mask.to(device)}

    def prepare_decoding(self, sources: list[list[int]]) -> DecodingSetup:
        """Start every row from ``bos_id`` conditioned on its source (see
        :class:`~attnlm.models.base.DecodingSetup`)."""
        c = self.config
        return DecodingSetup(
            prompts=[[c.bos_id] for _ in sources],
            state_batch=self.source_batch([list(s) for s in sources]),
            eos_id=c.eos_id,
            keep_prompt=True,
        )

    # -- size -------------------------------------------------------------------------------
    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (without the embeddings and output layer when asked)."""
        if not non_embedding:
            return count_params(self)
        return count_params(self, exclude=(self.src_emb, self.tgt_emb, self.lm_head))


def _describe(c: RNNSeq2SeqConfig) -> str:
    feed = ", input feeding" if c.input_feeding else ""
    return (
        f"RNN encoder-decoder, {c.cell.upper()} x{c.n_layer}, {c.attention} attention "
        f"({c.score}{feed}), d_emb={c.d_emb}, d_hidden={c.d_hidden}, d_enc={c.d_enc}x2, "
        f"vocab={c.source_vocab_size}->{c.vocab_size}"
    )


FAMILY = Family(
    "rnn-seq2seq", RNNSeq2SeqConfig, RNNSeq2Seq, "seq2seq", frozenset({"translate"}),
    description="RNN encoder-decoder with Bahdanau or Luong attention (Bahdanau et al. 2015, "
    "Luong et al. 2015)", describe=_describe, decoding=RECURRENT,
)  # fmt: skip
