"""Training: configs, data preparation, the loop, checkpoints, evaluation, DDP.

Names are loaded on first use so that ``attnlm --help`` does not import torch.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
