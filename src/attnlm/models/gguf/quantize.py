"""float32 -> ggml block types for writing GGUF files: Q8_0 and Q4_0 as llama.cpp lays them out
(``ggml-common.h``, reference quantizers in ``ggml-quants.c``), and F16 / F32.

Both quantized types cut each row into blocks of 32 values, each stored with a float16 scale
``d`` (so a row length must be a multiple of 32):

* ``Q8_0`` (34 bytes a block): ``d = max|x| / 127``, then 32 int8 ``round(x / d)`` (rounding
  half away from zero, C's ``roundf``); value = ``d · q``.
* ``Q4_0`` (18 bytes a block): ``m`` = the value of largest magnitude (the first on ties),
  ``d = m / -8``, ``q = min(15, trunc(x / d + 8.5))``; byte ``j`` holds ``q[j]`` in its low
  nibble and ``q[j + 16]`` in its high one; value = ``d · (q - 8)``.

The scale is the float32 one; the file stores it rounded to float16, and dequantization uses
the rounded one (as llama.cpp does).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

BLOCK = 32
#: ggml type ids of the types written
TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}


def _blocks(x: Tensor) -> Tensor:
    """``(rows, cols)`` float32 -> ``(rows · cols / 32, 32)`` float32."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of {BLOCK}")
    return x.detach().to(torch.float32).reshape(-1, BLOCK)


def _roundf(x: Tensor) -> Tensor:
    """C's ``roundf``: halves away from zero (torch.round rounds halves to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def q8_0(x: Tensor) -> np.ndarray:
    """``(rows, cols)`` -> uint8 ``(rows, cols / 32 · 34)``: Q8_0 blocks."""
    b = _blocks(x)
    d = b.abs().amax(dim=1) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = _roundf(b * inv[:, None]).to(torch.int8)
    scale = d.to(torch.float16).numpy().view(np.uint8).reshape(-1, 2)
    raw = np.concatenate([scale, q.numpy().view(np.uint8)], axis=1)
    return raw.reshape(x.shape[0], -1)


def q4_0(x: Tensor) -> np.ndarray:
    """``(rows, cols)`` -> uint8 ``(rows, cols / 32 · 18)``: Q4_0 blocks."""
    b = _blocks(x)
    where = b.abs().argmax(dim=1)  # the first of equal magnitudes, as the C loop keeps it
    m = b.gather(1, where[:, None])[:, 0]
    d = m / -8
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp((b * inv[:, None] + 8.5).trunc(), max=15).to(torch.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    scale = d.to(torch.float16).numpy().view(np.uint8).reshape(-1, 2)
    raw = np.concatenate([scale, packed.numpy()], axis=1)
    return raw.reshape(x.shape[0], -1)


def encode(x: Tensor, kind: str) -> np.ndarray:
    """``x`` in ``kind`` (one of :data:`TYPES`) as the bytes (or floats) a GGUF file holds."""
    if kind == "f32":
        return x.detach().to(torch.float32).contiguous().numpy()
    if kind == "f16":
        return x.detach().to(torch.float16).contiguous().numpy()
    return {"q8_0": q8_0, "q4_0": q4_0}[kind](x)
