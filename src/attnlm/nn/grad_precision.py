"""The backward's float32 matrix products on bfloat16 inputs: ``train.backward_precision =
"bfloat16"`` (``attnlm train --backward-precision bfloat16``).

:func:`bf16_backward` is the switch (a block around the forward pass); the kernels that honour
it (:func:`attnlm.nn.fused.linear`, :func:`attnlm.nn.fused.chunked_head_loss`,
:class:`attnlm.lora.layers.LoRALinear`) note :func:`bf16_grads` in their forward and run their
backward's products inside :func:`products_in_bf16`. ``attnlm.nn.fused`` re-exports
:func:`bf16_backward` and :func:`bf16_backward_support`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

_BF16_BACKWARD = False  # set by bf16_backward(); read when a product's forward runs


def bf16_backward_support() -> str | None:
    """None where :func:`bf16_backward` can run, else why not (one line): it needs PyTorch's
    ``torch.backends.mkldnn.matmul.fp32_precision`` (2.9 and later) and a CPU with bfloat16
    matrix instructions (AMX or AVX512-BF16), where oneDNN's products are several times
    float32's speed rather than emulated."""
    mm = getattr(torch.backends.mkldnn, "matmul", None)
    if mm is None or not hasattr(mm, "fp32_precision") or not torch.backends.mkldnn.is_available():
        return f"this PyTorch ({torch.__version__}) cannot run float32 products in bfloat16"
    if not _bf16_products_run():
        return "oneDNN does not run bfloat16 products on this CPU (no AMX or AVX512-BF16 kernel)"
    return None


@functools.cache
def _bf16_products_run() -> bool:
    """Whether oneDNN's bfloat16 math mode changes a product here: the capability is tried,
    not read from a flag (``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is true on CPUs
    where the mode silently computes in float32). Inputs that bfloat16 cannot hold exactly
    give a different product once their inputs are rounded."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(64, 128, generator=g), torch.randn(96, 128, generator=g)
    with torch.no_grad():
        want = torch.nn.functional.linear(a, w)
        with products_in_bf16(True):
            got = torch.nn.functional.linear(a, w)
    return not torch.equal(got, want)


@contextmanager
def bf16_backward(enabled: bool = True) -> Iterator[None]:
    """Inside this block, the products that :func:`~attnlm.nn.fused.linear`,
    :class:`~attnlm.lora.layers.LoRALinear` and :func:`~attnlm.nn.fused.chunked_head_loss` record
    for the backward (``dx = dy W``, ``dW = dyᵀ x``, the head's ``G W`` and ``Gᵀ h``) round
    their float32 inputs to bfloat16 and accumulate in float32 (oneDNN's bf16 math mode: AMX
    on CPUs that have it). The forward pass, and so the loss, stays float32; only the
    gradients carry bfloat16's input rounding (relative error about 2⁻⁸ per product).
    Attention's own kernel and element-wise gradients are unchanged."""
    global _BF16_BACKWARD
    before, _BF16_BACKWARD = _BF16_BACKWARD, bool(enabled)
    try:
        yield
    finally:
        _BF16_BACKWARD = before


def bf16_grads(x: Tensor) -> bool:
    """Whether a product recorded now on ``x`` takes bfloat16 inputs in its backward (inside
    :func:`bf16_backward`, on the CPU); a Function's forward keeps this in its ``ctx``."""
    return _BF16_BACKWARD and x.device.type == "cpu"


@contextmanager
def products_in_bf16(enabled: bool) -> Iterator[None]:
    """oneDNN's float32 products take bfloat16 inputs while active (when ``enabled``)."""
    if not enabled:
        yield
        return
    mm = torch.backends.mkldnn.matmul
    before, mm.fp32_precision = mm.fp32_precision, "bf16"
    try:
        yield
    finally:
        mm.fp32_precision = before
