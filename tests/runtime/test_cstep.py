"""The C decode step (attnlm.runtime.cstep, the ``c-step`` backend) against the PyTorch
forward: the same logits (within float rounding) for every weight format, one and several rows
and new tokens, and the cache left as the forward would leave it."""

from __future__ import annotations

import pytest
import torch

import support_runtime
from attnlm import native
from attnlm.base.errors import InputError
from attnlm.generate import SamplingConfig, decode
from attnlm.generate.lookahead import drop_newest
from attnlm.generate.options import DecodeOptions
from attnlm.lora.layers import apply_lora
from attnlm.nn.cache import KVCache
from attnlm.nn.layout import decoding_layout
from attnlm.nn.static_cache import StaticKVCache
from attnlm.quant.layers import quantize_weights
from attnlm.runtime import cstep as ns
from attnlm.runtime.eager import EagerRunner
from attnlm.runtime.planner import runner_for

# only a machine without a C compiler skips these: a source that does not compile fails them
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")


V = 300  # > 64 rows of LM head, not a multiple of 64 (the q4 layout pads)


def gpt(**kw):
    return support_runtime.gpt(V, **{"n_head": 3, "n_embd": 96, **kw})


def llama(**kw):  # its norms' gains away from 1, so a wrong gain shows
    cfg = {"n_head": 6, "n_embd": 96, "d_ff": 160}
    return support_runtime.llama(V, **{**cfg, **kw})


MODELS = {
    "gpt learned": lambda: gpt(),
    "gpt rope, no bias, relu": lambda: gpt(positions="rope", bias=False, activation="relu"),
    "gpt sinusoidal, gelu_tanh": lambda: gpt(positions="sinusoidal", activation="gelu_tanh"),
    "llama GQA": lambda: llama(n_kv_head=2),
    "llama MQA, tied": lambda: llama(n_kv_head=1, tie_embeddings=True),
    "llama GQA, layer 1 without positions": lambda: llama(n_kv_head=2, nope_layers=(1,)),
    # partial rotary (Phi-4 mini's shape): the first 12 of each head's 16 features rotate
    "llama GQA, partial rotary": lambda: llama(n_kv_head=2, rotary_dim=12),
    # heads 64 and 128 wide: attention's 16-lane path for those widths (32 above; 16: generic)
    "gpt heads of 64": lambda: gpt(n_head=2, n_embd=128),
    "llama heads of 128, GQA": lambda: llama(n_head=2, n_kv_head=1, n_embd=256),
}
FORMATS, in_format, with_reference = (support_runtime.FORMATS, support_runtime.in_format,
                                      support_runtime.with_reference)  # fmt: skip


def c_path(monkeypatch):
    monkeypatch.setenv("ATTNLM_NATIVE", "1")


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_equal_the_forward(name, fmt, monkeypatch):
    model, reference = with_reference(MODELS[name](), fmt)
    torch.manual_seed(1)
    prompt, new = torch.randint(V, (2, 7)), torch.randint(V, (2, 10))
    with torch.inference_mode():
        ref, ours = KVCache(2), KVCache(2)
        # the prompt whole (8 and 4 bits) or in pieces of 2 tokens x 2 rows (float weights: the
        # C step takes at most MAX_FLOAT_ROWS rows; the forward's bf16 GEMM would round the
        # activations), then 8 single tokens and 2 more
        whole = fmt in ("q8", "q4")
        feeds = [prompt] if whole else [prompt[:, i : i + 2] for i in range(0, 7, 2)]
        feeds += [new[:, t : t + 1] for t in range(8)] + [new[:, 8:]]
        runner = ns.CStepRunner(model)
        for ids in feeds:
            want = reference(ids, cache=ref).logits
            assert runner.covers(ids, ours)
            got = runner.step(ids, ours)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert ours.length == ref.length == 17 and ours.position == ref.position
        for a, b in zip(ours.keys + ours.values, ref.keys + ref.values):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["gpt rope, no bias, relu", "llama GQA"])
