"""Training: configs, data preparation, the loop, DDP; names load on first use. Checkpoint
files live in :mod:`attnlm.loading.checkpoint` and evaluation in
:mod:`attnlm.loading.evaluation`: using a model needs no training code."""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".config": "RunSpec TrainConfig load_spec",
        ".trainer": "Trainer TrainJob",
        ".run": "train_run",
    },
)
