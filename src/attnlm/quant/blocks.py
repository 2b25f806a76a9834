"""The block formats, defined once: how a weight matrix is laid out in bytes by ggml's types (GGUF
files) and by attnlm's own q8 / q4 layouts, read and written with numpy alone.

The C engine (:mod:`attnlm.runtime.engine_gguf`) builds its weights with these functions
without importing PyTorch; the PyTorch side (:mod:`attnlm.quant.layers`, the GGUF loader and
writer in :mod:`attnlm.models.gguf`) calls the same functions and converts at the boundary
(``torch.from_numpy`` and ``Tensor.numpy``, which share memory).

ggml's types (``ggml-common.h``; the numpy code of ``gguf.quants`` computes the same numbers
and the tests compare every type with it): a row is a run of blocks, a block holds ``elements``
values in ``bytes`` bytes.

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
Q5_0     32        22     ``d · (n[i] + 16 h[i] - 16)``; ``d`` f16, ``h[i]`` bit ``i`` of the
                          uint32 ``qh``, then Q4_0's 16 bytes of nibbles
Q5_1     32        24     ``d · (n[i] + 16 h[i]) + m``; ``d``, ``m`` f16, ``qh``, nibbles
Q4_K     256       144    8 sub-blocks of 32 with 6-bit scale ``s`` and min ``t``:
                          ``d·s · n[i] - dmin·t``; 4 groups of 32 bytes, each the low nibbles of
                          sub-block ``2g`` and the high nibbles of ``2g + 1``
Q5_K     256       176    Q4_K's layout plus a fifth bit from ``qh``: bit ``k`` of ``qh[l]`` is
                          the high bit of element ``l`` of sub-block ``k``
Q6_K     256       210    16 sub-blocks of 16, int8 scales ``s``: ``d·s · (q - 32)``, ``q`` 6
                          bits: 4 low from ``ql``, 2 high from ``qh``
Q2_K     256       84     16 sub-blocks of 16, a byte each of 4-bit scale ``s`` (low) and min
                          ``t`` (high): ``d·s · q - dmin·t``, ``q`` 2 bits: element ``32 j + l``
                          of half ``h`` is bits ``2j`` of byte ``l`` of that half's 32
Q3_K     256       110    ``hmask`` (32 bytes), Q2_K's 2-bit layout (64), 16 six-bit scales
                          in 12 bytes, ``d``: ``d·(s - 32) · (q - 4 + 4 h)``, ``h`` bit
                          ``4 half + j`` of ``hmask[l]``
IQ4_NL   32        18     ``d · T[n[i]]``: ``T`` a table of 16 values (-127 ... 113), the
                          nibbles as Q4_0's
IQ4_XS   256       136    8 sub-blocks of 32, 6-bit scales (4 bits in ``scales_l``, 2 in
                          ``scales_h``): ``d·(s - 32) · T[n[i]]``, 16 bytes of nibbles each
MXFP4    32        17     ``E · F[n[i]]``: ``e`` one byte (E8M0) first, ``E = 2^(e - 128)``
                          (:func:`e8m0_half`), ``F`` twice E2M1's 16 values (-12 ... 12), the
                          nibbles as Q4_0's
=======  ========  =====  =====================================================================

attnlm's layouts (what :class:`~attnlm.quant.layers.QuantLinear` stores and the C step reads;
a weight ``w[n, k]``, groups of :data:`GROUP` along ``k``):

* ``q8``: int8 codes ``q`` ``(N, K)`` and float16 scales ``s`` ``(N, K / 32)``, ``w = s q``:
  Q8_0's blocks with codes and scales apart.
* ``q4``: 4-bit codes ``u`` ``(N, K)`` and float16 ``d``, ``m`` ``(N, K / 32)``,
  ``w = d u + m`` (Q4_1's; Q4_0's ``d (u - 8)`` is ``m = -8 d``, exact in float16), stored by
  :func:`pack_q4`: the codes packed per block of :data:`BLOCK_N` rows in the layout of
  ``aten._convert_weight_to_int4pack_for_cpu`` (:func:`pack_int4`), the rows padded to a
  multiple of 64, and ``(d, m)`` as ``(N' / 64, G, 64, 2)``, each block's scales together.

:data:`NATIVE_FORMAT` says which ggml types are an attnlm format's codes as stored
(:func:`codes` reads them without a float32 copy); :func:`dequantize` gives any supported type
as float32; :func:`quantize_q8_0` and :func:`quantize_q4_0` write ggml's blocks (llama.cpp's
reference quantizers, for exporting GGUF files).

Speed: :func:`dequantize` runs one vectorised operation per step over cache-sized pieces
(:data:`CHUNK_ELEMENTS`), writing into the output in place (the PyTorch loader passes its
parameter's memory as ``out``), so the only temporaries are byte-sized and a model loads at
memory speed. The order of float operations is ggml's (``d·q + m``, ``(d·s)·q - dmin·t``), so
the results are bit-identical to ``gguf.quants.dequantize``.

Shape legend
    N  rows (output features)    K  row length (input features)    G  groups per row (K / 32)
"""