def test_thirty_two_rows_of_column_major_weights(name, monkeypatch):
    """The decoding layout's float32 weights take up to MAX_FLOAT_ROWS_T rows (batch 32 at one
    token, or 4 rows of 8): the same logits as the forward, and 33 rows go to PyTorch."""
    model, reference = with_reference(MODELS[name](), "f32 column-major")
    torch.manual_seed(3)
    with torch.inference_mode():
        ref, ours = KVCache(2), KVCache(2)
        runner = ns.CStepRunner(model)
        for ids in (torch.randint(V, (4, 8)), torch.randint(V, (4, 1)), torch.randint(V, (4, 7))):
            want = reference(ids, cache=ref).logits
            assert runner.covers(ids, ours)
            torch.testing.assert_close(runner.step(ids, ours), want, atol=1e-4, rtol=1e-4)
        assert ns.MAX_FLOAT_ROWS_T == 32
        assert not runner.covers(torch.randint(V, (33, 1)), KVCache(2))
        assert runner.covers(torch.randint(V, (32, 1)), KVCache(2))


@pytest.mark.parametrize("name", ["gpt learned", "llama MQA, tied"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("native", [True, False])
def test_last_only_gives_the_last_positions_logits(name, fmt, native, monkeypatch):
    """``step(..., last_only=True)`` (a prompt's prefill): each row's last logits alone, as the
    whole forward gives them, and the same cache after it (the C step and PyTorch's)."""
    if fmt == "bf16" and not native:
        pytest.skip("the PyTorch path's bfloat16 kernels may round activations (no reference)")
    model, reference = with_reference(MODELS[name](), fmt)
    torch.manual_seed(2)
    ids = torch.randint(V, (2, 7 if fmt in ("q8", "q4") else 2))  # float: at most 4 rows
    with torch.inference_mode():
        ref, ours = KVCache(2), KVCache(2)
        want = reference(ids, cache=ref).logits[:, -1:]
        runner = ns.CStepRunner(model) if native else EagerRunner(model)
        assert runner.covers(ids, ours) if native else True
        got = runner.step(ids, ours, last_only=True)
        assert got.shape == (2, 1, V)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for a, b in zip(ours.keys + ours.values, ref.keys + ref.values):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        with pytest.raises(InputError, match="last_only"):
            model(ids, targets=ids, last_only=True)


@pytest.mark.parametrize("fmt", ["f32", "q4"])
@pytest.mark.parametrize("name", ["gpt learned", "llama GQA"])
def test_greedy_tokens_equal_over_64_steps(name, fmt, monkeypatch):
    model = MODELS[name]()
    with torch.no_grad():  # larger weights: the tokens depend on the context
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.lm_head:
                module.weight.mul_(6)
    model = in_format(model, fmt)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7, 8]]
    greedy = SamplingConfig(temperature=0, max_new_tokens=64)
    calls = []
    real = ns.CStepRunner.c_step
    monkeypatch.setattr(ns.CStepRunner, "c_step", lambda *a: calls.append(1) or real(*a))
    for lookahead in (0, 4):  # the drafts' multi-token checks go through the C step too
        calls.clear()
        rows = prompts[:1] if lookahead else prompts
        runner = ns.CStepRunner(model)
        got = decode(model, rows, greedy, DecodeOptions(lookahead=lookahead, runner=runner))
        assert len(calls) > 10
        want = decode(
            model, rows, greedy, DecodeOptions(lookahead=lookahead, runner=EagerRunner(model))
        )
        assert got == want
        assert len(set(got[0])) > 3  # not one token repeated


def test_the_cache_stays_an_ordinary_cache(monkeypatch):
    """Steps of the C path and of the forward interleave on one cache; trimming (lookahead),
    reordering (beam search) and a replaced tensor are all followed."""
    model = llama(n_kv_head=2)
    torch.manual_seed(2)
    ids = torch.randint(V, (2, 30))
    runner = ns.CStepRunner(model)
    with torch.inference_mode():
        ref, ours = KVCache(2), KVCache(2)
        model(ids[:, :20], cache=ref)
        model(ids[:, :20], cache=ours)  # a prefill by the forward, then C steps
        for t in range(20, 24):
            runner.step(ids[:, t : t + 1], ours)
        drop_newest(ours, 2)  # rejected drafts: the C buffers are trimmed by a view
        model(ids[:, 20:22], cache=ref)
        ours.reorder(torch.tensor([1, 0]))  # beam search: new tensors, copied in again
        ref.reorder(torch.tensor([1, 0]))
        ours.trim(15)
        ref.trim(15)
        got = runner.step(ids[:, 22:25], ours)
        want = model(ids[:, 22:25], cache=ref).logits
        got2 = model(ids[:, 25:26], cache=ours).logits  # the forward after C steps
        want2 = model(ids[:, 25:26], cache=ref).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got2, want2, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("max_len", [None, 40])
