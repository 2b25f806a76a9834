"""Training: configs, data preparation, the loop, DDP. (Checkpoint files live in
:mod:`attnlm.checkpoint` and evaluation in :mod:`attnlm.evaluation`: using a model needs no
training code.)

Names are loaded on first use so that ``attnlm --help`` does not import torch.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

_EXPORTS = {
    "RunSpec": "attnlm.train.config",
    "TrainConfig": "attnlm.train.config",
    "load_spec": "attnlm.train.config",
    "Trainer": "attnlm.train.trainer",
    "TrainJob": "attnlm.train.trainer",
    "train_run": "attnlm.train.run",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
