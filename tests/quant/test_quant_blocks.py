"""The block formats (:mod:`attnlm.quant.blocks`, numpy alone) against ``gguf.quants``, the
format's reference implementation: every ggml type dequantized bit for bit, Q8_0 / Q4_0 / Q4_1
read as codes and scales that hold the same values, and llama.cpp's Q8_0 / Q4_0 quantizers
byte for byte."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from attnlm.base.errors import InputError
from attnlm.quant import blocks
from attnlm.quant.blocks import codes, dequantize, quantize_q4_0, quantize_q8_0
from gguf_support import ALL_TYPES, Q, encode_tensor, gguf, random_k_blocks

# -- ggml blocks -> float32 ----------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_dequantize_equals_gguf_for_every_type(qtype):
    """Bit-identical to ``gguf.quants.dequantize`` (quantized by ``gguf.quants.quantize``, or
    random K-quant blocks, which that package cannot make)."""
    rng = np.random.default_rng(1)
    values = rng.normal(size=(6, 512)).astype(np.float32)
    data, held = encode_tensor(values, qtype, rng)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    ours = dequantize(raw.copy(), int(Q[qtype]), values.shape)
    assert np.array_equal(ours, gguf.quants.dequantize(np.asarray(data), Q[qtype]).reshape(6, 512))
    assert np.array_equal(ours, held)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q4_1"])
def test_dequantize_in_cache_sized_pieces_and_into_a_slice(qtype, monkeypatch):
    """Many pieces (a tiny chunk size) and writing into rows of a larger array give the same
    numbers as one piece."""
    rng = np.random.default_rng(2)
    block, size = gguf.GGML_QUANT_SIZES[Q[qtype]]
    raw = (
        random_k_blocks(qtype, 40, rng).reshape(-1)
        if qtype != "Q4_1"
        else gguf.quants.quantize(rng.normal(size=(5, 256)).astype(np.float32), Q[qtype])
    )
    raw = np.ascontiguousarray(raw).reshape(-1)
    shape = (raw.size // size * block // 256, 256)
    whole = dequantize(raw.copy(), int(Q[qtype]), shape)
    monkeypatch.setattr(blocks, "CHUNK_ELEMENTS", 256)
    big = np.zeros((shape[0] + 2, 256), np.float32)
    dequantize(raw.copy(), int(Q[qtype]), shape, out=big[1:-1])
    assert np.array_equal(big[1:-1], whole)
    assert not big[0].any() and not big[-1].any()


def test_mxfp4_blocks_hold_the_values_worked_out_by_hand():
    """Four MXFP4 blocks, byte j of each holding nibble j (low: element j) and 15 - j (high:
    element j + 16), at the E8M0 bytes e = 128 (scale 1), 127 (1/2), 1 (2^-127, a subnormal
    float32) and 0 (2^-128); then e = 255: 2^127, so values of 2 or more are infinite. Hand
    values: twice E2M1's (0, 0.5, 1, 1.5, 2, 3, 4, 6; nibbles 8-15 the negatives)."""
    table = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    qs = [j | (15 - j) << 4 for j in range(16)]
    raw = np.array([[e, *qs] for e in (128, 127, 1, 0, 255)], np.uint8)
    got = dequantize(raw.reshape(-1), int(Q.MXFP4), (5, 32))
    at_one = np.array(table + table[::-1], np.float32)
    assert np.array_equal(got[0], at_one)
    assert got[0, 7] == 12 and got[0, 16] == -12 and got[0, 31] == 0
    assert np.array_equal(got[1], at_one / 2) and got[1, 5] == 3.0
    for row, power in ((2, -127), (3, -128)):
        assert np.array_equal(got[row], np.ldexp(at_one.astype(np.float64), power))
    assert got[3, 1] == np.float32(2.0**-128) > 0  # the smallest: a subnormal, not zero
    assert got[4, 1] == np.float32(2.0**127) and np.isinf(got[4, 2]) and got[4, 8] == 0
    assert np.array_equal(got[:4], gguf.quants.dequantize(raw[:4], Q.MXFP4))


def test_unsupported_type_names_tensor_and_type():
    with pytest.raises(InputError, match=r"w: tensor type IQ2_XXS is not supported"):
        dequantize(np.zeros(66, np.uint8), int(Q.IQ2_XXS), (256,), name="w")


# -- ggml blocks -> codes ------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_codes_hold_the_values_dequantize_gives(qtype):
    """``s q`` (q8) and ``d u + m`` (q4), in float32 from the float16 scales, are the file's
    values bit for bit; the format is :data:`~attnlm.quant.blocks.NATIVE_FORMAT`'s."""
    rng = np.random.default_rng(3)
    values = rng.normal(size=(70, 96)).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(values, Q[qtype])).reshape(-1)
    want = dequantize(raw.copy(), int(Q[qtype]), values.shape)
    c = codes(raw, qtype, values.shape)
    g = (70, 3, 32)
    if blocks.NATIVE_FORMAT[qtype] == "q8":
        assert c["q"].dtype == np.int8 and c["s"].dtype == np.float16
        got = c["q"].reshape(g) * c["s"].astype(np.float32)[..., None]
    else:
        assert c["u"].dtype == np.uint8 and c["u"].max() <= 15 and c["d"].dtype == np.float16
        d, m = (c[key].astype(np.float32)[..., None] for key in "dm")
        got = c["u"].reshape(g) * d + m
    assert np.array_equal(got.reshape(values.shape), want)


def test_pack_q4_pads_rows_to_whole_blocks():
    rng = np.random.default_rng(4)
    u = rng.integers(0, 16, size=(70, 64), dtype=np.uint8)
    d, m = (rng.normal(size=(70, 2)).astype(np.float16) for _ in "dm")
    packed, scales = blocks.pack_q4(u, d, m)
    assert packed.shape == (128, 32) and scales.shape == (2, 2, 64, 2)
    assert np.array_equal(packed[:64], blocks.pack_int4(u[:64]))
    assert np.array_equal(scales[1, :, :6, 0], d[64:].T) and not scales[1, :, 6:].any()


# -- float32 -> ggml blocks ----------------------------------------------------------------------


@pytest.mark.parametrize(("ours", "qtype"), [(quantize_q8_0, "Q8_0"), (quantize_q4_0, "Q4_0")])
def test_quantizers_match_gguf_reference_bytes(ours, qtype):
    x = np.random.default_rng(0).normal(size=(16, 128)).astype(np.float32) * 3
    x[0, :32] = 0  # an all-zero block: scale 0
    x[1, :32] = np.arange(32) / 2.0 - 8  # halves: rounding direction matters
    x[2, :4] = [2.0, -2.0, 1.0, 0.5]  # equal magnitudes: the first one wins
    expected = gguf.quants.quantize(x, Q[qtype])
    assert np.array_equal(ours(x), expected)


def test_quantizers_refuse_rows_not_multiple_of_32():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.zeros((2, 40), np.float32))


def test_the_block_formats_import_no_torch():
    """The C engine reads the blocks without PyTorch."""
    code = "import sys, attnlm.quant.blocks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
