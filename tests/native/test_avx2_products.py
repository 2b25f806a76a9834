"""The C step built for x86-64-v3 (AVX2, FMA and F16C without AVX-512: most laptops) against
the build for this CPU: every product of weights in ggml's blocks equals, bit for bit, that of
this CPU's build (which the llama.cpp fixtures check on AVX-512 CPUs: tests/runtime/
test_engine_llamacpp.py). Without AVX-512 the products take their 8-lane kernels (pmaddubsw
integer sums, two weight rows of Q8_0 / Q4_0 / Q5_0 side by side, K-quant blocks in halves of
32 bytes, ``ggml_blocks.h``); the numbers must not change. Every block type, integer and float
activations, 1 to 9 rows of x (8 together, then one at a time), rows of 8k (Q4_K, Q4_0 and
MXFP4 as llama.cpp's repacked kernels sum them) and not, an odd number of blocks of 32. The
step's own formats (f32, bf16, q8, q4: ``avx2_rows.h``) and its attention: a decoder's logits,
bit for bit."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import support_runtime
from attnlm import native
from attnlm.native import structs
from attnlm.nn.cache import KVCache
from attnlm.runtime import cstep as ns
from gguf_support import block_size, encode_tensor

TYPES = ["F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
         "IQ4_NL", "IQ4_XS", "MXFP4"]  # fmt: skip
V3 = "x86-64-v3"

pytestmark = [
    pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)"),
    pytest.mark.skipif(
        not {"avx2", "fma", "f16c"} <= set(native._cpu_flags().split()),
        reason="a CPU with AVX2, FMA and F16C to run an x86-64-v3 build",
    ),
]


def _load(march: str | None) -> tuple[ctypes.CDLL, frozenset[str]]:
    """The library :func:`native.library` loads for ``march`` (None: this CPU's), and its
    features; the module's state and the environment come back afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("_TRIED", "_LIBRARY", "why_not", "built"):
            mp.setattr(native, name, getattr(native, name))
        mp.setattr(native, "_TRIED", False)
        mp.delenv(native.MARCH_ENV, raising=False)
        if march:
            mp.setenv(native.MARCH_ENV, march)
        lib = native.library()
        assert lib is not None, native.why_not
        return lib, native.features()


@pytest.fixture(scope="module")
def builds() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    (here, _), (v3, names) = _load(None), _load(V3)
    assert {"avx2", "fma", "f16c"} <= names and "avx512f" not in names, names
    return here, v3


def product(lib, raw, qtype, n, k, x, threads, act) -> np.ndarray:
    layer = structs.Linear(structs.GGML_FORMATS[qtype], n, k, n, raw.ctypes.data, None, None, act)
    m = x.shape[0]
    y = np.full((m, n), np.nan, np.float32)
    part = np.empty(threads * m * n, np.float32)
    lib.attnlm_linear(ctypes.byref(layer), x.ctypes.data, m, y.ctypes.data, part.ctypes.data,
                      threads)  # fmt: skip
    return y


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", [(37, 512), (64, 1024), (8, 608), (7, 96), (16, 256)])
@pytest.mark.parametrize("act", ["float", "int"])
def test_the_avx2_products_equal_this_cpus_bit_for_bit(builds, qtype, shape, act):
    n, k = shape
    if k % block_size(qtype):
        pytest.skip("K-quant rows come in blocks of 256")
    rng = np.random.default_rng(n + k)
    data, _ = encode_tensor(rng.normal(size=(n, k)).astype(np.float32), qtype, rng)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(n, -1)
    code = structs.ACT_FLOAT if act == "float" else structs.ACT_INT
    for m in (1, 2, 3, 4, 5, 8, 9):
        x = rng.normal(size=(m, k)).astype(np.float32)
        x[:, :32] *= 0.01  # blocks of different scales
        here, v3 = (product(lib, raw, qtype, n, k, x, 2, code) for lib in builds)
        assert np.array_equal(here.view(np.uint32), v3.view(np.uint32)), (qtype, m, act)


@pytest.mark.parametrize("fmt", support_runtime.FORMATS)
def test_the_avx2_step_equals_this_cpus_bit_for_bit(builds, fmt, monkeypatch):
    """A GQA Llama in ``fmt``: a 20-token prompt (attention over 16 keys at once), then single
    tokens, two sequences; every logit of the x86-64-v3 build equals this CPU's build's."""
    model = support_runtime.in_format(
        support_runtime.llama(300, n_head=6, n_kv_head=2, n_embd=96, d_ff=160), fmt
    )
    torch.manual_seed(5)
    ids = torch.randint(300, (2, 24))
    feeds = [ids[:, :20], *(ids[:, t : t + 1] for t in range(20, 24))]
    logits = []
    for lib in builds:
        monkeypatch.setattr(native, "_LIBRARY", lib)
        monkeypatch.setattr(native, "_TRIED", True)
        runner, cache = ns.CStepRunner(model), KVCache(2)
        with torch.inference_mode():
            logits.append(torch.cat([runner.step(x, cache).reshape(2, -1) for x in feeds], 1))
    assert torch.equal(logits[0].view(torch.int32), logits[1].view(torch.int32)), fmt
