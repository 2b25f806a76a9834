"""The C products of MXFP4 weights (gpt-oss's experts; ``ggml_blocks.h``) with integer
activations against llama.cpp's x86 CPU backend's float arithmetic, bit for bit.

A block is ``e`` (one byte, E8M0) and 16 bytes of nibbles; a value is ``F[nibble] E``, ``F``
twice E2M1's 16 values, ``E = 2^(e - 128)``. llama.cpp multiplies it by Q8_0 activation
blocks (codes ``a``, float16 scale ``dx``: :func:`test_ggml_kernels.q8_0_blocks`): per block
the integer sums of ``F a`` and one float32 scale ``s = dx E``. How the blocks' terms are then
added depends on the matrix, and both ways are written here from llama.cpp's x86 sources
(``ggml-cpu/arch/x86``), each float32 operation in numpy (a fused multiply-add exactly: the
product in float64, exact here, the sum's rounding error by TwoSum, so the float32 rounding
of the exact result is taken even at a tie):

- matrices of 8k rows, which its CPU backend repacks (``ggml_gemv_mxfp4_8x8_q8_0`` and
  ``ggml_gemm_...``, alike per output): ``sum = fma(total_b, s_b, sum)`` block after block;
- other matrices (``ggml_vec_dot_mxfp4_q8_0``): 8 lane sums a block (lane ``l``: codes
  ``4l .. 4l + 3``), ``fma(s_b, lanes_b, acc)`` into one 8-float sum for the even blocks and
  another for the odd ones, the two added lane by lane and then as a tree
  (``((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))``: ``hsum_float_8``), an odd last
  block's total times ``s`` added (fused) after.
The two orders give different float32 numbers on these inputs (checked), so a product in
the wrong one fails. Where llama-cpp-python is installed, built for a CPU with AVX2 and FMA
as this one, its own kernels (through ctypes: vec_dot, the repacked gemv and gemm, x quantized
by its own code) give the same numbers too. Without FMA (an x86-64-v2 build) the products
round each term before its sum, as llama.cpp's build for such a CPU does in other orders: not
tested here (tests/native/test_ggml_kernels.py bounds them).
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np
import pytest
from test_ggml_kernels import product, q8_0_blocks

from attnlm import native
from attnlm.native import structs
from gguf_support import Q, gguf

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")


@pytest.fixture()
def fused() -> None:
    """llama.cpp's x86 kernels fuse their multiply-adds: so must the build under test."""
    assert native.library() is not None, native.why_not
    if "fma" not in native.features():
        pytest.skip("a build without fused multiply-adds (ATTNLM_NATIVE_MARCH=x86-64-v2)")


#: F: twice E2M1's values (ggml's kvalues_mxfp4), written out
F = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int64)


def scales(e: np.ndarray) -> np.ndarray:
    """``2^(e - 128)`` as float32 (``e`` 0 and 1: the subnormals), by ``np.ldexp``."""
    return np.ldexp(np.float64(1), e.astype(np.int64) - 128).astype(np.float32)


def fma32(a, b, c) -> np.ndarray:
    """float32 ``a b + c`` rounded once (``a b`` exact in float64: fewer than 53 bits)."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    t = p + c
    back = t - p
    err = (p - (t - back)) + (c - back)  # TwoSum: t + err is p + c exactly
    r = t.astype(np.float32)
    d = t - r.astype(np.float64)
    toward = np.nextafter(r, np.where(d > 0, np.float32(np.inf), np.float32(-np.inf)))
    tie = (d != 0) & (2 * np.abs(d) == np.abs(toward.astype(np.float64) - r))
    return np.where(tie & (np.sign(err) == np.sign(d)), toward, r)


def terms(raw: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(the integer lane sums (M, N, blocks, 8), s = dx E (M, N, blocks) float32)``"""
    n, m = raw.shape[0], x.shape[0]
    b = raw.reshape(n, -1, 17)
    values = np.concatenate([F[b[..., 1:] & 15], F[b[..., 1:] >> 4]], axis=-1)  # (N, G, 32)
    a, dx = q8_0_blocks(x)[:2]
    prods = values[None] * a.reshape(m, 1, -1, 32).astype(np.int64)
    lanes = prods.reshape(m, n, -1, 8, 4).sum(-1)
    return lanes, (dx[:, None, :] * scales(b[..., 0])[None]).astype(np.float32)


