"""Training: configs, data preparation, the loop, checkpoints, evaluation, DDP."""

from attnlm.train.config import RunSpec, TrainConfig, load_spec
from attnlm.train.evaluate import EvalResult, evaluate, evaluate_checkpoint
from attnlm.train.run import train_run

__all__ = [
    "EvalResult",
    "RunSpec",
    "TrainConfig",
    "evaluate",
    "evaluate_checkpoint",
    "load_spec",
    "train_run",
]
