"""Gradient checkpointing (``train.grad_checkpoint``, ``--grad-checkpoint``): the same loss and
gradients as the plain backward (dropout included: the recomputation replays its random
numbers), far fewer bytes kept for the backward, ``auto`` on exactly when the measured
activations exceed half the free memory, and a training run that says it is on."""

from __future__ import annotations

import pytest
import torch

from attnlm.train import checkpointing
from support import attnlm_process
from support_runtime import gpt, llama


def _saved_bytes(model, ids) -> int:
    """Bytes of the tensors autograd keeps for the backward (parameters left out), counted
    by this test's own hook."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, targets=ids).loss.backward()
    return sum(seen.values())


def _grads(model, ids, on: bool, seed: int = 3):
    model.zero_grad()
    model.checkpoint_blocks = on
    torch.manual_seed(seed)
    loss = model(ids, targets=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_checkpointed_blocks_give_the_same_loss_and_gradients(make):
    model = make(n_layer=3, dropout=0.1).train()
    ids = torch.randint(50, (2, 24), generator=torch.Generator().manual_seed(0))
    plain_loss, plain = _grads(model, ids, on=False)
    loss, grads = _grads(model, ids, on=True)
    assert torch.equal(loss, plain_loss)
    for name, g in plain.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-6, atol=1e-7, msg=name)
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_checkpointing_keeps_far_fewer_bytes_and_the_estimate_scales():
    model = llama(n_layer=4, n_embd=64, d_ff=128, block_size=128).train()
    ids = torch.randint(50, (4, 96), generator=torch.Generator().manual_seed(1))
    model.checkpoint_blocks = False
    plain = _saved_bytes(model, ids)
    model.checkpoint_blocks = True
    kept = _saved_bytes(model, ids)
    assert kept < plain / 2, (kept, plain)
    one = checkpointing.activation_bytes(model, 4, 96, torch.device("cpu"))
    assert 0.5 * plain < one <= plain  # the blocks' share of the whole step
    twice = checkpointing.activation_bytes(model, 8, 96, torch.device("cpu"))
    assert twice == pytest.approx(2 * one, rel=0.02)  # (the rotary tables do not grow)


def test_auto_turns_it_on_when_activations_pass_half_the_free_memory(monkeypatch):
    model = llama(n_layer=2).train()
    need = checkpointing.activation_bytes(model, 2, 32, torch.device("cpu"))
    monkeypatch.setattr(checkpointing, "free_bytes", lambda device: 2 * need - 1)
    on = checkpointing.setup(model, "auto", 2, 32, "cpu")
    assert on.on and model.checkpoint_blocks and on.why.startswith("on: activations")
    monkeypatch.setattr(checkpointing, "free_bytes", lambda device: 2 * need)
    off = checkpointing.setup(model, "auto", 2, 32, "cpu")
    assert not off.on and not model.checkpoint_blocks
    assert checkpointing.setup(model, "on", 2, 32, "cpu").on and model.checkpoint_blocks
    assert not checkpointing.choose("off", model, 2, 32, "cpu").on


def test_a_model_without_decoder_blocks_is_left_alone():
    from attnlm.models.ffnn import FFNNLM  # no blocks to checkpoint

    choice = checkpointing.choose("on", FFNNLM.__new__(FFNNLM), 2, 8, "cpu")
    assert not choice.on and "not applicable to FFNNLM" in choice.why


def test_free_memory_is_read_from_the_machine():
    assert checkpointing.free_bytes(torch.device("cpu")) > 1 << 20


def test_a_run_with_grad_checkpoint_on_says_so_and_trains(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 200, encoding="utf-8")
    run = tmp_path / "run"
    r = attnlm_process("train", "--preset", "tiny-test", "--text", text,
                       "--max-iters", "3", "--grad-checkpoint", "on", "--out", run,
                       "--no-progress", timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "gradient checkpointing on (train.grad_checkpoint)" in r.stdout + r.stderr
    assert (run / "checkpoint").is_dir()
    bad = attnlm_process("train", "--grad-checkpoint", "sometimes", timeout=60)
    assert bad.returncode == 2 and "--grad-checkpoint" in bad.stderr