def repacked_order(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    lanes, s = terms(raw, x)
    totals = lanes.sum(-1)
    out = np.zeros(s.shape[:2], np.float32)
    for g in range(s.shape[-1]):
        out = fma32(totals[..., g], s[..., g], out)
    return out


def vec_dot_order(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    lanes, s = terms(raw, x)
    nb = s.shape[-1]
    acc = [np.zeros((*s.shape[:2], 8), np.float32) for _ in range(2)]
    for g in range(nb - nb % 2):
        acc[g % 2] = fma32(s[..., g, None], lanes[..., g, :], acc[g % 2])
    v = acc[0] + acc[1]
    half = v[..., :4] + v[..., 4:]
    out = (half[..., 0] + half[..., 2]) + (half[..., 1] + half[..., 3])
    if nb % 2:
        out = fma32(s[..., -1], lanes[..., -1, :].sum(-1), out)
    return out


def mxfp4_rows(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """MXFP4 rows quantized by ``gguf.quants``, their blocks' scales then spread over 2^-4 ..
    2^4 of the normal data's; the last row's blocks at the smallest scales (e = 0, 1:
    subnormal, 2, 3), and a block of e = 200 (2^72) in the first row."""
    values = rng.normal(size=(n, k)).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(values, Q.MXFP4)).view(np.uint8)
    raw = raw.reshape(n, -1).copy()
    e = raw[:, ::17].astype(np.int64) + rng.integers(-4, 5, size=raw[:, ::17].shape)
    e[-1] = np.arange(e.shape[1]) % 4
    e[0, -1] = 200
    raw[:, ::17] = e.astype(np.uint8)
    return raw


SHAPES = [(37, 512), (64, 1024), (8, 96), (7, 96), (16, 2880), (6, 608), (24, 352), (3, 32)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_mxfp4_products_equal_llama_cpps_arithmetic(fused, shape, threads):
    """Rows of 8k in the repacked kernels' order, others in vec_dot's; 1 to 9 rows of x (the
    kernel takes 8 together, then one at a time; a decoding step's single row); blocks of 32
    even and odd in number (96: 3, 608: 19, 32: 1)."""
    n, k = shape
    rng = np.random.default_rng(n * k)
    raw = mxfp4_rows(n, k, rng)
    differ = 0
    for m in (1, 2, 4, 5, 8, 9):
        x = rng.normal(size=(m, k)).astype(np.float32)
        x[:, :32] *= 0.01  # blocks of different scales
        x[-1, 32:64] = 0  # a block of zeros: scale 0, codes 0
        got = product(raw, "MXFP4", n, k, x, threads, structs.ACT_INT)
        want, other = repacked_order(raw, x), vec_dot_order(raw, x)
        if n % 8:
            want, other = other, want
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (m, got - want)
        differ += int((want != other).sum())
    assert differ > 0 or k == 32  # the orders tell apart (one block: the same sum)


def test_fma32_rounds_once():
    """The emulated fused multiply-add: exact where float32 rounding twice is not."""
    one, eps = np.float32(1), np.float32(2**-23)
    # (1 + 2^-23)(1 - 2^-23) = 1 - 2^-46; minus 1: -2^-46 fused, 0 rounded first
    assert fma32(one + eps, one - eps, -one) == np.float32(-(2.0**-46))
    # 1 + 3 2^-24 - 2^-70: float64 rounds it to 1 + 3 2^-24, a tie for float32 (rounded
    # again: to the even 1 + 2^-22), but it lies below: 1 + 2^-23
    a, b = np.float32(2**-24) * (one + eps), one - eps
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(one + eps)) == one + 2 * eps
    assert fma32(a, b, one + eps) == one + eps
    assert fma32(np.float32(2**-24), one, one) == one  # a true tie: to even


# -- llama.cpp's own kernels, where llama-cpp-python is installed ---------------------------


class _Traits(ctypes.Structure):  # ggml-cpu.h's struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]  # fmt: skip


def _ggml_cpu() -> ctypes.CDLL:
    """llama-cpp-python's CPU backend, initialised; skips where it cannot be had."""
    llama_cpp = pytest.importorskip("llama_cpp")
    found = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.*"))
    if not found:
        pytest.skip("llama-cpp-python has no libggml-cpu library (a build of variants)")
    cpu = ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
    names = ("ggml_get_type_traits_cpu", "ggml_gemv_mxfp4_8x8_q8_0", "ggml_gemm_mxfp4_8x8_q8_0",
             "ggml_quantize_mat_q8_0_4x8", "ggml_cpu_has_fma")  # fmt: skip
    if not all(hasattr(cpu, name) for name in names):
        pytest.skip("this llama.cpp has no MXFP4 kernels")
    cpu.ggml_cpu_init()
    if not (cpu.ggml_cpu_has_avx2() and cpu.ggml_cpu_has_fma()):
        pytest.skip("llama-cpp-python was built without AVX2 and FMA: its sums round otherwise")
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_Traits)
    for kernel in (cpu.ggml_gemv_mxfp4_8x8_q8_0, cpu.ggml_gemm_mxfp4_8x8_q8_0):
        kernel.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int, ctypes.c_int]  # fmt: skip
    cpu.ggml_quantize_mat_q8_0_4x8.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return cpu


