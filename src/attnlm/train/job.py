"""What one training loop is given and gives back: the job (:class:`TrainJob`), the state a
checkpoint continues from (:class:`TrainState`), the result (:class:`TrainResult`), the
``metrics.jsonl`` log (:class:`MetricsLog`) and the error that stops a run
(:class:`TrainingError`). The loop itself is :class:`attnlm.train.trainer.Trainer`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlm.base.errors import AttnlmError
from attnlm.base.fileio import append_line, atomic_write_text
from attnlm.loading.evaluation import EvalResult
from attnlm.loading.objectives import BatchSource
from attnlm.train import distributed as D
from attnlm.train.config import TrainConfig


class TrainingError(AttnlmError):
    """Training cannot go on (e.g. the loss became NaN); the message names the last checkpoint."""


@dataclass
class TrainState:
    """What a checkpoint needs beyond the weights to continue exactly where it stopped."""

    step: int = 0
    elapsed: float = 0.0  # seconds of training so far, over all sessions
    best_val: float = math.inf
    bad_evals: int = 0  # evaluations since the best one (early stopping)
    tokens: int = 0
    # the time budget (seconds) that stopped the run, its final evaluation and save reserved
    # (attnlm.train.budget); 0: not stopped by one
    budget_stop: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainResult:
    step: int
    stop_reason: str
    elapsed: float
    tokens_per_s: float
    last_eval: EvalResult | None
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    first_eval: EvalResult | None = None  # a fine-tune's starting model, before any step


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line; rank 0 only.

    Starting (and the resume trim to ``keep_until``) replaces the file atomically
    (:mod:`attnlm.base.fileio`): a kill there leaves the old log whole. Records are then appended
    one line at a time; a kill mid-append cuts at most the last line, which a resume skips."""

    def __init__(self, path: Path, enabled: bool, keep_until: int | None) -> None:
        self.path = path
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []
        if enabled and keep_until is not None and path.is_file():
            kept = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if rec.get("step", 0) <= keep_until:
                    kept.append(rec)
            self.records = kept
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        elif enabled:
            atomic_write_text(path, "")

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.records.append(record)
        append_line(self.path, json.dumps(record))


@dataclass
class TrainJob:
    """Everything one training loop needs: the model and its optimizer, the settings, the
    training and validation batch sources of the objective, where and what to save, and the
    device. ``on_step(step)`` is called after every optimizer step (progress hooks, tests
    that interrupt a run); ``data_gen`` is the generator of the training batches' random
    choices (seeded from ``config.seed`` when None); ``fit_step(windows) -> (loss, tokens)``
    replaces the gradient step for models fitted in closed form (module docstring)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    config: TrainConfig
    train: BatchSource
    val: BatchSource
    run_dir: Path
    checkpoint_config: dict[str, Any]
    tokenizer: Any
    device: torch.device
    dist: D.DistInfo = field(default_factory=D.DistInfo)
    data_gen: torch.Generator | None = None
    log: Callable[..., Any] = print
    on_step: Callable[[int], Any] | None = None
    fit_step: Callable[[Any], tuple[float, int]] | None = None
    # time.perf_counter() when the run started (its data and model setup count in the time
    # budget, attnlm.train.budget); None: when the loop starts
    started: float | None = None
