"""The fused CPU kernels of ``attnlm.nn.fused`` against the straightforward computations:
every hand-written backward passes ``torch.autograd.gradcheck`` in float64, and in float32
the forward and the gradients equal those of the plain PyTorch ops (``F.linear``,
``F.rms_norm``, split + ``apply_rotary``) within 1e-5."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from attnlm.nn import fused
from attnlm.nn.attention import apply_rotary
from attnlm.nn.blocks import RMSNorm, SwiGLU
from attnlm.nn.positional import RotaryEmbedding

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def grads(fn, *inputs, seed=1):
    """Output and input gradients of ``fn(*inputs)`` against a fixed random cotangent."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    torch.autograd.backward(outs, cot)
    return [o.detach() for o in outs], [t.grad for t in leaves if t.requires_grad]


def assert_close(a, b, tol=1e-5):
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        assert (x - y).abs().max().item() <= tol * max(1.0, y.abs().max().item())


# -- linear -----------------------------------------------------------------------------------


@pytest.mark.parametrize("k, m", [(6, 10), (10, 6)])  # both branches of the weight gradient
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("onednn", [True, False])
def test_linear_backward_gradcheck(k, m, bias, onednn):
    x = torch.randn(3, 5, k, dtype=torch.float64, requires_grad=True)
    w = torch.randn(m, k, dtype=torch.float64, requires_grad=True)
    b = torch.randn(m, dtype=torch.float64, requires_grad=True) if bias else None
    assert gradcheck(lambda *t: fused._Linear.apply(*t, onednn), (x, w, b))


@pytest.fixture(params=[True, False], ids=["onednn", "mkl"])
def onednn(request, monkeypatch):
    """Run a test with oneDNN's kernel chosen (where this PyTorch has it) and without."""
    if request.param and not fused.onednn_available():
        pytest.skip("this PyTorch has no oneDNN float32 linear kernel")
    monkeypatch.setattr(fused, "onednn_preferred", lambda: request.param)
    return request.param


@pytest.mark.parametrize("k, m", [(24, 56), (56, 24)])
@pytest.mark.parametrize("x_grad", [True, False])
def test_linear_equals_f_linear(k, m, x_grad, onednn):
    x = torch.randn(4, 16, k, requires_grad=x_grad)  # 64 rows: the oneDNN path where chosen
    assert fused._use_onednn(x.detach(), torch.empty(m, k)) == onednn
    w, b = torch.randn(m, k, requires_grad=True), torch.randn(m, requires_grad=True)
    ours = grads(fused.linear, x, w, b)
    ref = grads(F.linear, x, w, b)
    assert_close(ours[0] + ours[1], ref[0] + ref[1])


def test_linear_takes_onednn_only_where_it_applies(onednn):
    x, w = torch.randn(64, 24), torch.randn(40, 24)
    assert fused._use_onednn(x, w) == onednn
    with torch.no_grad():  # inference: the kernel without the autograd Function
        assert_close([fused.linear(x, w)], [F.linear(x, w)])
    small = torch.randn(fused.ONEDNN_MIN_ROWS - 1, 24)
    assert not fused._use_onednn(small, w)
    assert torch.equal(fused.linear(small, w), F.linear(small, w))
    assert not fused._use_onednn(x.double(), w.double())
    enabled, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, False
    try:
        assert not fused._use_onednn(x, w)
        assert torch.equal(fused.linear(x, w), F.linear(x, w))
    finally:
        torch.backends.mkldnn.enabled = enabled
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused._use_onednn(x, w)
        assert fused.linear(x, w).dtype == torch.bfloat16  # autocast still applies


def test_a_short_input_takes_onednn_only_for_a_large_product(onednn):
    """From ONEDNN_SMALL_ROWS rows a product of ONEDNN_MIN_WORK multiply-adds (a 16-token prompt
    through a 768-wide layer) takes oneDNN where it is preferred, with F.linear's numbers; a
    narrow layer or fewer rows stays on F.linear."""
    rows, k = fused.ONEDNN_SMALL_ROWS, 256
    m = fused.ONEDNN_MIN_WORK // (rows * k)
    x, w, b = torch.randn(rows, k), torch.randn(m, k), torch.randn(m)
    assert fused._use_onednn(x, w) == onednn
    with torch.no_grad():
        assert_close([fused.linear(x, w, b)], [F.linear(x, w, b)])
    assert not fused._use_onednn(x, w[: m - 1])  # one multiply-add row short of the work
    assert not fused._use_onednn(x[: rows - 1], w)


INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\n"


def test_onednn_is_preferred_where_mkl_is_not_tuned(monkeypatch):
    """MKL's tuned paths run on Intel CPUs: oneDNN only elsewhere (AMD), unless forced."""
    assert fused.mkl_tuned(INTEL)
    assert fused.mkl_tuned(INTEL * 2)
    assert not fused.mkl_tuned(INTEL.replace("GenuineIntel", "AuthenticAMD"))
    assert not fused.mkl_tuned("")  # no vendor line (ARM): not Intel
    for value, want in (("1", fused.onednn_available()), ("0", False)):
        monkeypatch.setenv(fused.ONEDNN_ENV, value)
        fused.onednn_preferred.cache_clear()
        try:
            assert fused.onednn_preferred() == want
        finally:
            fused.onednn_preferred.cache_clear()
    monkeypatch.delenv(fused.ONEDNN_ENV)
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        intel = fused.mkl_tuned(f.read())
    assert fused.onednn_preferred() == (fused.onednn_available() and not intel)


def test_linear_module_is_nn_linear():
    layer = fused.Linear(24, 40)
    plain = torch.nn.Linear(24, 40)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 40, 24)
    assert isinstance(layer, torch.nn.Linear)
    assert_close([layer(x)], [plain(x)])


# -- RMSNorm ----------------------------------------------------------------------------------


