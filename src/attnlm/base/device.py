"""Devices and numeric modes shared by training, evaluation, generation and inspection.

* :func:`resolve_device`: ``auto`` picks CUDA, then MPS, then CPU; under torchrun each rank uses
  its local GPU; an unavailable device is a one-line :class:`~attnlm.base.errors.ConfigError`.
* :func:`autocast`: the one autocast context (``bfloat16`` or a no-op for ``float32``).
* :func:`eval_mode`: a context that puts a model in eval mode and restores its training flag.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from attnlm.base.errors import ConfigError
from attnlm.base.validate import DTYPES


def resolve_device(spec: str = "auto", local_rank: int | None = None) -> torch.device:
    """The torch device for ``spec`` (``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``),
    checked by the one device validator (:func:`attnlm.base.validate.device`: an unavailable GPU is
    a one-line ConfigError). ``auto`` picks CUDA, then MPS, then CPU; plain ``cuda`` is the
    local rank's GPU under torchrun."""
    from attnlm.base.validate import device as check_device

    spec = check_device(spec)
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if spec == "auto":
        mps = getattr(torch.backends, "mps", None)
        if torch.cuda.is_available():
            spec = "cuda"
        elif mps is not None and mps.is_available():
            spec = "mps"
        else:
            spec = "cpu"
    if spec == "cuda":
        spec = f"cuda:{local_rank}"
    return torch.device(spec)


def autocast(device: torch.device | str, dtype: str = "float32") -> Any:
    """Autocast to bfloat16 on ``device`` when ``dtype == "bfloat16"``, else a no-op context."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "bfloat16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run a block with ``model.eval()`` and restore the previous training flag afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter, else of its first buffer (a quantized model
    keeps its weights as buffers); CPU for a model with neither."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def default_threads() -> int:
    """Threads a command runs on when ``--threads`` is not given: every core this process may
    use — torch's own default (the machine's physical cores), but no more than the CPUs the
    process is allowed on (``os.sched_getaffinity``: a container or ``taskset`` limit), where
    more threads than CPUs would only take turns."""
    n = torch.get_num_threads()
    if hasattr(os, "sched_getaffinity"):
        n = min(n, len(os.sched_getaffinity(0)))
    return max(1, n)


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Loading a quantized model frees many large temporaries that the allocator would
    otherwise keep, counted in the process's resident memory."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass
