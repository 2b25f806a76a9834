"""ggml tensor types dequantized to float32 in torch, whole tensors at once.

Each quantized type stores a row as blocks; a block holds ``elements`` values in ``bytes``
bytes: half-precision scales and packed small integers (ggml's ``ggml-quants.c``; the numpy
code of ``gguf.quants`` computes the same numbers and the tests compare every type with it).

=======  ========  =====  =====================================================================
type     elements  bytes  value of element ``i`` of a block
=======  ========  =====  =====================================================================
F32      1         4      as stored
F16      1         2      as stored (IEEE half)
BF16     1         2      as stored (bfloat16)
Q8_0     32        34     ``d · q[i]``; ``d`` f16, ``q`` int8
Q4_0     32        18     ``d · (n[i] - 8)``; ``n`` nibbles: byte ``j`` holds ``n[j]`` (low) and
                          ``n[j + 16]`` (high)
Q4_1     32        20     ``d · n[i] + m``; ``d``, ``m`` f16
Q4_K     256       144    8 sub-blocks of 32 with 6-bit scale ``s`` and min ``t``:
                          ``d·s · n[i] - dmin·t``; 4 groups of 32 bytes, each the low nibbles of
                          sub-block ``2g`` and the high nibbles of ``2g + 1``
Q5_K     256       176    Q4_K's layout plus a fifth bit from ``qh``: bit ``k`` of ``qh[l]`` is
                          the high bit of element ``l`` of sub-block ``k``
Q6_K     256       210    16 sub-blocks of 16, int8 scales ``s``: ``d·s · (q - 32)``, ``q`` 6
                          bits: 4 low from ``ql``, 2 high from ``qh``
=======  ========  =====  =====================================================================

Speed: every step is one vectorised torch operation over the whole tensor, writing into the
output in place (the caller passes the model's parameter slice as ``out``), so the only
temporaries are byte-sized (one byte per element) and a model loads at memory speed. The
order of float operations is ggml's (``d·q + m``, ``(d·s)·q - dmin·t``), so the results are
bit-identical to ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnlm.errors import InputError

# type id -> (name, elements per block, bytes per block)
SUPPORTED: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    8: ("Q8_0", 32, 34),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
NAMES = {v[0]: k for k, v in SUPPORTED.items()}
# Elements dequantized per step: the several in-place passes of a kernel then run over a piece
# that stays in the CPU cache instead of streaming the whole tensor through memory each time.
CHUNK_ELEMENTS = 1 << 16


def _half(b: Tensor) -> Tensor:
    """``(N, 2)`` bytes -> ``(N, 1)`` float32 from IEEE half precision."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(out: Tensor, qs: Tensor) -> None:
    """``out`` ``(N, G, 2, 32)`` float32 <- the low and high nibbles of ``qs`` ``(N, G, 32)``."""
    out[:, :, 0].copy_(qs & 0x0F)
    out[:, :, 1].copy_(qs >> 4)


def _k_scales(scales: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K / Q5_K: the 8 six-bit scales and mins packed in 12 bytes, each ``(N, 8)`` float32.
    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the
    same for the mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float(), mn.float()


def _q8_0(b: Tensor, out: Tensor) -> None:
    n = b.shape[0]
    d = _half(b[:, :2])  # (N, 1)
    out.view(n, 32).copy_(b[:, 2:].view(torch.int8)).mul_(d)


def _q4_0(b: Tensor, out: Tensor) -> None:
    n = b.shape[0]
    d = _half(b[:, :2])
    o = out.view(n, 1, 2, 16)
    _nibbles(o, b[:, 2:].view(n, 1, 16))
    out.view(n, 32).sub_(8).mul_(d)


def _q4_1(b: Tensor, out: Tensor) -> None:
    n = b.shape[0]
    d, m = _half(b[:, :2]), _half(b[:, 2:4])
    _nibbles(out.view(n, 1, 2, 16), b[:, 4:].view(n, 1, 16))
    out.view(n, 32).mul_(d).add_(m)


def _q4_k(b: Tensor, out: Tensor) -> None:
    n = b.shape[0]
    d, dmin = _half(b[:, :2]), _half(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    _nibbles(out.view(n, 4, 2, 32), b[:, 16:].reshape(n, 4, 32))
    o = out.view(n, 8, 32)
    o.mul_((d * sc).unsqueeze(-1)).sub_((dmin * mn).unsqueeze(-1))


def _q5_k(b: Tensor, out: Tensor) -> None:
    n = b.shape[0]
    d, dmin = _half(b[:, :2]), _half(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qh = b[:, 16:48].reshape(n, 1, 32)
    _nibbles(out.view(n, 4, 2, 32), b[:, 48:].reshape(n, 4, 32))
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
    o = out.view(n, 8, 32)
    o.add_(((qh >> shifts) & 1) << 4)  # the fifth bit: + 16 (exact in float32)
    o.mul_((d * sc).unsqueeze(-1)).sub_((dmin * mn).unsqueeze(-1))


def _q6_k(b: Tensor, out: Tensor) -> None:
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 64)  # two halves of 128 elements
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    scales = b[:, 192:208].contiguous().view(torch.int8).float()  # (N, 16)
    d = _half(b[:, 208:210])
    o = out.view(n, 2, 2, 64)  # (half, low / high nibble, 64)
    o[:, :, 0].copy_(ql & 0x0F)
    o[:, :, 1].copy_(ql >> 4)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    out.view(n, 2, 4, 32).add_(((qh >> shifts) & 3) << 4).sub_(32)
    out.view(n, 16, 16).mul_((d * scales).unsqueeze(-1))


_KERNELS = {8: _q8_0, 2: _q4_0, 3: _q4_1, 12: _q4_k, 13: _q5_k, 14: _q6_k}
_FLOATS = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


def dequantize(
    raw: np.ndarray,
    type_id: int,
    shape: tuple[int, ...],
    out: Tensor | None = None,
    name: str = "tensor",
) -> Tensor:
    """The float32 tensor of ``shape`` stored in ``raw`` (``uint8`` bytes of ggml type
    ``type_id``), written into ``out`` (contiguous float32, same number of elements) when
    given. An unsupported type is an InputError naming ``name`` and the type."""
    if type_id not in SUPPORTED:
        from attnlm.ggufio import type_name

        known = ", ".join(v[0] for v in SUPPORTED.values())
        raise InputError(
            f"{name}: tensor type {type_name(type_id)} is not supported (supported: {known})"
        )
    _, block, size = SUPPORTED[type_id]
    count = int(np.prod(shape, dtype=np.int64))
    if raw.size * block != count * size:
        raise InputError(f"{name}: {raw.size} bytes do not hold {list(shape)} {type_id}")
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif out.numel() != count or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"{name}: out must be contiguous float32 with {count} elements")
    data = torch.from_numpy(raw)
    if type_id in _FLOATS:
        out.view(-1).copy_(data.view(_FLOATS[type_id]))
        return out.view(shape)
    blocks, flat, kernel = data.view(-1, size), out.view(-1), _KERNELS[type_id]
    step = max(1, CHUNK_ELEMENTS // block)
    for start in range(0, blocks.shape[0], step):  # cache-sized pieces: see the docstring
        stop = min(start + step, blocks.shape[0])
        kernel(blocks[start:stop], flat[start * block : stop * block])
    return out.view(shape)
