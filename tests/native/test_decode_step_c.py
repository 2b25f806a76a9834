"""The C decode step's library (src/attnlm/native: decode_step.c built on first use): it builds
where there is a compiler, each of its products equals the dequantized float32 product, each
activation equals PyTorch's, and without a compiler decoding says so once and runs eager. The
step inside a model is tests/runtime/test_cstep.py."""

from __future__ import annotations

import ctypes

import pytest
import torch

import support_runtime
from attnlm import native
from attnlm.nn.cache import KVCache
from attnlm.runtime import cstep as ns
from attnlm.runtime.planner import runner_for
from support_runtime import FORMATS, with_reference

V = 300


def llama(**kw):
    return support_runtime.llama(V, **{"n_head": 6, "n_embd": 96, "d_ff": 160, **kw})


def c_path(monkeypatch):
    monkeypatch.setenv("ATTNLM_NATIVE", "1")


# only a machine without a C compiler skips these: a source that does not compile fails them
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")


def test_the_c_step_builds_where_there_is_a_compiler(monkeypatch):
    c_path(monkeypatch)
    assert native.library() is not None, native.why_not


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(64, 64), (70, 96), (300, 160), (40, 33), (8300, 35)])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_product_equals_the_dequantized_one(fmt, shape, threads):
    """Each kernel alone (``attnlm_linear``): one block, padded rows, several groups, a width
    that is not a multiple of 16 (float formats only; 8 and 4 bits need groups of 32); the
    column-major product with 1, 5, 16 and 32 rows of x and more columns than one tile of its
    sums holds (8300 > 8192 columns at one row, several tiles at 5 and more)."""
    n, k = shape
    if k % 32 and fmt in ("q8", "q4"):
        pytest.skip("8- and 4-bit weights come in groups of 32")
    if n > 300 and fmt != "f32 column-major":
        pytest.skip("the tiles of partial sums are the column-major product's")
    torch.manual_seed(n + k)
    layer = torch.nn.Linear(k, n)
    model = torch.nn.Sequential(layer)
    quantized, reference = with_reference(model, fmt)
    keep: list = []
    described = ns._describe_linear(quantized[0], keep)
    for rows in (1, 5, 16, 32) if fmt == "f32 column-major" else (1, 5):
        x = torch.randn(rows, k)
        y = torch.empty(rows, n)
        part = torch.empty(threads, rows, n)  # the column-major product's partial sums
        ns._library().attnlm_linear(
            ctypes.byref(described),
            ctypes.c_void_p(x.data_ptr()),
            ctypes.c_int64(rows),
            ctypes.c_void_p(y.data_ptr()),
            ctypes.c_void_p(part.data_ptr()),
            threads,
        )
        with torch.no_grad():
            torch.testing.assert_close(y, reference(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("kind", "name"), [(0, "swiglu"), (1, "gelu"), (2, "gelu_tanh"),
                                            (3, "relu")])  # fmt: skip
def test_each_activation_equals_pytorchs(kind, name, monkeypatch):
    """The step's activations alone (``attnlm_activate``; SiLU and GELU's tanh form 16 lanes
    at a time through the step's own e^x), over -100..100, zeros and tiny values, 16-lane
    pieces and a scalar tail: within 2e-6 of PyTorch's (relative to the value's size)."""
    c_path(monkeypatch)
    torch.manual_seed(0)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-7, 87.5, -87.5, 88.5, -88.5])
    x = torch.cat([torch.linspace(-100, 100, 4001), torch.randn(1000) * 4, edges])
    up = torch.randn(x.numel())
    h = torch.cat([x, up]) if name == "swiglu" else x.clone()
    ns._library().attnlm_activate(kind, ctypes.c_void_p(h.data_ptr()), x.numel())
    if name == "swiglu":
        want = torch.nn.functional.silu(x.double()) * up.double()
    elif name == "gelu_tanh":
        want = torch.nn.functional.gelu(x.double(), approximate="tanh")
    else:
        want = {"gelu": torch.nn.functional.gelu, "relu": torch.relu}[name](x.double())
    got = h[: x.numel()].double()
    assert torch.isfinite(got).all()
    assert ((got - want).abs() <= 2e-6 * (1 + want.abs())).all(), (got - want).abs().max()


def test_without_a_compiler_decoding_says_so_once_and_takes_pytorch(monkeypatch, capsys):
    model = llama()
    monkeypatch.setattr(native, "_TRIED", False)
    monkeypatch.setattr(native, "_LIBRARY", None)
    monkeypatch.setattr(ns, "_NOTED", [False])
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with torch.inference_mode():
        cache = KVCache(2)
        first, second = runner_for(model), runner_for(model)
        assert first.name == second.name == "eager" and "no C compiler" in first.reason
        logits = first.step(torch.tensor([[1]]), cache)  # the PyTorch path
    assert logits.shape == (1, 1, V)
    err = capsys.readouterr().err
    assert err.count("eager path") == 1 and "CC names '/nonexistent/cc'" in err
    monkeypatch.setattr(native, "_TRIED", False)  # the next test builds (or loads) it again
