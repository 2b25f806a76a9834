"""Continuous batching: ``parallel`` slots, each with its own KV cache, served by one thread.

Each turn of the loop (1) drops the jobs whose client went away or whose time ran out,
(2) runs the work handed to the thread (:meth:`Scheduler.call`: a prompt's logits for
``echo``), (3) admits waiting jobs into free slots — the slot whose cache shares the longest
prefix with the job's prompt (the next turn of a chat finds its conversation there), else the
one idle longest — (4) feeds one chunk of at most ``prefill_chunk`` prompt tokens to one slot
still reading its prompt (round robin), so that a long prompt delays the others by one chunk
per step, not by its whole length, and (5) decodes one token for every slot that is
generating, in one batched step (the stepper's ``step_rows``: one pass over the weights for
all of them). On the C engine the short prompt pieces (at most :data:`MIX_AVERAGE` ids left:
a chat's next turn, a prompt whose start is cached) of every reading slot ride in that same
pass as extra rows, so that many requests arriving at once start together; only longer ones
take (4). The model is reached through a *stepper* (:mod:`attnlm.api.steppers`: a
PyTorch model's caches, or the C engine's rows); the slots here keep the ids each one holds.
A job that ends frees its slot at once; the slot keeps its cache (prompt and reply) for the
next request that starts the same way.

Every row's computation is its own (its cache, its positions), so a greedy reply does not
depend on which other requests shared its steps (tested against the same request served
alone)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from attnlm.api.job import Job, Request
from attnlm.generate.lookahead import common_prefix

log = logging.getLogger("attnlm.api")

#: prompt ids a slot may have left to read for them to ride in the decode step's pass on a
#: stepper that ``mixes`` (each row there makes its logits: the LM head's work is wasted on all
#: but a prompt's last id, and a longer piece is cheaper in a pass of its own)
MIX_AVERAGE = 32


class QueueFull(Exception):
    """More requests wait than the queue holds."""


class Closed(Exception):
    """The server is shutting down: no request is taken."""


class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index
        self.cached: list[int] = []  # ids whose keys and values the state holds
        self.job: Job | None = None
        self.pending: list[int] = []  # prompt ids still to feed
        self.next: int | None = None  # the token to feed in the next decode step
        self.idle_since = 0.0


class Scheduler:
    """Serves :class:`~attnlm.api.job.Request` s on ``parallel`` slots of ``stepper``
    (:mod:`attnlm.api.steppers`)."""

    def __init__(self, stepper: Any, parallel: int, prefill_chunk: int, max_queue: int) -> None:
        self.stepper = stepper
        self.slots = [_Slot(i) for i in range(parallel)]
        self.prefill_chunk, self.max_queue = prefill_chunk, max_queue
        self.waiting: deque[Job] = deque()
        self.calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self.cv = threading.Condition()
        self.stopping = False
        self.turn = 0
        self.rides = 0
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

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the scheduler's thread between two steps (it may use the stepper);
        its result or exception comes in the future."""
        future: Future = Future()
        with self.cv:
            if self.stopping:
                raise Closed
            self.calls.append((fn, future))
            self.cv.notify()
        return future

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
                while not self.stopping and not self.waiting and not self.busy and not self.calls:
                    self.cv.wait()
                if self.stopping:
                    for _, future in self.calls:
                        future.set_exception(Closed())
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
        self._calls()
        self._admit()
        if getattr(self.stepper, "mixes", False):
            self._prefill(longer_than=MIX_AVERAGE)
            self._together()
        else:
            self._prefill()
            self._decode()

    def _calls(self) -> None:
        while True:
            with self.cv:
                if not self.calls:
                    return
                fn, future = self.calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as e:  # noqa: BLE001 - the caller's to report
                    future.set_exception(e)

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
        keep = self.stepper.keep(slot.index, keep, len(slot.cached))
        slot.cached = slot.cached[:keep]
        slot.job, slot.pending, slot.next = job, list(prompt[keep:]), None
        job.reused = keep

    def _free(self, slot: _Slot, reset: bool = False) -> None:
        slot.job, slot.pending, slot.next = None, [], None
        slot.idle_since = time.monotonic()
        if reset:
            slot.cached = []
            self.stepper.forget(slot.index)

    def _prefill(self, longer_than: int = 0) -> None:
        """One chunk of one slot still reading its prompt (round robin; of those with more
        than ``longer_than`` ids left)."""
        reading = [s for s in self.slots if s.job is not None and len(s.pending) > longer_than]
        if not reading:
            return
        self.turn += 1
        slot = reading[self.turn % len(reading)]
        chunk, slot.pending = slot.pending[: self.prefill_chunk], slot.pending[self.prefill_chunk :]
        reach = len(slot.cached) + len(chunk) + len(slot.pending)  # (the whole prompt's)
        logits = self.stepper.prefill(slot.index, len(slot.cached), chunk, reach)  # (V,)
        slot.cached += chunk
        if not slot.pending:
            self._took(slot, logits)

    def _took(self, slot: _Slot, logits: torch.Tensor) -> None:
        job = slot.job
        if job.take(logits):
            self._free(slot)
        else:
            slot.next = job.ids[-1]

    def _together(self) -> None:
        """The decode step with the short prompt pieces of the slots still reading (at most
        :data:`MIX_AVERAGE` ids left each; up to ``prefill_chunk`` ids in all, round robin) in
        its own pass: several rows of a slot in one call, for a stepper that ``mixes`` (the
        engine). Longer ones are read by :meth:`_prefill`, each in a pass of its own that
        makes its last row's logits alone."""
        reading = [s for s in self.slots if s.job is not None and 0 < len(s.pending) <= MIX_AVERAGE]
        rows = [s for s in self.slots if s.job is not None and s.next is not None]
        if not reading:
            return self._decode()
        self.rides += 1
        k = self.rides % len(reading)
        tokens, positions = [s.next for s in rows], [len(s.cached) for s in rows]
        where, want, picks = [s.index for s in rows], list(range(len(rows))), []
        ends = [p + 1 for p in positions]  # each sequence's reach (a prompt's: its end)
        budget = self.prefill_chunk
        for s in reading[k:] + reading[:k]:
            n = min(len(s.pending), budget)
            if n <= 0:
                break
            budget -= n
            tokens += s.pending[:n]
            positions += range(len(s.cached), len(s.cached) + n)
            ends += [len(s.cached) + len(s.pending)] * n
            where += [s.index] * n
            picks.append((s, n))
            if n == len(s.pending):  # the prompt's last id: its logits pick the first token
                want.append(len(tokens) - 1)
        logits = self.stepper.step_rows(tokens, positions, where, want, ends)  # (len(want), V)
        done = []
        for s, n in picks:
            s.cached += s.pending[:n]
            s.pending = s.pending[n:]
            if not s.pending:
                done.append(s)
        if rows:
            self._decoded(rows, logits)
        for j, s in enumerate(done):
            self._took(s, logits[len(rows) + j])

    def _decode(self) -> None:
        rows = [s for s in self.slots if s.job is not None and s.next is not None]
        if rows:
            logits = self.stepper.step_rows([s.next for s in rows], [len(s.cached) for s in rows],
                                            [s.index for s in rows])  # fmt: skip
            self._decoded(rows, logits)

    def _decoded(self, rows: list[_Slot], logits: torch.Tensor) -> None:
        """Each decode row's token taken (``logits[i]`` is ``rows[i]``'s)."""
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
