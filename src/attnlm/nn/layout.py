"""The weight layout for decoding on the CPU.

A decoding step multiplies one row per sequence by every weight matrix: a matrix-vector
product, bound by how fast the matrix streams from memory. ``nn.Linear`` keeps its weight
``W`` ``(out, in)`` row-major and computes ``x Wᵀ``; on the CPU BLAS this float32 product
with few rows runs slower than the same product with ``W`` stored column-major (``Wᵀ``
row-major, the layout of GPT-2's original ``Conv1D``), which BLAS streams in one pass.

:func:`decoding_layout` stores the weights of a model's linear layers column-major in place:
the same values, shapes, dtype and parameters (so tied weights stay tied, state dicts and
optimisers see the same tensors), only the strides change. The decoders call it
(:func:`attnlm.generate.loop.decode`, :func:`attnlm.generate.beam.beam_search`); products
give the same numbers up to float rounding (the summation order of the kernel differs).
Training afterwards works unchanged; checkpoint writers and readers put the weights back
row-major first (:func:`standard_layout`). On other devices
and dtypes it changes nothing (cuBLAS reads either layout at the same speed).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["decoding_layout", "standard_layout"]


def _movable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and min(weight.shape) > 1
        and weight.is_contiguous()  # row-major: not yet moved
    )


def decoding_layout(model: nn.Module) -> nn.Module:
    """Store every float32 CPU ``nn.Linear`` weight of ``model`` column-major, in place
    (idempotent: moved weights are left alone). Returns ``model``. Called under
    ``torch.inference_mode`` too: the new storage is an ordinary tensor, so the model still
    trains afterwards."""
    with torch.inference_mode(False), torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and _movable(module.weight):
                module.weight.data = module.weight.data.t().contiguous().t()
    return model


def standard_layout(model: nn.Module) -> nn.Module:
    """Every parameter of ``model`` back to row-major (contiguous), in place: what file
    writers and readers that detect shared tensors by their memory (safetensors) expect.
    Returns ``model``; the next decode moves the weights again."""
    with torch.inference_mode(False), torch.no_grad():
        for param in model.parameters():
            if not param.is_contiguous():
                param.data = param.data.contiguous()
    return model
