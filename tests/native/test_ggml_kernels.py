"""The C products of weights in ggml's blocks as a GGUF file stores them
(src/attnlm/native/ggml_blocks.h): every type, both ways of multiplying, against numpy.

- float activations: the product equals float64 ``dequantize(W) @ x`` (W dequantized by
  :func:`attnlm.quant.blocks.dequantize`, itself bit-identical to ``gguf.quants``), within
  2e-5 of the sum of the terms' magnitudes ``|W| @ |x|``: the C step sums the K products in
  float32 in 16 lanes and a tree, an error of about (K / 16 + 16) float32 roundings of at most
  that sum each (2^-24 ~ 6e-8; K = 512: about 3e-6), so 2e-5 leaves room for fused
  multiply-adds and nothing for a wrong weight (one code off moves a product by about 1e-2
  of that sum here);
- integer activations (llama.cpp's way): x is quantized per block of 32 to int8 codes ``a``
  and a float32 scale ``e = max|x| / 127`` (``a = rint(x / e)``: the numpy reference below
  computes the same float32 operations, and the codes are compared exactly), and the product
  equals float64 ``dequantize(W) @ (e a)``: in exact arithmetic the chunk formula
  ``e (A sum(u a)) + B e sum(a)`` is ``e sum((A u + B) a)``; the integer sums are exact and the
  float32 rest is bounded as above.
1, 2, 4, 5 and 9 rows of x (the kernel takes 8 rows together, or 4 without AVX2, then
one at a time; Q4_K and Q4_0 matrices of 8k rows sum the first M - M % 4 rows as llama.cpp's
repacked gemm, the others as its gemv), an odd number of output rows (a decoding step's
product takes two at a time), an odd number of blocks of 32 (3, 19: the integer product takes
two at a time), threads 1 and 2. MXFP4's float order, llama.cpp's bit for bit, is tested in
tests/native/test_mxfp4_products.py.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from attnlm import native
from attnlm.native import structs
from attnlm.quant.blocks import dequantize
from gguf_support import Q, block_size, encode_tensor

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
         "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4"]  # fmt: skip
BLOCK_TYPES = TYPES[3:]
#: the types of blocks of 256, multiplied by Q8_K activations
K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS")


def lib():
    found = native.library()
    assert found is not None, native.why_not
    return found


def weights(qtype: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes (N, row bytes) as a file stores them, float64 values they hold)``"""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, k)).astype(np.float32)
    if qtype == "BF16":
        bits = (values.view(np.uint32) >> 16).astype(np.uint16)
        raw = bits.view(np.uint8).reshape(n, -1)
        return raw, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    data, _ = encode_tensor(values, qtype, rng)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(n, -1)
    held = dequantize(raw.reshape(-1).copy(), int(Q[qtype]), (n, k))
    return raw, held.astype(np.float64)


def product(raw: np.ndarray, qtype: str, n: int, k: int, x: np.ndarray, threads: int,
            act: int) -> np.ndarray:  # fmt: skip
    layer = structs.Linear(structs.GGML_FORMATS[qtype], n, k, n, raw.ctypes.data, None, None, act)
    m = x.shape[0]
    y = np.full((m, n), np.nan, np.float32)
    part = np.empty(threads * m * n, np.float32)
    lib().attnlm_linear(ctypes.byref(layer), x.ctypes.data, m, y.ctypes.data, part.ctypes.data,
                        threads)  # fmt: skip
    return y


