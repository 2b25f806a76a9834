"""Training: configs, data preparation, the loop, DDP. (Checkpoint files live in
:mod:`attnlm.checkpoint` and evaluation in :mod:`attnlm.evaluation`: using a model needs no
training code.)

Names are loaded on first use so that ``attnlm --help`` does not import torch.
"""

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
