"""Recurrent language models: Elman RNN, LSTM (Hochreiter & Schmidhuber, 1997) and GRU
(Cho et al., 2014) cells, stacked, with dropout and tied input/output embeddings (Press &
Wolf, 2017; Inan et al., 2017), trained with truncated backpropagation through time.

token ids -> embedding -> dropout -> L recurrent layers (dropout between them) -> dropout ->
linear head (tied to the embedding when ``tie_embeddings``) -> logits.

Stateful training (the ``causal-stream`` objective, :mod:`attnlm.loading.objectives`): a batch may
carry ``stream`` ``(B,)`` (which contiguous stream each row continues) and ``reset`` ``(B,)``
(True where the stream starts again). The model then starts each row from the final hidden
state it kept for that stream after the previous window (zeros where ``reset``) and keeps
the new final state, detached, for the next window: truncated BPTT over contiguous streams as
in PyTorch's ``word_language_model`` example. Stream ids >= 0 are training streams (their
states are saved in checkpoints through :meth:`RNNLM.carry_state`); ids < 0 are evaluation
streams, kept apart so an evaluation never disturbs training.

Decoding state: :class:`RNNState` holds each layer's hidden (and LSTM cell) state; each new
token costs O(1), whatever the length of the context (its family's ``Decoding(window=False)``).

Shape legend
    B  batch size
    T  tokens in this call
    L  layers
    E  embedding width (n_embd)
    H  hidden width (n_hidden)
    V  vocabulary size
    N  carried training streams
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import fraction, one_of, positive
from attnlm.models.base import (
    RECURRENT,
    Family,
    ModelOutput,
    check_ids,
    check_targets,
    count_params,
    token_loss,
)

CELLS = ("rnn", "lstm", "gru")


@dataclass(frozen=True)
class RNNConfig:
    """Shape and options of an :class:`RNNLM`. ``block_size`` is the BPTT length (targets
    per training window). ``n_hidden`` None means ``n_embd``; tied embeddings need
    ``n_hidden == n_embd``."""

    vocab_size: int
    block_size: int = 64
    cell: str = "lstm"  # "rnn" (tanh Elman) | "lstm" | "gru"
    n_layer: int = 2
    n_embd: int = 256
    n_hidden: int | None = None
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "block_size", "n_layer", "n_embd")
        positive(self, "n_hidden", optional=True)
        one_of(self, "cell", CELLS)
        fraction(self, "dropout")
        if self.tie_embeddings and self.hidden != self.n_embd:
            raise ConfigError(
                f"model.tie_embeddings needs model.n_hidden == model.n_embd "
                f"({self.hidden} != {self.n_embd})"
            )

    @property
    def hidden(self) -> int:
        return self.n_hidden or self.n_embd


_GATES = {"rnn": 1, "lstm": 4, "gru": 3}
_FUSED = {"rnn": torch._VF.rnn_tanh, "lstm": torch._VF.lstm, "gru": torch._VF.gru}
_CELLS = {"rnn": torch._VF.rnn_tanh_cell, "lstm": torch._VF.lstm_cell, "gru": torch._VF.gru_cell}


class Recurrent(nn.Module):
    """One recurrent layer, time-major: ``layer(x (T, B, E), h0)`` -> ``(out (T, B, H),
    h_n)``, ``h0``/``h_n`` ``(1, B, H)`` (a pair for an LSTM; ``h0`` None: zeros).

    The parameters, their names (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
    ``bias_hh_l0``), gate order and initialisation are those of ``nn.RNN``/``nn.LSTM``/
    ``nn.GRU`` with one layer, and eager mode runs the same fused kernel. Under
    ``torch.compile`` the layer runs as a loop of single-step cells over the same weights
    instead: Dynamo traces the cells into the graph but refuses the fused RNN modules, so
    the model compiles without graph breaks (equal to the fused kernel, tested)."""

    def __init__(self, cell: str, d_in: int, hidden: int) -> None:
        super().__init__()
        self.cell, self.hidden_size = cell, hidden
        g = _GATES[cell] * hidden
        self.weight_ih_l0 = nn.Parameter(torch.empty(g, d_in))
        self.weight_hh_l0 = nn.Parameter(torch.empty(g, hidden))
        self.bias_ih_l0 = nn.Parameter(torch.empty(g))
        self.bias_hh_l0 = nn.Parameter(torch.empty(g))
        bound = hidden**-0.5
        for w in self.parameters():
            nn.init.uniform_(w, -bound, bound)

    def weights(self) -> list[Tensor]:
        return [self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0]

    def forward(self, x: Tensor, h0: Any = None) -> tuple[Tensor, Any]:
        lstm = self.cell == "lstm"
        if h0 is None:
            zero = x.new_zeros(1, x.shape[1], self.hidden_size)
            h0 = (zero, zero) if lstm else zero
        if torch.compiler.is_compiling():
            return self._cell_loop(x, h0)
        out = _FUSED[self.cell](x, h0, self.weights(), True, 1, 0.0, self.training, False, False)
        return out[0], ((out[1], out[2]) if lstm else out[1])

    def _cell_loop(self, x: Tensor, h0: Any) -> tuple[Tensor, Any]:
        lstm = self.cell == "lstm"
        step, w = _CELLS[self.cell], self.weights()
        h: Any = (h0[0][0], h0[1][0]) if lstm else h0[0]
        outs = []
        for t in range(x.shape[0]):
            h = step(x[t], h, *w)
            outs.append(h[0] if lstm else h)
        final = (h[0].unsqueeze(0), h[1].unsqueeze(0)) if lstm else h.unsqueeze(0)
        return torch.stack(outs), final


class RNNState:
    """Decoding state of an :class:`RNNLM`: ``h`` (and ``c`` for an LSTM), one ``(B, H)``
    tensor per layer stacked as ``(L, B, H)``; None before the first token (zeros).
    ``length``: tokens fed so far."""

    def __init__(self, lstm: bool) -> None:
        self.lstm = lstm
        self.h: Tensor | None = None
        self.c: Tensor | None = None
        self.length = 0

    def get(self) -> Any:
        if self.h is None:
            return None
        return (self.h, self.c) if self.lstm else self.h

    def set(self, hidden: Any) -> None:
        if self.lstm:
            self.h, self.c = hidden
        else:
            self.h = hidden

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices`` (beam search: each hypothesis takes its parent's state)."""
        if self.h is not None:
            self.h = self.h.index_select(1, indices.to(self.h.device))
        if self.c is not None:
            self.c = self.c.index_select(1, indices.to(self.c.device))

    def trim(self, n: int) -> None:
        """Nothing to drop: a recurrent state has no window (kept for the protocol)."""