def round16(v) -> np.ndarray:
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def q8_0_blocks(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """llama.cpp's Q8_0 / Q8_1 activation blocks (x86 ``quantize_row_q8_0`` / ``_q8_1``),
    written from their formulas: per block of 32, ``d = amax / 127`` (float32), the scale
    ``e = float16(d)``, codes ``a = rint(x * (127 / amax))`` (float32 product, ties to even),
    Q8_1's ``s = float16(d * sum(a))``. Returns ``(a (M, K) int8, e, e * sum(a), s)``, the
    last three (M, K / 32) float32."""
    g = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(g).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    a = np.rint((g * inv[..., None]).astype(np.float32)).astype(np.int8)
    total = a.astype(np.int32).sum(-1).astype(np.float32)
    e = round16(d)
    return a.reshape(x.shape), e, (e * total).astype(np.float32), round16(d * total)


def q8_k_blocks(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """llama.cpp's Q8_K activation blocks (``quantize_row_q8_K_ref``): per block of 256, ``m``
    the first value of the largest magnitude, ``iscale = -127 / m``, codes
    ``min(127, rint(iscale * x))``, ``d = 1 / iscale`` (float32), sums of the codes per 16.
    Returns ``(a (M, K) int8, d (M, K / 256) float32, bsums (M, K / 16) int16)``."""
    g = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    at = np.abs(g).argmax(axis=-1)
    m = np.take_along_axis(g, at[..., None], axis=-1)[..., 0]
    zero = m == 0
    iscale = np.divide(np.float32(-127), m, out=np.zeros_like(m), where=~zero)
    a = np.minimum(127, np.rint((g * iscale[..., None]).astype(np.float32))).astype(np.int8)
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(m), where=~zero).astype(np.float32)
    bsums = a.reshape(x.shape[0], -1, 16).astype(np.int32).sum(-1).astype(np.int16)
    return a.reshape(x.shape), d, bsums


def seen_by(qtype: str, x: np.ndarray, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(the activations a product of qtype multiplies, in float64 (M, K); the term its
    Q8_1 sums add, (M, N))``: Q8_0 / Q4_0 / Q5_0 weights take ``e a``; Q4_1 / Q5_1 the same
    plus ``m_w (s - e sum(a))`` per block (llama.cpp adds ``m_w s``, where ``s`` is rounded to
    float16); the K-quants and IQ4_XS ``d a``; F16 x rounded to float16."""
    m, k = x.shape
    extra = np.zeros((m, raw.shape[0]))
    if qtype == "F16":
        return round16(x).astype(np.float64), extra
    if qtype in K_TYPES:
        a, d, _ = q8_k_blocks(x)
        return (a.reshape(m, -1, 256) * d[..., None].astype(np.float64)).reshape(m, k), extra
    a, e, e_sum, s = q8_0_blocks(x)
    if qtype in ("Q4_1", "Q5_1"):
        mins = raw.reshape(raw.shape[0], k // 32, -1)[:, :, 2:4].copy().view(np.float16)[..., 0]
        extra = (s.astype(np.float64) - e_sum) @ mins.astype(np.float64).T
    return (a.reshape(m, -1, 32) * e[..., None].astype(np.float64)).reshape(m, k), extra


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", [(37, 512), (64, 1024), (3, 256), (7, 96), (6, 608), (8, 96)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["float", "int"])
def test_every_type_equals_numpy(qtype, shape, threads, act):
    n, k = shape
    if k % block_size(qtype):
        pytest.skip("K-quant and IQ4_XS rows come in blocks of 256")
    if act == "int" and qtype not in ("F16", *BLOCK_TYPES):
        pytest.skip("float32 and bfloat16 weights take float activations")
    raw, w = weights(qtype, n, k, seed=n + k)
    rng = np.random.default_rng(k)
    for m in (1, 2, 4, 5, 9):
        x = rng.normal(size=(m, k)).astype(np.float32)
        x[:, :32] *= 0.01  # blocks of different scales
        code = structs.ACT_FLOAT if act == "float" else structs.ACT_INT
        got = product(raw, qtype, n, k, x, threads, code)
        seen, extra = (x.astype(np.float64), 0.0) if act == "float" else seen_by(qtype, x, raw)
        want = seen @ w.T + extra
        bound = 2e-5 * (np.abs(seen) @ np.abs(w).T) + 1e-7
        assert np.all(np.abs(got - want) <= bound), (qtype, m, np.abs(got - want).max())


def test_activations_are_quantized_as_numpy_does():
    """Every family's bytes: the codes, scales and sums exactly (the same float32 and
    float16 roundings), in the layout the products read."""
    rng = np.random.default_rng(3)
    m, k = 4, 512
    x = rng.normal(size=(m, k)).astype(np.float32) * np.float32(3)
    x[1, 32:64] = 0  # an all-zero block of 32: scale 0, codes 0
    x[1, 256:] = 0  # and of 256
    x[2, :32] = np.linspace(-2, 2, 32)  # halves: 2 / 127 steps
    x[3, :256] = np.linspace(-0.5, 1, 256) * np.float32(1e-6)  # float16 subnormal scales
    x[3, 256 + 7] = -50.0  # the largest magnitude negative: iscale > 0 (positive: < 0)
    rb = lib().attnlm_quantized_row_bytes(k)
    k32, kk = k // 32, k // 256
    assert rb == 2 * k + k32 * 8 + k + kk * 4 + k // 16 * 2 + 4 * k <= 8 * k
    out = np.zeros(m * rb, np.uint8)
    lib().attnlm_quantize_rows(x.ctypes.data, m, k, out.ctypes.data)
    rows = out.reshape(m, rb)

    def floats(at: int, n: int) -> np.ndarray:
        return rows[:, at : at + 4 * n].copy().view(np.float32)

    a, e, e_sum, s = q8_0_blocks(x)
    assert np.array_equal(rows[:, :k].view(np.int8), a)
    lanes = floats(k, k // 4).reshape(m, k32, 8)  # e in each of a block's 8 dot-product lanes
    assert np.array_equal(lanes, np.repeat(e[..., None], 8, axis=-1))
    sums = floats(2 * k, 2 * k32).reshape(m, k32, 2)
    assert np.array_equal(sums[..., 0], e_sum) and np.array_equal(sums[..., 1], s)
    at = 2 * k + 8 * k32
    ak, d, bsums = q8_k_blocks(x)
    assert np.array_equal(rows[:, at : at + k].view(np.int8), ak)
    assert np.array_equal(floats(at + k, kk), d)
    at += k + 4 * kk
    assert np.array_equal(rows[:, at : at + k // 8].copy().view(np.int16), bsums)
    assert np.array_equal(floats(at + k // 8, k), round16(x))
    assert d[3, 0] < 0 < d[3, 1] and ak[3, 255] == ak[3, 256 + 7] == -127
