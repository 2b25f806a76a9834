"""A run's wall-clock budget (``--time-budget``), with the time its last evaluation and save
take reserved, so that a run given 300 s ends within about 300 s (the final evaluation and
checkpoint included), not 300 s plus them.

The clock starts when the process starts under ``attnlm train`` (Python's and PyTorch's
imports, reading the data and loading the model count too; :func:`count_from_process_start`),
when the run starts otherwise, and continues a resumed run's ``elapsed``. The loop's share is
the budget less the reserve, and the learning-rate schedule follows that share
(:func:`attnlm.train.optim.lr_at`), so it still ends at ``min_lr``.

The reserve is measured where it can be and estimated where it cannot:

* evaluation: the time of the last evaluation (a fine-tune evaluates its starting model before
  the first step, so the reserve is measured before any training); without one, the time of a
  training step scaled to the evaluation's batches (a step of ``micro`` batches costs a
  forward and a backward, at least two forwards: ``step_s * eval_iters / micro / 2``);
* save: the time of the last checkpoint write; without one, the bytes a checkpoint holds (the
  trained tensors and AdamW's two moments of each, float32) at 200 MB/s, plus 0.5 s; and
  0.5 s for the loss curve's PNG drawn after it (measured: 0.4 s, matplotlib's import
  included).

The loop stops when the next step would end past its share.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

SAVE_BYTES_PER_S = 200e6  # a checkpoint write's estimated speed before one is measured
SAVE_FIXED_S = 0.5
CURVE_S = 0.5  # the loss curve's PNG, drawn after the final save
#: the ``time.perf_counter()`` value at which this process started, once
#: :func:`count_from_process_start` set it (``attnlm train``); None: a run's clock starts with it
PROCESS_ORIGIN: float | None = None


def process_seconds() -> float:
    """Seconds since this process started (Linux's /proc), 0.0 where they cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = float(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime", encoding="ascii") as f:
            up = float(f.read().split()[0])
        return max(up - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def count_from_process_start() -> None:
    """Make the budgets of the runs this process starts count from the process's start."""
    global PROCESS_ORIGIN
    PROCESS_ORIGIN = time.perf_counter() - process_seconds()


def run_origin() -> float:
    """Where a new run's clock starts: the process's start when counted, else now."""
    return PROCESS_ORIGIN if PROCESS_ORIGIN is not None else time.perf_counter()


def estimated_save_s(trained_elements: int) -> float:
    """Seconds to write a checkpoint of ``trained_elements`` float32 values and their AdamW
    state, before any write was measured."""
    return SAVE_FIXED_S + 3 * 4 * trained_elements / SAVE_BYTES_PER_S


@dataclass
class Budget:
    """The clock of a run with ``seconds`` of budget (None: no budget). ``origin``: the
    ``time.perf_counter()`` value at elapsed 0 (earlier sessions included)."""

    seconds: float | None
    origin: float
    eval_iters: int = 1
    micro: int = 1
    eval_s: float | None = None  # the last evaluation's measured time
    save_s: float | None = None  # the last save's measured time
    step_s: float = 0.0  # a training step's time (smoothed)
    save_estimate: float = SAVE_FIXED_S

    def elapsed(self) -> float:
        return time.perf_counter() - self.origin

    def eval_reserve(self) -> float:
        """Seconds kept for the final evaluation: measured, else scaled from a step."""
        if self.eval_s is not None:
            return self.eval_s
        return self.step_s * self.eval_iters / max(self.micro, 1) / 2

    def save_reserve(self) -> float:
        """Seconds kept for the final save (measured, else estimated from its size) and the
        loss curve."""
        return (self.save_s if self.save_s is not None else self.save_estimate) + CURVE_S

    def reserve(self) -> float:
        """Seconds kept for the final evaluation and save (see the module docstring)."""
        return self.eval_reserve() + self.save_reserve()

    def loop_seconds(self) -> float | None:
        """The training loop's share of the budget (None without a budget)."""
        if not self.seconds:
            return None
        return max(self.seconds - self.reserve(), 1e-3)

    def fraction(self) -> float:
        """Elapsed fraction of the loop's share, counting the next step (1.0: stop)."""
        share = self.loop_seconds()
        if share is None:
            return 0.0
        return min((self.elapsed() + self.step_s) / share, 1.0)

    def took_step(self, seconds: float) -> None:
        self.step_s = seconds if not self.step_s else 0.7 * self.step_s + 0.3 * seconds

    def describe(self) -> str:
        """One line: the budget, what is reserved and how it was found."""
        how_eval = "measured" if self.eval_s is not None else "estimated"
        how_save = "measured" if self.save_s is not None else "estimated"
        ev, save = self.eval_reserve(), self.save_reserve()
        return (f"time budget {self.seconds:g} s, {self.elapsed():.1f} s spent before the "
                f"first step; {ev:.1f} s reserved for the final evaluation ({how_eval}) and "
                f"{save:.1f} s for the final save ({how_save}) and loss curve")  # fmt: skip
