"""What the scheduler (:mod:`attnlm.api.scheduler`) steps a model through: a *stepper* holds
one decoding state per slot and offers three calls, each run on the scheduler's thread —

* ``prefill(slot, position, tokens)``: feed ``tokens`` to ``slot`` from ``position`` on (a
  position below what the slot holds cuts it back to that prefix first: prompt caching) and
  return the logits ``(V,)`` after the last of them;
* ``step_rows(tokens, positions, slots)``: one new token per row, each at its own position in
  its own slot, in one pass over the weights for all the rows: logits ``(N, V)``; a stepper
  with ``mixes`` also takes several consecutive positions of one slot in order (prompt pieces
  beside the decode rows) and ``want``, the rows whose logits it returns;
* ``keep(slot, n, held)``: how many of the ``n`` leading positions of the ``held`` a slot
  holds can be kept for a new prompt (``n``, or 0 where the state cannot be cut back).

Two implementations: :class:`TorchStepper`, a PyTorch model's KV caches stepped by
:func:`attnlm.api.batch.batched_step`; :class:`EngineStepper`, an
:class:`~attnlm.runtime.engine.Engine` (the C step on a GGUF file's own blocks) whose slots
are rows of its cache (``reset_slots`` / ``prefill`` / ``step_rows``). Logits come back as
float32 torch tensors either way (the engine's numpy arrays are wrapped, not copied), which
is what :class:`~attnlm.api.job.Job` picks from.

Shape legend
    N  rows stepped at once    V  vocabulary    T  prompt tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from attnlm.api.batch import batched_step
from attnlm.base.device import model_device
from attnlm.generate.lookahead import drop_newest
from attnlm.nn.cache import KVCache
from attnlm.nn.positional import reaching

__all__ = ["EngineStepper", "TorchStepper", "engine_rows"]

ECHO_ROWS = 64  # prompt positions per engine call for ``echo``'s logits


def engine_rows(engine: Any) -> bool:
    """Whether ``engine`` offers the per-slot calls :class:`EngineStepper` steps it by."""
    return all(hasattr(engine, n) for n in ("reset_slots", "prefill", "step_rows"))


class TorchStepper:
    """A PyTorch decoder: one :class:`~attnlm.nn.cache.KVCache` (or the model's own state)
    per slot, created on the first prefill of the slot; rows stepped by
    :func:`~attnlm.api.batch.batched_step`."""

    backend = "pytorch"
    mixes = False  # one row per slot and step

    def __init__(self, model: Any, runner: Any, slots: int) -> None:
        self.model, self.runner = model, runner
        self.device = model_device(model)
        self.states: list[Any] = [None] * slots
        self.held = [0] * slots  # positions each slot's state holds

    def keep(self, slot: int, n: int, held: int) -> int:
        s = self.states[slot]
        if n == 0 or s is None or held != self.held[slot]:
            return 0
        if n == held or (type(s) is KVCache and s.position == s.length):
            return n  # as it is, or a plain cache (cut back at will)
        return 0  # a rolling or recurrent state: started over

    def forget(self, slot: int) -> None:
        self.states[slot], self.held[slot] = None, 0

    def prefill(self, slot: int, position: int, tokens: Sequence[int],
                reach: int | None = None) -> torch.Tensor:  # fmt: skip
        """Logits ``(V,)`` after ``tokens`` from ``position`` on; ``reach``: the end of the
        prompt they are a chunk of (LongRoPE's set is the whole prompt's)."""
        s = self.states[slot]
        if s is None or position == 0:
            s = self.states[slot] = self.runner.new_state(None)
        elif self.held[slot] > position:
            drop_newest(s, self.held[slot] - position)
        x = torch.tensor([list(tokens)], device=self.device)
        self.held[slot] = position + len(tokens)
        with reaching(self.model, reach):
            return self.runner.last_logits(x, s)[0]  # (V,)

    def step_rows(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int],
                  want: Sequence[int] | None = None, ends: Sequence[int] | None = None
                  ) -> torch.Tensor:  # fmt: skip
        """Logits ``(N, V)``: one decoding row per slot (``want`` and ``ends``, the engine's,
        are those of such rows: every row's logits, each sequence reaching its row)."""
        states = [self.states[i] for i in slots]
        for i in slots:
            self.held[i] += 1
        return batched_step(self.model, self.runner, tokens, states)  # (N, V)

    def prompt_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits ``(T, V)`` float32 after each of ``ids`` (``echo`` with ``logprobs``)."""
        x = torch.tensor([list(ids)], device=self.device)
        return self.model(ids=x).logits[0].float()


class EngineStepper:
    """An :class:`~attnlm.runtime.engine.Engine` with ``slots`` cache rows of ``max_len``
    positions each, plus one more row of its own for :meth:`prompt_logits`."""

    backend = "c-engine"
    mixes = True  # a slot's consecutive positions may be several rows of one step

    def __init__(self, engine: Any, slots: int, max_len: int) -> None:
        self.engine, self.slots, self.max_len = engine, slots, max_len
        engine.reset_slots(slots + 1, max_len)

    def keep(self, slot: int, n: int, held: int) -> int:
        return n  # writing at a lower position cuts a row back

    def forget(self, slot: int) -> None:
        pass  # the next prefill at position 0 starts the row over

    def prefill(self, slot: int, position: int, tokens: Sequence[int],
                reach: int | None = None) -> torch.Tensor:  # fmt: skip
        logits = self.engine.prefill(slot, position, np.asarray(tokens, dtype=np.int64), reach)
        return torch.from_numpy(np.asarray(logits, dtype=np.float32))

    def step_rows(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int],
                  want: Sequence[int] | None = None, ends: Sequence[int] | None = None
                  ) -> torch.Tensor:  # fmt: skip
        """Logits ``(N, V)`` of the rows, or of the rows ``want`` alone; ``ends``: where each
        row's sequence reaches (a prompt's pieces: the whole prompt's end)."""
        rows = [np.asarray(a, dtype=np.int64) for a in (tokens, positions, slots)]
        picked = None if want is None else np.asarray(want, dtype=np.int64)
        reach = None if ends is None else np.asarray(ends, dtype=np.int64)
        logits = self.engine.step_rows(*rows, want=picked, ends=reach)  # the head on those rows
        return torch.from_numpy(np.asarray(logits, dtype=np.float32))

    def prompt_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits ``(T, V)`` after each of ``ids``, read into the spare row :data:`ECHO_ROWS`
        positions a call (every row's logits)."""
        spare, parts = self.slots, []
        for at in range(0, len(ids), ECHO_ROWS):
            part = list(ids[at : at + ECHO_ROWS])
            where = list(range(at, at + len(part)))
            ends = [len(ids)] * len(part)  # (the whole prompt's reach: LongRoPE's set)
            parts.append(self.step_rows(part, where, [spare] * len(part), ends=ends))
        return torch.cat(parts)
