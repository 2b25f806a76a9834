"""Training: configs, data preparation, the loop, checkpoints, evaluation, DDP.

Names are loaded on first use so that ``attnlm --help`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalResult": "attnlm.train.evaluate",
    "evaluate": "attnlm.train.evaluate",
    "evaluate_checkpoint": "attnlm.train.evaluate",
    "RunSpec": "attnlm.train.config",
    "TrainConfig": "attnlm.train.config",
    "load_spec": "attnlm.train.config",
    "Trainer": "attnlm.train.trainer",
    "train_run": "attnlm.train.run",
    "load_checkpoint": "attnlm.train.checkpoint",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