def test_a_static_cache_keeps_its_own_buffers(max_len, monkeypatch):
    """Decoding's default state: the C step writes into the static cache's buffers, so its own
    appends (the forward's) continue them; past ``max_len`` it refuses as the forward does."""
    model = llama(n_kv_head=2)
    torch.manual_seed(3)
    ids = torch.randint(V, (1, 45))
    runner = ns.CStepRunner(model)
    with torch.inference_mode():
        ref, ours = KVCache(2), StaticKVCache(2, max_len)
        want = [model(ids[:, :20], cache=ref).logits]
        want += [model(ids[:, t : t + 1], cache=ref).logits for t in range(20, 30)]
        want.append(model(ids[:, 30:38], cache=ref).logits)
        got = [model(ids[:, :20], cache=ours).logits]  # the prefill: the forward's append
        got += [runner.step(ids[:, t : t + 1], ours) for t in range(20, 30)]
        assert ours.keys[0].data_ptr() == ours.k_buf[0].data_ptr()  # its buffers, not copies
        got.append(model(ids[:, 30:38], cache=ours).logits)  # its own append after C steps
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        if max_len is not None:
            with pytest.raises(InputError, match="holds 40 positions"):
                for t in range(38, 45):
                    runner.step(ids[:, t : t + 1], ours)


def test_each_runner_describes_its_model_once():
    """The C description belongs to the runner (no state on the model): a model changed after
    one runner was built gets a new runner with a new description, and the same logits."""
    model = llama()
    tok = torch.tensor([[5]])
    with torch.inference_mode():
        first = ns.CStepRunner(model)
        first.step(tok, KVCache(2))
        assert "_native_plan" not in vars(model)
        decoding_layout(model)  # the weights move to new memory
        quantize_weights(model, "q8")  # the layers are replaced
        second = ns.CStepRunner(model)
        assert second.c is not first.c
        got = second.step(tok, KVCache(2))
        want = EagerRunner(model).step(tok, KVCache(2))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_left_to_pytorch():
    """What the C step does not cover goes to the eager backend: per call (too many rows, a
    compiled step's fixed buffers, training, gradients) and per model (the planner's
    reasons)."""
    model = llama()
    tok = torch.tensor([[1]])
    cache = KVCache(2)
    runner = ns.CStepRunner(model)
    with torch.inference_mode():
        assert runner.covers(tok, cache)
        assert runner.covers(torch.randint(V, (1, ns.MAX_FLOAT_ROWS)), cache)
        assert not runner.covers(torch.randint(V, (1, ns.MAX_FLOAT_ROWS + 1)), cache)
        q4 = ns.CStepRunner(quantize_weights(llama(), "q4"))
        assert q4.covers(torch.randint(V, (1, ns.MAX_TOKENS)), cache)
        assert not q4.covers(torch.randint(V, (1, ns.MAX_TOKENS + 1)), cache)
        fixed = StaticKVCache(2, 8)
        fixed.fixed = True
        assert not runner.covers(tok, fixed)  # a compiled step's buffers
        model.train()
        assert not runner.covers(tok, cache)
        model.eval()
    assert not runner.covers(tok, cache)  # gradients on
    assert "ALiBi" in ns.why_not_supported(gpt(positions="alibi"))
    assert ns.why_not_supported(gpt(norm="post")) is not None
    assert ns.why_not_supported(llama().double()) is not None
    adapted = apply_lora(llama(), 4, targets=("q", "v"))
    assert "adapters" in ns.why_not_supported(adapted.eval())
    assert ns.why_not_supported(model) is None
    for name, why in ((gpt(positions="alibi"), "ALiBi"), (llama(), "weights on the CPU")):
        chosen = runner_for(name)
        assert why in chosen.reason, chosen.reason


def test_the_planner_names_the_backend_and_why(monkeypatch):
    model = llama()
    assert runner_for(model).name == "c-step"
    assert runner_for(model, backend="eager").name == "eager"
    monkeypatch.setenv("ATTNLM_NATIVE", "0")
    chosen = runner_for(model)
    assert (chosen.name, chosen.reason) == ("eager", "ATTNLM_NATIVE=0")
    with pytest.raises(RuntimeError, match="c-step"):
        runner_for(model, backend="c-step")