def _repack8(raw: np.ndarray) -> np.ndarray:
    """llama.cpp's ``block_mxfp4x8`` (repack.h): per 8 rows and block, the 8 exponents, then
    8 bytes of nibbles of each row in turn, twice (bytes 0-7, then 8-15)."""
    n, nb = raw.shape[0], raw.shape[1] // 17
    b = raw.reshape(n // 8, 8, nb, 17)
    e = b[..., 0].transpose(0, 2, 1)
    qs = b[..., 1:].reshape(n // 8, 8, nb, 2, 8).transpose(0, 2, 3, 1, 4).reshape(n // 8, nb, 128)
    return np.ascontiguousarray(np.concatenate([e, qs], axis=-1))


def llama_cpp_product(cpu: ctypes.CDLL, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x quantized by llama.cpp (Q8_0) and multiplied as its CPU backend multiplies: rows of
    8k repacked, the first ``M - M % 4`` rows of x by its gemm (x's rows in fours,
    interleaved), the others by its gemv; other matrices by its vec_dot, one weight row at a
    time."""
    (n, _), (m, k) = raw.shape, x.shape
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        cpu.ggml_get_type_traits_cpu(int(Q.Q8_0)).contents.from_float
    )
    vec_dot = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.c_size_t, ctypes.c_int)(
        cpu.ggml_get_type_traits_cpu(int(Q.MXFP4)).contents.vec_dot
    )  # fmt: skip
    packed = _repack8(raw) if n % 8 == 0 else None
    out, s = np.zeros((m, n), np.float32), np.zeros(1, np.float32)
    four = m - m % 4 if packed is not None else 0
    if four:
        xq = np.zeros(four * k // 32 * 34, np.uint8)
        for g in range(0, four, 4):
            cpu.ggml_quantize_mat_q8_0_4x8(np.ascontiguousarray(x[g : g + 4]).ctypes.data,
                                           xq[g * k // 32 * 34 :].ctypes.data, k)  # fmt: skip
        cpu.ggml_gemm_mxfp4_8x8_q8_0(k, out.ctypes.data, n, packed.ctypes.data, xq.ctypes.data,
                                     four, n)  # fmt: skip
    for r in range(four, m):
        xq = np.zeros(k // 32 * 34, np.uint8)
        from_float(np.ascontiguousarray(x[r]).ctypes.data, xq.ctypes.data, k)
        if packed is not None:
            cpu.ggml_gemv_mxfp4_8x8_q8_0(k, out[r].ctypes.data, 0, packed.ctypes.data,
                                         xq.ctypes.data, 1, n)  # fmt: skip
            continue
        for j in range(n):
            vec_dot(k, s.ctypes.data, 0, raw[j].ctypes.data, 0, xq.ctypes.data, 0, 1)
            out[r, j] = s[0]
    return out


@pytest.mark.parametrize("shape", [(37, 512), (16, 2880), (7, 96), (24, 352)])
def test_mxfp4_products_equal_llama_cpps_own(fused, shape):
    cpu = _ggml_cpu()
    n, k = shape
    rng = np.random.default_rng(n + k)
    raw = mxfp4_rows(n, k, rng)
    for m in (1, 5, 8):
        x = rng.normal(size=(m, k)).astype(np.float32)
        got = product(raw, "MXFP4", n, k, x, 2, structs.ACT_INT)
        want = llama_cpp_product(cpu, raw, x)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (m, got - want)
