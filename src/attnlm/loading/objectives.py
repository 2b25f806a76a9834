"""Training objectives: token data in, batches (dicts of tensors) out.

An objective knows how to turn a split of token data into what a model family's ``forward``
takes; the trainer and evaluation never look inside a batch. Every batch holds the targets
under ``targets`` (``IGNORE_INDEX`` where nothing is predicted), so the number of targets is
known before the forward pass (the trainer normalises a whole optimizer step by it).

A :class:`BatchSource` is one split under one objective:

* ``draw(n, generator)`` takes the random choices for ``n`` examples (window starts, masking
  noise, pair indices) as a dict of tensors with leading dimension ``n``. The trainer draws for
  all micro-steps and all processes at once from one generator and slices per rank, so every
  rank consumes the same random numbers and a resumed run continues the same stream.
* ``collate(draw)`` builds the batch from such a slice.
* ``sequential(batch_size)`` walks the split so that every target is predicted exactly once
  (exact evaluation), with fixed noise where the objective needs some.
* ``chars_per_target``: characters of text each target stands for on average (for bits per
  character), or None where characters are not defined for the targets (masked LM).
* optional ``state_dict()`` / ``load_state_dict(state)``: the position of a source whose draws
  depend on the previous ones (stateful streams); saved with the trainer's state.

Objectives: :class:`CausalLM` (next token, shifted windows), :class:`CausalStream` (next
token over contiguous streams with the recurrent state carried across windows),
:class:`MaskedLM` (BERT: 15% of tokens chosen, 80% ``[MASK]``, 10% a random token, 10%
unchanged; optionally whole words),
:class:`Seq2Seq` (teacher forcing on source/target pairs).

Shapes: ``B`` batch, ``T`` window or target length, ``S`` source length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlm.base.errors import ConfigError, InputError
from attnlm.data.windows import Windows
from attnlm.loading.batches import Batch, BatchSource, count_targets
from attnlm.loading.masked import (
    MaskedLM,
    MaskedWindows,
    MaskingConfig,
    mask_tokens,
    word_start_table,
)
from attnlm.models.base import IGNORE_INDEX

__all__ = [
    "OBJECTIVES", "Batch", "BatchSource", "CausalLM", "CausalStream", "CausalWindows",
    "MaskedLM", "MaskedWindows", "MaskingConfig", "PairBatches", "Seq2Seq", "SpecialIds",
    "StreamBatches", "collate_pairs", "count_targets", "make_objective", "mask_tokens",
    "word_start_table",
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Causal LM: predict the next token


class CausalWindows(BatchSource):
    """Shifted windows of a token array: ``ids = x[i : i+T]``, ``targets = x[i+1 : i+T+1]``."""

    def __init__(
        self,
        ids: np.ndarray,
        block_size: int,
        chars_per_token: float | None,
        bos: int | None = None,
    ) -> None:
        self.windows = Windows(ids, block_size, bos)  # bos: first in every window
        self.chars_per_target = chars_per_token

    def draw(self, n: int, generator: torch.Generator) -> Batch:
        return {"starts": self.windows.sample_starts(n, generator)}

    def collate(self, draw: Batch) -> Batch:
        x, y = self.windows.batch(draw["starts"])
        return {"ids": x, "targets": y}

    def sequential(self, batch_size: int) -> Iterator[Batch]:
        for x, y in self.windows.sequential(batch_size):
            yield {"ids": x, "targets": y}

    def tokens_per_example(self) -> int:
        return self.windows.block_size


class CausalLM:
    """Next-token prediction on contiguous text (GPT, RNN and feed-forward LMs)."""

    name = "causal"
    data = "text"

    def __init__(self, tokenizer: Any = None, model_config: Any = None) -> None:
        self.block_size = int(getattr(model_config, "block_size", 0) or 0)

    def source(
        self,
        ids: np.ndarray,
        chars_per_token: float | None = None,
        block_size: int | None = None,
        bos: int | None = None,
    ) -> CausalWindows:
        """Windows of ``ids``; ``bos``: put this token first in every window and predict every
        token of the text (evaluation of a model whose tokenizer adds a BOS)."""
        block = block_size or self.block_size
        if block < 1:
            raise ConfigError("the causal objective needs model.block_size (window length)")
        return CausalWindows(ids, block, chars_per_token, bos)


# ---------------------------------------------------------------------------------------------
# Causal LM over contiguous streams (truncated BPTT with a carried state)
RESET_EVERY = 8  # windows between two zeroings of a training stream's state


class StreamBatches(BatchSource):
    """Stateful batches for truncated backpropagation through time, as in PyTorch's
    ``word_language_model`` example: the split is cut into ``N`` contiguous streams of
    equal length (``N`` = the examples of one optimizer step over all micro-steps and
    processes, fixed by the first ``draw``) and each draw takes the next window of
    ``block_size`` targets of every stream. Batches hold ``ids``/``targets`` ``(B, T)``,
    ``stream`` ``(B,)`` (the stream each row continues; the model carries its hidden state
    from the previous window) and ``reset`` ``(B,)`` (True where the state is zeroed: at a
    stream's beginning, and once every ``reset_every`` windows, staggered over the streams,
    because generation reads a prompt from a zero state: zeroed once per pass only, a model
    continued a short prompt such as "ROMEO:" with noise). Draws use no random numbers; the
    position is the source's state (:meth:`state_dict`). The trainer's slicing of a draw by
    micro-step and rank gives every micro-step and process a fixed set of streams.

    ``sample`` (quick estimates) draws independent random windows from a fresh state;
    ``sequential`` walks the split as up to ``batch_size`` contiguous evaluation streams
    (ids < 0), each carried across its windows, plus a remainder stream walked alone, so
    every target is predicted exactly once.
    """

    def __init__(self, ids: np.ndarray, block_size: int, chars_per_token: float | None,
                 reset_every: int = RESET_EVERY) -> None:  # fmt: skip
        self.windows = Windows(ids, block_size)
        self.reset_every = reset_every
        self.ids = ids
        self.block_size = self.windows.block_size
        self.chars_per_target = chars_per_token
        self.n_streams: int | None = None
        self.pos = 0

    def _rows(self, starts: list[int], t: int) -> tuple[Tensor, Tensor]:
        rows = [np.asarray(self.ids[s : s + t + 1], dtype=np.int64) for s in starts]
        xy = torch.from_numpy(np.stack(rows))  # (B, t + 1)
        return xy[:, :-1], xy[:, 1:]

    def draw(self, n: int, generator: torch.Generator) -> Batch:
        if self.n_streams is None:
            if len(self.ids) // n < 2:
                raise InputError(
                    f"text too short for {n} streams of at least 2 tokens ({len(self.ids)} tokens)"
                )
            self.n_streams = n
        elif n != self.n_streams:
            raise ConfigError(
                f"the causal-stream objective walks {self.n_streams} streams; a step asked for {n}"
            )
        length = len(self.ids) // n  # ids per stream
        t = min(self.block_size, length - 1 - self.pos)
        # stream i is zeroed at windows w with (w + i) % reset_every == 0
        periodic = (self.pos // self.block_size + torch.arange(n)) % self.reset_every == 0
        out = {
            "starts": torch.arange(n) * length + self.pos,
            "length": torch.full((n,), t, dtype=torch.long),
            "stream": torch.arange(n),
            "reset": periodic | (self.pos == 0),
        }
        self.pos += t
        if self.pos >= length - 1:  # the streams are used up: start them again
            self.pos = 0
        return out

    def collate(self, draw: Batch) -> Batch:
        x, y = self._rows(draw["starts"].tolist(), int(draw["length"][0]))
        return {"ids": x, "targets": y, "stream": draw["stream"], "reset": draw["reset"]}

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        x, y = self.windows.sample(n, generator)
        return {"ids": x, "targets": y}

    def sequential(self, batch_size: int) -> Iterator[Batch]:
        n_targets = len(self.ids) - 1
        n = max(1, min(batch_size, n_targets // self.block_size))
        per = n_targets // n  # targets per stream
        yield from self._walk(list(range(0, n * per, per)), per, first_id=0)
        rest = n_targets - n * per
        if rest:
            yield from self._walk([n * per], rest, first_id=n)

    def _walk(self, starts: list[int], per: int, first_id: int) -> Iterator[Batch]:
        stream = -1 - torch.arange(first_id, first_id + len(starts))  # evaluation streams
        for off in range(0, per, self.block_size):
            t = min(self.block_size, per - off)
            x, y = self._rows([s + off for s in starts], t)
            reset = torch.full((len(starts),), off == 0, dtype=torch.bool)
            yield {"ids": x, "targets": y, "stream": stream, "reset": reset}

    def tokens_per_example(self) -> int:
        return self.block_size

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos, "n_streams": self.n_streams}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = int(state["pos"])
        self.n_streams = None if state["n_streams"] is None else int(state["n_streams"])


class CausalStream(CausalLM):
    """Next-token prediction over contiguous streams with the model's recurrent state
    carried from window to window (recurrent LMs; :class:`StreamBatches`)."""

    name = "causal-stream"

    def source(
        self, ids: np.ndarray, chars_per_token: float | None = None, block_size: int | None = None
    ) -> StreamBatches:
        block = block_size or self.block_size
        if block < 1:
            raise ConfigError("the causal-stream objective needs model.block_size (BPTT length)")
        return StreamBatches(ids, block, chars_per_token)


# ---------------------------------------------------------------------------------------------
# Sequence to sequence with teacher forcing


@dataclass(frozen=True)
class SpecialIds:
    """Ids a sequence-to-sequence batch needs: padding, decoder start, end of sequence."""

    pad: int
    bos: int
    eos: int


def collate_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], ids: SpecialIds) -> Batch:
    """Teacher-forcing batch of (source ids, target ids) pairs, right-padded.

    ``src`` ``(B, S)`` and ``src_mask`` (True at real tokens); ``tgt_in`` ``(B, T)`` =
    ``[bos] + target``, ``targets`` ``(B, T)`` = ``target + [eos]`` with ``-100`` at padding.
    """
    if not pairs:
        raise InputError("no pairs to batch")
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs) + 1
    B = len(pairs)
    src = torch.full((B, S), ids.pad, dtype=torch.long)
    tgt_in = torch.full((B, T), ids.pad, dtype=torch.long)
    targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    for r, (s, t) in enumerate(pairs):
        if len(s) == 0:
            raise InputError(f"pair {r}: empty source")
        src[r, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        tgt_in[r, : len(t) + 1] = torch.as_tensor([ids.bos, *t], dtype=torch.long)
        targets[r, : len(t) + 1] = torch.as_tensor([*t, ids.eos], dtype=torch.long)
    src_mask = torch.zeros((B, S), dtype=torch.bool)
    for r, (s, _) in enumerate(pairs):
        src_mask[r, : len(s)] = True
    return {"src": src, "src_mask": src_mask, "tgt_in": tgt_in, "targets": targets}


class PairBatches(BatchSource):
    """Random or sequential teacher-forcing batches over a list of id pairs."""

    def __init__(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        ids: SpecialIds,
        target_chars: int | None = None,
    ) -> None:
        if not pairs:
            raise InputError("no sentence pairs in this split")
        self.pairs = list(pairs)
        self.ids = ids
        n_targets = sum(len(t) + 1 for _, t in self.pairs)  # + eos
        self.chars_per_target = None if target_chars is None else target_chars / n_targets

    def draw(self, n: int, generator: torch.Generator) -> Batch:
        return {"index": torch.randint(len(self.pairs), (n,), generator=generator)}

    def collate(self, draw: Batch) -> Batch:
        return collate_pairs([self.pairs[int(i)] for i in draw["index"]], self.ids)

    def sequential(self, batch_size: int) -> Iterator[Batch]:
        for i in range(0, len(self.pairs), batch_size):
            yield collate_pairs(self.pairs[i : i + batch_size], self.ids)

    def tokens_per_example(self) -> int:
        return max(1, round(sum(len(s) + len(t) + 1 for s, t in self.pairs) / len(self.pairs)))


class Seq2Seq:
    """Teacher forcing on (source, target) pairs (encoder-decoder families)."""

    name = "seq2seq"
    data = "pairs"

    def __init__(self, tokenizer: Any = None, model_config: Any = None) -> None:
        cfg = model_config
        self.ids = SpecialIds(
            pad=int(getattr(cfg, "pad_id", 0)),
            bos=int(getattr(cfg, "bos_id", 1)),
            eos=int(getattr(cfg, "eos_id", 2)),
        )

    def source(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        target_chars: int | None = None,
    ) -> PairBatches:
        return PairBatches(pairs, self.ids, target_chars)


OBJECTIVES: dict[str, Callable[..., Any]] = {
    "causal": CausalLM,
    "causal-stream": CausalStream,
    "masked": MaskedLM,
    "seq2seq": Seq2Seq,
}


def make_objective(name: str, tokenizer: Any = None, model_config: Any = None) -> Any:
    """The objective ``name`` (see :data:`OBJECTIVES`) for a tokenizer and model config."""
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective {name!r} (known: {', '.join(OBJECTIVES)})")
    return OBJECTIVES[name](tokenizer, model_config)
