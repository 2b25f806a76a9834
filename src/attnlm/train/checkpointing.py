"""Gradient checkpointing when memory binds: ``train.grad_checkpoint`` (``--grad-checkpoint``).

With it on, the blocks of a decoder keep only their inputs during the forward and compute
their insides again in the backward (``torch.utils.checkpoint``, non-reentrant: the same
numbers, dropout included, for about one more forward of the blocks per step). It pays only
when the activations the backward keeps would not fit: ``auto`` (the default) measures them
and turns it on when they would take more than half of the memory free on the run's device.

The measurement runs one block's forward on a batch of the run's shape, counting the bytes
of every tensor autograd saves for the backward that is not a parameter (each storage once),
and multiplies by the number of blocks: what a step of the run holds, give or take the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SETTINGS = ("auto", "on", "off")
#: ``auto`` turns it on above this fraction of the device's free memory
FREE_FRACTION = 0.5


@dataclass(frozen=True)
class Choice:
    """Whether checkpointing is on and why (one line for the run's log)."""

    on: bool
    why: str


def supported(model: nn.Module) -> bool:
    """Whether ``model`` runs its blocks through :meth:`Decoder._blocks` (the decoder family)."""
    return hasattr(type(model), "checkpoint_blocks") and hasattr(model, "blocks")


def free_bytes(device: torch.device) -> int:
    """Memory free for the run: CUDA's free memory, else the machine's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: never binds


def activation_bytes(model: nn.Module, batch: int, window: int, device: torch.device) -> int:
    """The bytes the backward keeps for ``batch`` windows of ``window`` tokens (one block
    measured, times the blocks)."""
    block = model.blocks[0]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    width = model.config.n_embd
    x = torch.zeros(batch, window, width, device=device, requires_grad=True)
    rotary = model._rotations(torch.arange(window, device=device), x.dtype)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, layer=0, need_weights=False, mask=None, is_causal=True, rotary=rotary,
              cache=None)  # fmt: skip
    return sum(seen.values()) * len(model.blocks)


def choose(setting: str, model: nn.Module, batch: int, window: int, device: Any) -> Choice:
    """What ``setting`` (``auto``, ``on``, ``off``) means for this model and run."""
    if setting == "off":
        return Choice(False, "off (train.grad_checkpoint)")
    if not supported(model):
        return Choice(False, f"not applicable to {type(model).__name__}")
    if setting == "on":
        return Choice(True, "on (train.grad_checkpoint)")
    device = torch.device(device)
    need, free = activation_bytes(model, batch, window, device), free_bytes(device)
    gib = 1 << 30
    said = f"activations {need / gib:.2f} GiB, {free / gib:.1f} GiB free"
    if need > FREE_FRACTION * free:
        return Choice(True, f"on: {said} (more than half)")
    return Choice(False, f"off: {said}")


def apply(model: nn.Module, choice: Choice) -> None:
    """Set the model's blocks to checkpoint (or not) as ``choice`` says."""
    if supported(model):
        model.checkpoint_blocks = choice.on


def setup(model: nn.Module, setting: str, batch: int, window: int, device: Any) -> Choice:
    """Choose for a run (see :func:`choose`) and apply the choice to ``model``."""
    choice = choose(setting, model, batch, window, device)
    apply(model, choice)
    return choice