from __future__ import annotations

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.ggufio import TENSOR_TYPES, type_name

GROUP = 32  # elements per scale (ggml's Q8_0, Q4_0 and Q4_1 blocks; attnlm's q8 and q4)
BLOCK_N = 64  # rows per block of the packed q4 layout
#: ggml types :func:`dequantize` reads: type id -> (name, elements per block, bytes per block)
SUPPORTED: dict[int, tuple[str, int, int]] = {
    i: TENSOR_TYPES[i] for i in (0, 1, 30, 8, 2, 3, 6, 7, 10, 11, 12, 13, 14, 20, 23, 39)
}
#: ggml type -> byte offsets of the float16 scales in one of its blocks (d, and m / dmin)
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2),
                 "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82),
                 "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,)}  # fmt: skip
#: ggml type -> the attnlm format whose codes its blocks hold as stored (:func:`codes`)
NATIVE_FORMAT = {"Q8_0": "q8", "Q4_0": "q4", "Q4_1": "q4"}
# Elements dequantized per step: the several in-place passes of a kernel then run over a piece
# that stays in the CPU cache instead of streaming the whole tensor through memory each time.
CHUNK_ELEMENTS = 1 << 16


# -- ggml blocks -> float32 ------------------------------------------------------------------


def _half(b: np.ndarray) -> np.ndarray:
    """``(N, 2)`` bytes -> ``(N, 1)`` float32 from IEEE half precision."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(out: np.ndarray, qs: np.ndarray) -> None:
    """``out`` ``(N, G, 2, 32)`` float32 <- the low and high nibbles of ``qs`` ``(N, G, 32)``."""
    out[:, :, 0] = qs & 0x0F
    out[:, :, 1] = qs >> 4


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 8 six-bit scales and mins packed in 12 bytes, each ``(N, 8)`` float32.
    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the
    same for the mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q8_0(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    o = out.reshape(n, 32)
    o[:] = b[:, 2:].view(np.int8)
    o *= _half(b[:, :2])


def _q4_0(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    _nibbles(out.reshape(n, 1, 2, 16), b[:, 2:].reshape(n, 1, 16))
    o = out.reshape(n, 32)
    o -= 8
    o *= _half(b[:, :2])


def _q4_1(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    _nibbles(out.reshape(n, 1, 2, 16), b[:, 4:].reshape(n, 1, 16))
    o = out.reshape(n, 32)
    o *= _half(b[:, :2])
    o += _half(b[:, 2:4])


def _q5(b: np.ndarray, out: np.ndarray, at: int) -> np.ndarray:
    """Q5_0 / Q5_1: ``out`` ``(N, 32)`` <- the 5-bit codes (``qh`` at byte ``at``, the
    nibbles after it); returns that view."""
    n = b.shape[0]
    _nibbles(out.reshape(n, 1, 2, 16), b[:, at + 4 :].reshape(n, 1, 16))
    qh = np.ascontiguousarray(b[:, at : at + 4]).view("<u4")  # (N, 1)
    o = out.reshape(n, 32)
    o += ((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4  # + 16 (exact in float32)
    return o


def _q5_0(b: np.ndarray, out: np.ndarray) -> None:
    o = _q5(b, out, 2)
    o -= 16
    o *= _half(b[:, :2])


def _q5_1(b: np.ndarray, out: np.ndarray) -> None:
    o = _q5(b, out, 4)
    o *= _half(b[:, :2])
    o += _half(b[:, 2:4])


def _scale_k(o: np.ndarray, b: np.ndarray) -> None:
    """Q4_K / Q5_K: ``o`` ``(N, 8, 32)`` codes <- ``(d·s) · o - dmin·t``."""
    d, dmin = _half(b[:, :2]), _half(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    o *= (d * sc)[..., None]
    o -= (dmin * mn)[..., None]


def _q4_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    _nibbles(out.reshape(n, 4, 2, 32), b[:, 16:].reshape(n, 4, 32))
    _scale_k(out.reshape(n, 8, 32), b)


def _q5_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    qh = b[:, 16:48].reshape(n, 1, 32)
    _nibbles(out.reshape(n, 4, 2, 32), b[:, 48:].reshape(n, 4, 32))
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    o = out.reshape(n, 8, 32)
    o += ((qh >> shifts) & 1) << 4  # the fifth bit: + 16 (exact in float32)
    _scale_k(o, b)


def _q6_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 64)  # two halves of 128 elements
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)  # (N, 16)
    d = _half(b[:, 208:210])
    o = out.reshape(n, 2, 2, 64)  # (half, low / high nibble, 64)
    o[:, :, 0] = ql & 0x0F
    o[:, :, 1] = ql >> 4
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    o4 = out.reshape(n, 2, 4, 32)
    o4 += ((qh >> shifts) & 3) << 4
    o4 -= 32
    o16 = out.reshape(n, 16, 16)
    o16 *= (d * scales)[..., None]


def _crumbs(out: np.ndarray, qs: np.ndarray) -> None:
    """Q2_K / Q3_K: ``out`` ``(N, 2, 4, 32)`` <- the 2-bit fields of ``qs`` ``(N, 2, 32)``:
    element ``32 j + l`` of half ``h`` is bits ``2j, 2j + 1`` of byte ``l`` of half ``h``."""
    for j in range(4):
        out[:, :, j] = (qs >> (2 * j)) & 3


def _q2_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    _crumbs(out.reshape(n, 2, 4, 32), b[:, 16:80].reshape(n, 2, 32))
    d, dmin, sc = _half(b[:, 80:82]), _half(b[:, 82:84]), b[:, :16]
    o = out.reshape(n, 16, 16)
    o *= (d * (sc & 0x0F))[..., None]  # (d·s)·q - dmin·m, in gguf.quants' order
    o -= (dmin * (sc >> 4))[..., None]


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K: the 16 six-bit scales of 12 bytes, less 32, ``(N, 16)`` float32: the low 4 bits
    of scale ``k`` are byte ``k``'s low nibble (``k < 8``) or byte ``k - 8``'s high one, its
    top 2 bits bits ``2 (k // 4)`` of byte ``8 + k % 4``."""
    low = np.concatenate([s[:, :8] & 0x0F, s[:, :8] >> 4], axis=1)
    top = (s[:, 8:12, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3  # (N, 4 bytes, 4)
    top = top.transpose(0, 2, 1).reshape(-1, 16)
    return (low | (top << 4)).astype(np.float32) - 32


def _q3_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    o = out.reshape(n, 2, 4, 32)
    _crumbs(o, b[:, 32:96].reshape(n, 2, 32))
    hm = b[:, :32]  # bit 4 h + j of hmask[l]: element 32 j + l of half h has no -4
    for h in range(2):
        for j in range(4):
            o[:, h, j] -= (((hm >> (4 * h + j)) & 1) ^ 1) << 2
    d = _half(b[:, 108:110])
    o16 = out.reshape(n, 16, 16)
    o16 *= (d * _q3_k_scales(b[:, 96:108]))[..., None]


#: IQ4_NL's and IQ4_XS's 16 values of a 4-bit code
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)  # fmt: skip


def _iq4_values(out: np.ndarray, qs: np.ndarray) -> None:
    """``out`` ``(N, G, 2, 16)`` <- the table values of the low and high nibbles of ``qs``
    ``(N, G, 16)`` (:func:`_nibbles`' order)."""
    out[:, :, 0] = IQ4_VALUES[qs & 0x0F]
    out[:, :, 1] = IQ4_VALUES[qs >> 4]


def _iq4_nl(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    _iq4_values(out.reshape(n, 1, 2, 16), b[:, 2:].reshape(n, 1, 16))
    out.reshape(n, 32)[:] *= _half(b[:, :2])


def _iq4_xs(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    _iq4_values(out.reshape(n, 8, 2, 16), b[:, 8:].reshape(n, 8, 16))
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2")  # (N, 1): bits 2i, 2i + 1 top of scale i
    low = (b[:, 4:8, None] >> np.array([0, 4], dtype=np.uint8)) & 0x0F  # (N, 4, 2): scale 2i + h
    top = (sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    ls = (low.reshape(n, 8) | (top << 4)).astype(np.float32) - 32
    out.reshape(n, 8, 32)[:] *= (_half(b[:, :2]) * ls)[..., None]


#: MXFP4's 16 values of a 4-bit code: twice E2M1's (sign bit 3, two exponent bits, one mantissa
#: bit), so that the block scale is ``2^(e - 128)``, half of E8M0's ``2^(e - 127)``
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                        dtype=np.float32)  # fmt: skip


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """MXFP4's block scales ``2^(e - 128)`` (float32, exact) of E8M0 bytes ``e``, built from
    their bits as ggml builds them: ``e - 1`` as the exponent field, and for ``e`` 0 and 1 the
    subnormals ``2^-128``, ``2^-127`` (``e = 255`` gives ``2^127``, not a NaN)."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    o = out.reshape(n, 1, 2, 16)
    o[:, :, 0] = MXFP4_VALUES[b[:, 1:] & 0x0F][:, None]
    o[:, :, 1] = MXFP4_VALUES[b[:, 1:] >> 4][:, None]
    with np.errstate(over="ignore"):  # e >= 253: infinite values, as ggml's
        out.reshape(n, 32)[:] *= e8m0_half(b[:, :1])  # exact: a small integer times 2^(e - 128)


_KERNELS = {8: _q8_0, 2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 12: _q4_k, 13: _q5_k, 14: _q6_k,
            10: _q2_k, 11: _q3_k, 20: _iq4_nl, 23: _iq4_xs, 39: _mxfp4}  # fmt: skip


def _floats(data: np.ndarray, type_id: int, flat: np.ndarray) -> None:
    """F32 / F16 / BF16 bytes into ``flat`` float32 (bfloat16: the high half of a float32)."""
    if type_id == 30:
        flat.view(np.uint32)[:] = data.view("<u2").astype(np.uint32) << 16
    else:
        flat[:] = data.view("<f4" if type_id == 0 else "<f2")


def check_supported(type_id: int, name: str) -> None:
    """InputError naming ``name`` and the type unless :func:`dequantize` reads ``type_id``."""
    if type_id not in SUPPORTED:
        known = ", ".join(v[0] for v in SUPPORTED.values())
        raise InputError(
            f"{name}: tensor type {type_name(type_id)} is not supported (supported: {known})"
        )


def dequantize(
    raw: np.ndarray,
    type_id: int,
    shape: tuple[int, ...],
    out: np.ndarray | None = None,
    name: str = "tensor",
) -> np.ndarray:
    """The float32 array of ``shape`` stored in ``raw`` (``uint8`` bytes of ggml type
    ``type_id``), written into ``out`` (C-contiguous float32, same number of elements) when
    given. An unsupported type is an InputError naming ``name`` and the type."""
    check_supported(type_id, name)
    _, block, size = SUPPORTED[type_id]
    count = int(np.prod(shape, dtype=np.int64))
    if raw.size * block != count * size:
        raise InputError(f"{name}: {raw.size} bytes do not hold {list(shape)} {type_id}")
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.size != count or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name}: out must be contiguous float32 with {count} elements")
    flat = out.reshape(-1)  # a view: out is contiguous
    if type_id not in _KERNELS:
        _floats(raw, type_id, flat)
        return out.reshape(shape)
    blocks, kernel = raw.reshape(-1, size), _KERNELS[type_id]
    step = max(1, CHUNK_ELEMENTS // block)
    for start in range(0, blocks.shape[0], step):  # cache-sized pieces: see the docstring
        stop = min(start + step, blocks.shape[0])
        kernel(blocks[start:stop], flat[start * block : stop * block])
    return out.reshape(shape)


# -- ggml blocks -> attnlm's codes -----------------------------------------------------------


def codes(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """A Q8_0 matrix ``(N, K)`` as q8 codes ``{"q": int8 (N, K), "s": float16 (N, G)}``; a
    Q4_0 / Q4_1 one as q4 codes ``{"u": uint8 0..15 (N, K), "d", "m": float16 (N, G)}`` with
    ``w = d u + m`` (Q4_0: ``m = -8 d``). The values are the file's, unchanged; the arrays are
    fresh (writable) copies."""
    n, k = shape
    size = SUPPORTED[{"Q8_0": 8, "Q4_0": 2, "Q4_1": 3}[type_name]][2]
    b = raw.reshape(n * k // GROUP, size)  # (N G, bytes)
    halves = b.view(np.float16)  # (N G, bytes / 2): d first, then Q4_1's m
    d = np.ascontiguousarray(halves[:, 0]).reshape(n, k // GROUP)
    if type_name == "Q8_0":
        return {"q": b[:, 2:].copy().view(np.int8).reshape(n, k), "s": d}
    qs = b[:, 4:] if type_name == "Q4_1" else b[:, 2:]  # byte j: element j (low), j + 16 (high)
    u = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(n, k)
    if type_name == "Q4_1":
        m = np.ascontiguousarray(halves[:, 1]).reshape(n, k // GROUP)
    else:  # -8 d is exact in float16 (a power-of-two multiple)
        m = (-8 * d.astype(np.float32)).astype(np.float16)
    return {"u": u, "d": d, "m": m}


# -- attnlm's packed q4 layout ---------------------------------------------------------------


def pack_int4(u: np.ndarray) -> np.ndarray:
    """4-bit values ``u`` ``(N, K)`` (0..15, N a multiple of :data:`BLOCK_N`) -> the bytes
    ``(N, K / 2)`` uint8 of ``aten._convert_weight_to_int4pack_for_cpu``'s layout on AVX-512
    CPUs (PyTorch packs otherwise for its other kernels): per block of 64 rows and per column
    ``k``, 32 bytes; byte ``j`` holds row ``j`` (low nibble) and row ``j + 32`` (high
    nibble)."""
    n, k = u.shape
    b = u.astype(np.uint8).reshape(n // BLOCK_N, 2, 32, k)  # rows j and j + 32 of each block
    packed = b[:, 0] | (b[:, 1] << 4)  # (N/64, 32, K)
    return np.ascontiguousarray(packed.transpose(0, 2, 1)).reshape(n, k // 2)  # (N/64, K, 32)


def pack_q4(u: np.ndarray, d: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q4 codes ``u`` ``(N, K)`` (0..15) and float16 ``d``, ``m`` ``(N, G)`` -> the stored
    layout: packed codes ``(N', K / 2)`` uint8 (:func:`pack_int4`) and ``(d, m)``
    ``(N' / 64, G, 64, 2)`` float16, ``N'`` the rows padded with zeros to a multiple of 64."""
    n, k = u.shape
    pad = -n % BLOCK_N
    u = np.pad(u, ((0, pad), (0, 0)))
    dm = np.pad(np.stack([d, m], axis=-1), ((0, pad), (0, 0), (0, 0)))  # (N', G, 2)
    scales = dm.reshape(-1, BLOCK_N, k // GROUP, 2).transpose(0, 2, 1, 3)  # (N'/64, G, 64, 2)
    return pack_int4(u), np.ascontiguousarray(scales)


# -- float32 -> ggml blocks (llama.cpp's reference quantizers) -------------------------------


def _groups(x: np.ndarray) -> np.ndarray:
    """``(rows, cols)`` -> ``(rows · cols / 32, 32)`` float32."""
    if x.shape[-1] % GROUP:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of {GROUP}")
    return np.asarray(x, dtype=np.float32).reshape(-1, GROUP)


def _inverse(d: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``1 / d`` where ``where``, else 0."""
    return np.divide(np.float32(1), d, out=np.zeros_like(d), where=where)


def _with_scales(d: np.ndarray, payload: np.ndarray, rows: int) -> np.ndarray:
    """Blocks of a float16 scale ``d`` (rounded from float32) then ``payload``, per row."""
    scale = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return np.concatenate([scale, payload.view(np.uint8)], axis=1).reshape(rows, -1)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 ``(rows, cols)`` -> uint8 ``(rows, cols / 32 · 34)``: Q8_0 blocks, as llama.cpp
    writes them: ``d = max|x| / 127``, then 32 int8 ``round(x / d)`` (halves away from zero,
    C's ``roundf``). The file stores ``d`` rounded to float16."""
    b = _groups(x)
    d = np.abs(b).max(axis=1) / np.float32(127)
    v = b * _inverse(d, d > 0)[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    return _with_scales(d, q, x.shape[0])


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 ``(rows, cols)`` -> uint8 ``(rows, cols / 32 · 18)``: Q4_0 blocks, as llama.cpp
    writes them: ``m`` the value of largest magnitude (the first on ties), ``d = m / -8``,
    ``q = min(15, trunc(x / d + 8.5))``; byte ``j`` holds ``q[j]`` in its low nibble and
    ``q[j + 16]`` in its high one."""
    b = _groups(x)
    where = np.abs(b).argmax(axis=1)  # the first of equal magnitudes, as the C loop keeps it
    d = np.take_along_axis(b, where[:, None], axis=1)[:, 0] / np.float32(-8)
    v = np.trunc(b * _inverse(d, d != 0)[:, None] + np.float32(8.5))
    q = np.minimum(v, 15).astype(np.uint8)
    return _with_scales(d, q[:, :16] | (q[:, 16:] << 4), x.shape[0])
