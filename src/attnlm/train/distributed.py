"""Multi-process training with PyTorch DDP (or FSDP2, :mod:`attnlm.train.fsdp`), launched by
``torchrun``.

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them the run is a single
process and nothing here touches ``torch.distributed``. The backend is NCCL on CUDA and gloo
otherwise. Only rank 0 logs, draws the progress bar and writes checkpoints; every rank draws the
same window starts from the shared data generator and takes its own slice, so N processes with
batch b see exactly the windows of one process with batch N*b.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnlm.base.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False  # started by torchrun (also with a single process)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> DistInfo:
    """Read torchrun's environment variables (single process when they are absent)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise ConfigError(f"bad torchrun environment variable: {e}") from None
    launched = "RANK" in os.environ and "MASTER_ADDR" in os.environ
    return DistInfo(rank=rank, world_size=world, local_rank=local, launched=launched)


def init(info: DistInfo, device_type: str, always: bool = False) -> None:
    """Join the process group (no-op for a single process unless ``always``: FSDP needs a
    group even of one process under torchrun)."""
    if not (info.enabled or (always and info.launched)) or dist.is_initialized():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    kwargs = {}
    if device_type == "cuda":
        kwargs["device_id"] = torch.device("cuda", info.local_rank)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30), **kwargs)


def shutdown(info: DistInfo) -> None:
    if (info.enabled or info.launched) and dist.is_initialized():
        dist.destroy_process_group()


def local_accum(grad_accum: int, info: DistInfo) -> int:
    """Micro-steps per optimizer step on each rank (the total divided across ranks)."""
    if grad_accum % info.world_size and grad_accum > 1:
        raise ConfigError(
            f"train.grad_accum ({grad_accum}) must be divisible by the number of processes "
            f"({info.world_size})"
        )
    return max(grad_accum // info.world_size, 1)


def mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Average a scalar tensor over ranks (identity for a single process)."""
    if not info.enabled:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / info.world_size


def total(value: float, info: DistInfo, device: torch.device) -> float:
    """Sum a number over ranks (identity for a single process)."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def from_main(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Rank 0's ``values`` on every rank (for decisions that must agree: stop, time fraction)."""
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return t.tolist()
