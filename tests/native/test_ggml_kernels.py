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
1, 2, 4, 5 and 9 rows of x (the kernel takes 8 rows together, or 4 without AVX-512, then
one at a time), an odd number
of output rows (a decoding step's product takes two at a time), an odd number of blocks of 32
(3, 19: the integer product takes two at a time), threads 1 and 2.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from attnlm import native
from attnlm.native import structs
from attnlm.quant.blocks import dequantize
from gguf_support import Q, encode_tensor

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
BLOCK_TYPES = TYPES[3:]


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


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's activation blocks in numpy: codes ``a`` (M, K) int8 and scales ``e``
    (M, K / 32) float32, in the float32 operations the C code does."""
    g = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(g).max(axis=-1)
    e = (amax / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), e, out=np.zeros_like(e), where=amax > 0)
    a = np.rint(g * inv[..., None]).astype(np.int8)
    return a.reshape(x.shape), e


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", [(37, 512), (64, 1024), (3, 256), (7, 96), (6, 608)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["float", "int"])
def test_every_type_equals_numpy(qtype, shape, threads, act):
    n, k = shape
    if k % 256 and qtype.endswith("_K"):
        pytest.skip("K-quant rows come in blocks of 256")
    if act == "int" and qtype not in BLOCK_TYPES:
        pytest.skip("float weights take float activations")
    raw, w = weights(qtype, n, k, seed=n + k)
    rng = np.random.default_rng(k)
    for m in (1, 2, 4, 5, 9):
        x = rng.normal(size=(m, k)).astype(np.float32)
        x[:, :32] *= 0.01  # blocks of different scales
        code = structs.ACT_FLOAT if act == "float" else structs.ACT_INT
        got = product(raw, qtype, n, k, x, threads, code)
        if act == "float":
            seen = x.astype(np.float64)
        else:
            a, e = quantize_rows(x)
            seen = (a.reshape(m, -1, 32) * e[..., None].astype(np.float64)).reshape(m, k)
        want = seen @ w.T
        bound = 2e-5 * (np.abs(seen) @ np.abs(w).T) + 1e-7
        assert np.all(np.abs(got - want) <= bound), (qtype, m, np.abs(got - want).max())


def test_activations_are_quantized_as_numpy_does():
    """The codes exactly, the scales and the half sums ``e sum(a)`` to float32 rounding."""
    rng = np.random.default_rng(3)
    m, k = 3, 256
    x = rng.normal(size=(m, k)).astype(np.float32) * np.float32(3)
    x[1, 32:64] = 0  # an all-zero block: scale 0, codes 0
    x[2, :32] = np.linspace(-2, 2, 32)  # halves: 2 / 127 steps
    rb = lib().attnlm_quantized_row_bytes(k)
    assert rb == k + k // 32 * 4 + k // 16 * 4 + 2 * k
    out = np.zeros(m * rb, np.uint8)
    lib().attnlm_quantize_rows(x.ctypes.data, m, k, out.ctypes.data)
    rows = out.reshape(m, rb)
    a, e = quantize_rows(x)
    assert np.array_equal(rows[:, :k].view(np.int8), a)
    assert np.array_equal(rows[:, k : k + k // 32 * 4].copy().view(np.float32), e)
    sums = rows[:, k + k // 32 * 4 : k + k // 32 * 4 + k // 4].copy().view(np.float32)
    want = (a.reshape(m, -1, 16).sum(-1) * np.repeat(e, 2, axis=1)).astype(np.float32)
    np.testing.assert_allclose(sums, want, rtol=1e-6, atol=0)
    # the same per lane of each chunk's 8 dot-product lanes: e, and each half's sum / 4
    lanes = rows[:, k + k // 32 * 4 + k // 4 :].copy().view(np.float32).reshape(m, 2, -1, 8)
    assert np.array_equal(lanes[:, 0], np.repeat(e[..., None], 8, axis=-1))
    assert np.array_equal(lanes[:, 1], np.repeat(sums.reshape(m, -1, 2), 4, axis=-1) / 4)
