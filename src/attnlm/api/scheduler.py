"""Continuous batching: ``parallel`` slots, each with its own KV cache, served by one thread.

Each turn of the loop (1) drops the jobs whose client went away or whose time ran out,
(2) admits waiting jobs into free slots — the slot whose cache shares the longest prefix with
the job's prompt (the next turn of a chat finds its conversation there), else the one idle
longest — (3) feeds one chunk of at most ``prefill_chunk`` prompt tokens to one slot still
reading its prompt (round robin), so that a long prompt delays the others by one chunk per
step, not by its whole length, and (4) decodes one token for every slot that is generating, in
one batched step (:func:`attnlm.api.batch.batched_step`: one pass over the weights for all of
them). A job that ends frees its slot at once; the slot keeps its cache (prompt and reply) for
the next request that starts the same way.

Every row's computation is its own (its cache, its positions), so a greedy reply does not
depend on which other requests shared its steps (tested against the same request served
alone)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import torch

from attnlm.api.batch import batched_step
from attnlm.api.job import Job, Request
from attnlm.base.device import model_device
from attnlm.generate.lookahead import common_prefix, drop_newest
from attnlm.nn.cache import KVCache

log = logging.getLogger("attnlm.api")


class QueueFull(Exception):
    """More requests wait than the queue holds."""


class Closed(Exception):
    """The server is shutting down: no request is taken."""


class _Slot:
    def __init__(self) -> None:
        self.state: Any = None
        self.cached: list[int] = []  # ids whose keys and values the state holds
        self.job: Job | None = None
        self.pending: list[int] = []  # prompt ids still to feed
        self.next: int | None = None  # the token to feed in the next decode step
        self.idle_since = 0.0


class Scheduler:
    """Serves :class:`~attnlm.api.job.Request` s on ``model`` (a causal decoder with a
    decoding state) through ``runner`` (:class:`~attnlm.runtime.eager.EagerRunner`)."""

    def __init__(self, model: Any, runner: Any, parallel: int, prefill_chunk: int,
                 max_queue: int) -> None:  # fmt: skip
        self.model, self.runner = model, runner
        self.slots = [_Slot() for _ in range(parallel)]
        self.prefill_chunk, self.max_queue = prefill_chunk, max_queue
        self.waiting: deque[Job] = deque()
        self.cv = threading.Condition()
        self.stopping = False
        self.turn = 0
        self.device = model_device(model)
        self.steps = 0  # batched decode steps so far (for tests and logs)
        self.max_rows = 0  # the most rows one step has decoded
        self.thread = threading.Thread(target=self._run, name="attnlm-scheduler", daemon=True)
        self.thread.start()

    # -- the HTTP side -------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue the request's jobs (raises :class:`QueueFull`)."""
        with self.cv:
            if self.stopping:
                raise Closed
            if len(self.waiting) + len(request.jobs) > self.max_queue:
                raise QueueFull
            self.waiting.extend(request.jobs)
            self.cv.notify()

    def wake(self) -> None:
        with self.cv:
            self.cv.notify()

    def close(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout=10)

    @property
    def busy(self) -> int:
        return sum(s.job is not None for s in self.slots)

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.stopping and not self.waiting and not self.busy:
                    self.cv.wait()
                if self.stopping:
                    return
            try:
                self._turn()
            except Exception as e:  # a bug must not take the server down: fail the jobs
                log.exception("scheduler step failed")
                for s in self.slots:
                    if s.job is not None:
                        s.job.request.emit(("error", s.job.index, str(e), 0))
                        self._free(s, reset=True)

    @torch.inference_mode()
    def _turn(self) -> None:
        now = time.monotonic()
        for s in self.slots:
            job = s.job
            if job is not None and (job.request.cancelled or now > job.request.deadline):
                if not job.request.cancelled:
                    job.end("length")
                self._free(s)
        self._admit()
        self._prefill()
        self._decode()

    def _admit(self) -> None:
        while True:
            with self.cv:
                while self.waiting and self.waiting[0].request.cancelled:
                    self.waiting.popleft()
                free = [s for s in self.slots if s.job is None]
                if not self.waiting or not free:
                    return
                job = self.waiting.popleft()
            best = max(free, key=lambda s: (common_prefix(s.cached, job.prompt), -s.idle_since))
            self._place(best, job)

    def _place(self, slot: _Slot, job: Job) -> None:
        prompt = job.prompt
        keep = common_prefix(slot.cached, prompt)
        if keep == len(prompt):  # all of it held: feed the last id again for its logits
            keep -= 1
        state = slot.state
        if state is not None and keep < len(slot.cached):
            if type(state) is KVCache and state.position == state.length:
                drop_newest(state, len(slot.cached) - keep)
            else:
                state = None
        if state is None or keep == 0:
            state, keep = self.runner.new_state(None), 0
        slot.state, slot.cached = state, slot.cached[:keep]
        slot.job, slot.pending, slot.next = job, list(prompt[keep:]), None
        job.reused = keep

    def _free(self, slot: _Slot, reset: bool = False) -> None:
        slot.job, slot.pending, slot.next = None, [], None
        slot.idle_since = time.monotonic()
        if reset:
            slot.state, slot.cached = None, []

    def _prefill(self) -> None:
        reading = [s for s in self.slots if s.job is not None and s.pending]
        if not reading:
            return
        self.turn += 1
        slot = reading[self.turn % len(reading)]
        chunk, slot.pending = slot.pending[: self.prefill_chunk], slot.pending[self.prefill_chunk :]
        x = torch.tensor([chunk], device=self.device)
        logits = self.runner.last_logits(x, slot.state)[0]  # (V,)
        slot.cached += chunk
        if not slot.pending:
            self._took(slot, logits)

    def _took(self, slot: _Slot, logits: torch.Tensor) -> None:
        job = slot.job
        if job.take(logits):
            self._free(slot)
        else:
            slot.next = job.ids[-1]

    def _decode(self) -> None:
        rows = [s for s in self.slots if s.job is not None and s.next is not None]
        if not rows:
            return
        logits = batched_step(self.model, self.runner, [s.next for s in rows],
                              [s.state for s in rows])  # fmt: skip
        self.steps += 1
        self.max_rows = max(self.max_rows, len(rows))
        now = time.monotonic()
        for i, s in enumerate(rows):
            s.cached.append(s.next)
            job = s.job
            if job.take(logits[i], now):
                self._free(s)
            else:
                s.next = job.ids[-1]