def plain_rms_norm(x, w, eps):
    """The formula itself: x / sqrt(mean(x²) + eps) · γ."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_rms_norm_backward_gradcheck():
    x = torch.randn(3, 4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, w: fused.rms_norm(x, w, 1e-6), (x, w))


def test_rms_norm_equals_the_formula_and_torch():
    x, w = 3 * torch.randn(4, 16, 48) + 1, torch.randn(48, requires_grad=True)
    x.requires_grad_()
    ours = grads(lambda x, w: fused.rms_norm(x, w, 1e-5), x, w)
    ref = grads(lambda x, w: plain_rms_norm(x, w, 1e-5), x, w)
    aten = grads(lambda x, w: F.rms_norm(x, (48,), w, 1e-5), x, w)
    assert_close(ours[0] + ours[1], ref[0] + ref[1])
    assert_close(ours[0] + ours[1], aten[0] + aten[1])
    norm = RMSNorm(48, eps=1e-5)
    assert isinstance(norm, torch.nn.RMSNorm)
    assert_close([norm(x)], [F.rms_norm(x, (48,), norm.weight, 1e-5)])


# -- SwiGLU with oneDNN projections ------------------------------------------------------------


def test_swiglu_with_onednn_linear_by_hand(onednn):
    ff = fused.use_onednn(SwiGLU(24, 40))
    assert type(ff.fc) is fused.Linear and type(ff.proj) is fused.Linear
    x = torch.randn(4, 16, 24, requires_grad=True)

    def by_hand(x):
        g, u = F.linear(x, ff.fc.weight).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, ff.proj.weight)

    ours, ref = grads(ff, x), grads(by_hand, x)
    assert_close(ours[0] + ours[1], ref[0] + ref[1])


def test_use_onednn_keeps_parameters_ties_and_numbers(onednn):
    """use_onednn swaps the computation only: the same parameters (a tied head stays tied),
    the same state-dict keys, the same logits and gradients as nn.Linear."""
    from attnlm.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    plain = GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=32))
    fast = GPT(plain.config)
    fast.load_state_dict(plain.state_dict())
    params = [id(p) for p in fast.parameters()]
    fused.use_onednn(fast)
    assert [id(p) for p in fast.parameters()] == params
    assert fast.lm_head.weight is fast.tok_emb.weight
    assert list(fast.state_dict()) == list(plain.state_dict())
    assert all(type(m) is not torch.nn.Linear for m in fast.modules())
    ids = torch.randint(0, 40, (4, 24))
    a, b = plain(ids, targets=ids), fast(ids, targets=ids)
    assert_close([a.logits], [b.logits])
    a.loss.backward(), b.loss.backward()
    assert_close([p.grad for p in plain.parameters()], [p.grad for p in fast.parameters()])


# -- rotary positions on the fused projection -------------------------------------------------


def plain_rotary_heads(qkv, cos, sin, n_head, n_kv_head):
    """Split, heads, then apply_rotary to q and k (attention.py's unfused path)."""
    B, T, width = qkv.shape
    D = width // (n_head + 2 * n_kv_head)
    q, k, v = qkv.split([n_head * D, n_kv_head * D, n_kv_head * D], dim=-1)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def angles(B, T, D, per_row, dtype=torch.float32):
    rope = RotaryEmbedding(D, base=100.0)
    positions = torch.randint(0, 50, (B, T)) if per_row else torch.arange(3, 3 + T)
    return tuple(t.to(dtype) for t in rope(positions))  # (T, D) or (B, 1, T, D)


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("n_head, n_kv_head", [(4, 4), (4, 2), (6, 1)])
def test_rotary_heads_backward_gradcheck(per_row, n_head, n_kv_head):
    B, T, D = 2, 3, 4
    cos, sin = angles(B, T, D, per_row, torch.float64)
    qkv = torch.randn(B, T, (n_head + 2 * n_kv_head) * D, dtype=torch.float64)
    qkv.requires_grad_()
    assert gradcheck(lambda t: fused.rotary_heads(t, cos, sin, n_head, n_kv_head), (qkv,))
    # an output that gets no gradient (k unused) gives zeros there
    assert gradcheck(lambda t: fused.rotary_heads(t, cos, sin, n_head, n_kv_head)[::2], (qkv,))


@pytest.mark.parametrize("per_row", [False, True])
def test_rotary_heads_equal_split_and_apply_rotary(per_row):
    B, T, D, H, Hkv = 3, 16, 8, 4, 2
    cos, sin = angles(B, T, D, per_row)
    qkv = torch.randn(B, T, (H + 2 * Hkv) * D, requires_grad=True)
    ours = grads(lambda t: fused.rotary_heads(t, cos, sin, H, Hkv), qkv)
    ref = grads(lambda t: plain_rotary_heads(t, cos, sin, H, Hkv), qkv)
    assert [t.shape for t in ours[0]] == [(B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)]
    assert_close(ours[0] + ours[1], ref[0] + ref[1])
    with torch.no_grad():  # inference: the same one-pass forward without the Function
        assert_close(fused.rotary_heads(qkv, cos, sin, H, Hkv), ref[0])


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_chunked_head_loss_is_cross_entropy(rows, onednn):
    """Loss and gradients (hidden states and head weight) of the chunked head against
    ``F.cross_entropy`` of the full logits, ignored targets included."""
    torch.manual_seed(0)
    h = torch.randn(50, 16, requires_grad=True)
    w = torch.randn(37, 16, requires_grad=True)
    t = torch.randint(0, 37, (50,))
    t[::5] = -100
    want = torch.nn.functional.cross_entropy(h @ w.T, t, reduction="sum")
    gh, gw = torch.autograd.grad(2.5 * want, (h, w))
    got = fused.chunked_head_loss(h, w, t, rows=rows)
    dh, dw = torch.autograd.grad(2.5 * got, (h, w))
    assert torch.allclose(got, want, rtol=1e-5)
    assert torch.allclose(dh, gh, atol=1e-5) and torch.allclose(dw, gw, atol=1e-4)
    frozen = fused.chunked_head_loss(h, w.detach(), t, rows=rows)
    (only,) = torch.autograd.grad(frozen, (h,))
    assert torch.allclose(only, gh / 2.5, atol=1e-5)


def test_swiglu_matches_the_plain_ops():
    torch.manual_seed(0)
    gu = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    assert gradcheck(fused.swiglu, (gu,))
    g, u = gu.chunk(2, dim=-1)
    want = F.silu(g) * u
    dy = torch.randn_like(want)
    (ref,) = torch.autograd.grad(want, gu, dy)
    (got,) = torch.autograd.grad(fused.swiglu(gu), gu, dy)
    assert torch.allclose(got, ref, atol=1e-12)
