"""``--backward-precision bfloat16`` (:func:`attnlm.nn.fused.bf16_backward`): the forward and
the loss are the float32 ones, bit for bit; the gradients are float32's within bfloat16's
input rounding, and not identical to them (the bfloat16 products really ran)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.support import ROMEO, loss_curve

from attnlm.lora.layers import apply_lora
from attnlm.models import registry
from attnlm.nn import fused, grad_precision

WHY = fused.bf16_backward_support()
needs_bf16 = pytest.mark.skipif(WHY is not None, reason=f"bf16 backward: {WHY}")

V = 64
TABLES = {
    "llama": dict(type="llama", vocab_size=V, block_size=64, n_layer=2, n_head=4, n_kv_head=2,
                  n_embd=64, d_ff=128),
    "gpt": dict(type="gpt", vocab_size=V, block_size=64, n_layer=2, n_head=4, n_embd=64),
}  # fmt: skip


def build(family, lora=False, loss_chunk=0):
    torch.manual_seed(0)
    model, _, _ = registry.build(dict(TABLES[family]))
    fused.use_onednn(model)  # what the trainer does for this setting (GPT's nn.Linear too)
    if lora:
        apply_lora(model, 4, 8, 0.0, "all")
        with torch.no_grad():  # non-zero B, so every adapter gradient is non-zero
            for name, p in model.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0, 0.2)
    if loss_chunk:
        model.loss_chunk = loss_chunk
    return model.train()


def loss_and_grads(model, ids, bf16):
    model.zero_grad(set_to_none=True)
    with fused.bf16_backward(bf16):
        loss = model(ids[:, :-1], ids[:, 1:]).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@needs_bf16
@pytest.mark.parametrize(
    "family,lora,chunk",
    [("llama", False, 0), ("gpt", False, 0), ("llama", True, 16), ("gpt", True, 0)],
)
def test_loss_is_float32s_and_gradients_are_close_but_bfloat16(family, lora, chunk):
    model = build(family, lora, chunk)
    ids = torch.randint(V, (4, 49), generator=torch.Generator().manual_seed(1))
    loss32, g32 = loss_and_grads(model, ids, False)
    loss16, g16 = loss_and_grads(model, ids, True)
    assert torch.equal(loss16, loss32)  # the forward pass is untouched
    assert g16.keys() == g32.keys() and g32
    errors = {n: rel(g16[n], g32[n]) for n in g32}
    assert max(errors.values()) < 3e-2, errors  # bfloat16 inputs: about 2^-8 per product
    # the products of the backward did run in bfloat16 (gradients fed by them differ)
    assert sum(e > 1e-6 for e in errors.values()) >= len(errors) // 2, errors


@needs_bf16
def test_chunked_head_loss_gradients():
    torch.manual_seed(0)
    h = torch.randn(200, 128, requires_grad=True)  # oneDNN's bf16 mode skips tiny products
    w = torch.randn(500, 128, requires_grad=True)
    t = torch.randint(500, (200,))
    t[3] = -100
    want = F.cross_entropy(h @ w.t(), t, reduction="sum")
    dh, dw = torch.autograd.grad(want, (h, w))
    with fused.bf16_backward():
        got = fused.chunked_head_loss(h, w, t, rows=64)
    gh, gw = torch.autograd.grad(got, (h, w))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    for a, b in ((gh, dh), (gw, dw)):
        assert 1e-6 < rel(a, b) < 2e-2


@needs_bf16
def test_setting_is_scoped_and_pytorchs_flag_restored():
    mm = torch.backends.mkldnn.matmul
    before = mm.fp32_precision
    model = build("llama")
    ids = torch.randint(V, (2, 17))
    with fused.bf16_backward():
        loss = model(ids[:, :-1], ids[:, 1:]).loss
    assert not grad_precision._BF16_BACKWARD  # the block ended: new forwards are float32 again
    loss.backward()  # the products recorded inside it still run in bfloat16
    assert mm.fp32_precision == before


def test_config_refusals(cli, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(ROMEO, encoding="utf-8")
    common = ("train", "--text", text, "--out", tmp_path / "r", "--max-iters", "1",
              "--no-progress", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
              "--set", "model.n_head=2", "--set", "model.block_size=16")  # fmt: skip
    r = cli(*common, "--backward-precision", "bfloat16", "--dtype", "bfloat16")
    assert r.code == 2 and "backward_precision bfloat16 is for float32" in r.err
    assert len(r.err.strip().splitlines()) == 1
    r = cli(*common, "--backward-precision", "bfloat16", "--compile")
    assert r.code == 2 and "does not apply to a compiled model" in r.err
    r = cli(*common, "--set", 'train.backward_precision="f16"')
    assert r.code == 2 and "train.backward_precision must be one of float32, bfloat16" in r.err


def test_unsupported_machine_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(
        grad_precision, "bf16_backward_support", lambda: "this CPU has no bfloat16 x"
    )
    text = tmp_path / "t.txt"
    text.write_text(ROMEO, encoding="utf-8")
    r = cli("train", "--text", text, "--out", tmp_path / "r", "--max-iters", "1",
            "--no-progress", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
            "--set", "model.n_head=2", "--set", "model.block_size=16",
            "--device", "cpu", "--backward-precision", "bfloat16")  # fmt: skip
    assert r.code == 2
    assert (
        r.err.strip() == "attnlm: error: --backward-precision bfloat16: this CPU has no bfloat16 x"
    )


@needs_bf16
def test_a_run_starts_from_the_same_loss_and_trains(cli, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(ROMEO * 3, encoding="utf-8")
    runs = {}
    for precision in ("float32", "bfloat16"):
        runs[precision] = tmp_path / precision
        r = cli("train", "--text", text, "--out", runs[precision], "--max-iters", "30",
                "--no-progress", "--set", "model.n_layer=2", "--set", "model.n_embd=32",
                "--set", "model.n_head=2", "--set", "model.block_size=32", "--lr", "3e-3",
                "--set", "train.log_interval=1", "--seed", "3", "--device", "cpu",
                "--backward-precision", precision)  # fmt: skip
        assert r.code == 0, r.err
    f32, b16 = loss_curve(runs["float32"]), loss_curve(runs["bfloat16"])
    assert b16[1] == f32[1]  # the same first forward pass
    assert b16[2] != f32[2]  # the first update came from other gradients
    assert b16[30] < 0.8 * b16[1] and abs(b16[30] - f32[30]) < 0.1 * f32[30]