class RNNLM(nn.Module):
    """A stacked RNN/LSTM/GRU language model (see the module docstring)."""

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        self.config = c = config
        h = c.hidden
        self.embed = nn.Embedding(c.vocab_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout) if c.dropout > 0 else nn.Identity()
        # one module per layer so hidden states per layer can be returned; dropout between
        # layers is self.drop (nn.LSTM's inter-layer dropout does the same). The layers run
        # time-major, (T, B, .), the layout of the fused CPU/GPU kernels.
        self.layers = nn.ModuleList(
            Recurrent(c.cell, c.n_embd if i == 0 else h, h) for i in range(c.n_layer)
        )
        self.head = nn.Linear(h, c.vocab_size)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        nn.init.zeros_(self.head.bias)
        if not c.tie_embeddings:
            nn.init.uniform_(self.head.weight, -0.1, 0.1)
        self._carry: dict[str, list[Tensor]] = {}  # pool -> [h (L, N, H), c (L, N, H)]

    @property
    def lstm(self) -> bool:
        return self.config.cell == "lstm"

    # -- the recurrence ------------------------------------------------------------------------
    def _run(self, x: Tensor, hidden: Any, return_hidden: bool) -> tuple[Tensor, Any, list[Tensor]]:
        """Run the layers over ``x`` ``(T, B, E)`` from ``hidden`` (None: zeros); returns the
        top output ``(T, B, H)``, the final state (``(L, B, H)``, a pair for an LSTM) and
        the per-layer outputs when asked.

        Without ``return_hidden`` (training, evaluation, decoding) in eager mode, all layers
        run in one call of the fused multi-layer kernel, as one ``nn.LSTM(num_layers=L)``
        runs them: the same per-layer kernels and the same numbers (tested), with the
        inter-layer dropout applied by the kernel where ``self.drop`` would apply it."""
        if not return_hidden and not torch.compiler.is_compiling():
            out, final = self._run_fused(x, hidden)
            return out, final, []
        outs: list[Tensor] = [x] if return_hidden else []
        finals_h, finals_c = [], []
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = self.drop(x)
            if hidden is None:
                h0 = None
            elif self.lstm:
                h0 = (hidden[0][i : i + 1].contiguous(), hidden[1][i : i + 1].contiguous())
            else:
                h0 = hidden[i : i + 1].contiguous()
            x, hn = layer(x, h0)
            if self.lstm:
                finals_h.append(hn[0])
                finals_c.append(hn[1])
            else:
                finals_h.append(hn)
            if return_hidden:
                outs.append(x)
        final: Any = torch.cat(finals_h, 0)
        if self.lstm:
            final = (final, torch.cat(finals_c, 0))
        return x, final, outs

    def _run_fused(self, x: Tensor, hidden: Any) -> tuple[Tensor, Any]:
        """All layers in one fused kernel call (see :meth:`_run`)."""
        c = self.config
        if hidden is None:
            zero = x.new_zeros(c.n_layer, x.shape[1], c.hidden)
            hidden = (zero, zero) if self.lstm else zero
        weights = [w for layer in self.layers for w in layer.weights()]
        p = float(c.dropout)
        out = _FUSED[c.cell](x, hidden, weights, True, c.n_layer, p, self.training, False, False)
        return out[0], ((out[1], out[2]) if self.lstm else out[1])

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        stream: Tensor | None = None,
        reset: Tensor | None = None,
        state: RNNState | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """Logits ``(B, T, V)`` for ``ids`` ``(B, T)`` and the loss against ``targets``.

        ``stream``/``reset`` ``(B,)``: continue carried streams (stateful training and exact
        evaluation, see the module docstring). ``state``: an :class:`RNNState` to start from
        and update in place (decoding). Without either, every row starts from zeros.
        ``return_hidden``: the embedding output and each layer's output, ``L + 1`` tensors.
        A recurrent model has no attention (``attentions`` stays None).
        """
        check_ids(ids, self.config.vocab_size)
        if stream is not None and state is not None:
            raise InputError("pass either stream (stateful training) or state (decoding)")
        hidden = None
        if stream is not None:
            hidden, where = self._carry_load(stream, reset, ids.shape[0])
        elif state is not None:
            hidden = state.get()
        x = self.drop(self.embed(ids.t()))  # (T, B, E): time-major inside
        out, final, outs = self._run(x, hidden, return_hidden)
        if stream is not None:
            self._carry_store(where, final)
        elif state is not None:
            state.set(final)
            state.length += ids.shape[1]
        logits = self.head(self.drop(out))  # (T, B, V)
        loss = loss_sum = n_targets = None
        if targets is not None:
            check_targets(targets, ids)
            loss, loss_sum, n_targets = token_loss(logits, targets.t())
        return ModelOutput(
            logits=logits.transpose(0, 1),  # (B, T, V)
            loss=loss,
            loss_sum=loss_sum,
            n_targets=n_targets,
            hidden_states=[o.transpose(0, 1) for o in outs] if return_hidden else None,
        )

    # -- carried state of stateful batches ----------------------------------------------------
    def _pool(self, stream: Tensor) -> tuple[str, Tensor, int, bool]:
        """The pool of a batch's streams (training >= 0, evaluation < 0), their rows in it,
        the rows the pool needs and whether the rows are ``0 .. B-1`` in order (the whole
        pool when it has ``B`` rows: the trainer's batches). One host read."""
        values = stream.tolist()
        lo, hi = min(values), max(values)
        if lo >= 0:
            return "train", stream, hi + 1, lo == 0 and values == list(range(len(values)))
        if hi < 0:
            in_order = hi == -1 and values == list(range(-1, -1 - len(values), -1))
            return "eval", -1 - stream, -lo, in_order
        raise InputError("a batch mixes training (>= 0) and evaluation (< 0) stream ids")

    def _carry_load(self, stream: Tensor, reset: Tensor | None, batch: int) -> tuple[Any, tuple]:
        """The batch's starting state and what :meth:`_carry_store` needs (its pool)."""
        if stream.shape != (batch,):
            raise InputError(f"stream must have shape ({batch},), got {tuple(stream.shape)}")
        pool, index, need, in_order = self._pool(stream)
        c = self.config
        w = self.embed.weight
        store = self._carry.get(pool)
        if store is None or store[0].shape[1] < need or store[0].device != w.device:
            new = [torch.zeros(c.n_layer, need, c.hidden, device=w.device, dtype=torch.float32)
                   for _ in range(2 if self.lstm else 1)]  # fmt: skip
            if store is not None:
                n = min(store[0].shape[1], need)
                for a, b in zip(new, store):
                    a[:, :n] = b[:, :n].to(a.device)
            self._carry[pool] = store = new
        # fast path: the batch is the whole pool in order, so the stored tensors are the
        # state as they are (no gather; _carry_store then replaces them, no scatter)
        whole = in_order and store[0].shape[1] == batch
        parts = list(store) if whole else [s.index_select(1, index) for s in store]  # (L, B, H)
        if reset is not None and bool(reset.any()):
            keep = (~reset.bool()).to(w.device).view(1, -1, 1)
            parts = [p * keep for p in parts]
        if w.dtype != torch.float32:
            parts = [p.to(w.dtype) for p in parts]
        return (tuple(parts) if self.lstm else parts[0]), (pool, index, whole)

    def _carry_store(self, where: tuple, final: Any) -> None:
        pool, index, whole = where
        parts = [p.detach().float() for p in (final if self.lstm else [final])]
        store = self._carry[pool]
        for i, p in enumerate(parts):
            # never in place: the stored tensors may be a saved input of a live graph (the
            # fast path hands them to the kernel as they are)
            store[i] = p if whole else store[i].index_copy(1, index, p)

    def carry_state(self) -> dict[str, Tensor]:
        """The hidden states carried across training windows (``h``, and ``c`` for an LSTM,
        ``(L, N, H)`` each), for checkpoints; empty before stateful training."""
        store = self._carry.get("train")
        if store is None:
            return {}
        return {k: v.detach().cpu().clone() for k, v in zip(("h", "c"), store)}

    def load_carry_state(self, state: dict[str, Tensor]) -> None:
        """Restore what :meth:`carry_state` returned (resume continues the same streams)."""
        self._carry.pop("train", None)
        if state:
            dev = self.embed.weight.device
            self._carry["train"] = [state[k].to(dev) for k in ("h", "c") if k in state]

    def reset_carry(self) -> None:
        """Forget every carried stream state."""
        self._carry.clear()

    # -- decoding state ---------------------------------------------------------------------------
    def new_state(self, batch: dict[str, Tensor] | None = None) -> RNNState:
        """An empty decoding state (zeros before the first token)."""
        return RNNState(self.lstm)

    def step(self, tokens: Tensor, state: RNNState) -> Tensor:
        """Feed ``tokens`` ``(B, n)`` after what ``state`` holds; logits ``(B, n, V)``."""
        return self(tokens, state=state).logits

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters (a tied matrix counted once); ``non_embedding`` leaves out
        the input embedding."""
        return count_params(self, exclude=(self.embed,) if non_embedding else ())


def _describe(c: RNNConfig) -> str:
    return (
        f"{c.cell.upper()} LM, L={c.n_layer}, emb={c.n_embd}, hidden={c.hidden}, "
        f"vocab={c.vocab_size}, BPTT={c.block_size}, tied={'yes' if c.tie_embeddings else 'no'}"
    )


FAMILY = Family(
    "rnn", RNNConfig, RNNLM, "causal-stream", frozenset({"generate"}), describe=_describe,
    description="recurrent LM: Elman RNN, LSTM or GRU, truncated BPTT over carried streams",
    decoding=RECURRENT,
)  # fmt: skip
