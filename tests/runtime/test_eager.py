"""The flat one-token decoding step (:mod:`attnlm.runtime.eager`) against the model's
forward: logits within 1e-5 at every position and the same greedy tokens over 64 steps, for
gpt (every position scheme it serves, biases or not) and llama (MHA and GQA), with the
growing and the static cache; and the cases it must leave to the forward."""

from __future__ import annotations

import pytest
import torch

import support_runtime
from attnlm.generate import SamplingConfig, decode
from attnlm.generate.options import DecodeOptions
from attnlm.nn.cache import KVCache
from attnlm.nn.static_cache import StaticKVCache
from attnlm.runtime import eager
from attnlm.runtime.eager import flat_step, flat_step_applies

V = 50


@pytest.fixture(autouse=True)
def _pytorch_path(monkeypatch):
    """The flat step is the eager backend's: the C step (tests/runtime/test_cstep.py) off."""
    monkeypatch.setenv("ATTNLM_NATIVE", "0")


def gpt(**kw):
    return support_runtime.gpt(V, **kw)


def llama(**kw):
    return support_runtime.llama(V, **kw)


MODELS = {
    "gpt learned": lambda: gpt(),
    "gpt rope, no bias": lambda: gpt(positions="rope", bias=False),
    "gpt sinusoidal": lambda: gpt(positions="sinusoidal"),
    "gpt none, swish": lambda: gpt(positions="none", activation="gelu_tanh"),
    "llama MHA": lambda: llama(),
    "llama GQA": lambda: llama(n_kv_head=2),
    "llama MQA, tied": lambda: llama(n_kv_head=1, tie_embeddings=True),
    # partial rotary (Phi-4 mini's shape): the first 6 of each head's 8 features turn
    "llama GQA, partial rotary": lambda: llama(n_kv_head=2, rotary_dim=6),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("static", [False, True])
def test_logits_equal_the_forward(name, static):
    model = MODELS[name]()
    torch.manual_seed(1)
    prompt = torch.randint(V, (3, 5))
    new = torch.randint(V, (3, 20))

    def state():
        return StaticKVCache(model.config.n_layer, 40) if static else KVCache(model.config.n_layer)

    with torch.inference_mode():
        flat_state, ref_state = state(), state()
        model(prompt, cache=flat_state)
        model(prompt, cache=ref_state)
        for t in range(new.shape[1]):
            tok = new[:, t : t + 1]
            assert flat_step_applies(model, tok, flat_state)
            got = flat_step(model, tok, flat_state)  # (B, 1, V)
            want = model(tok, cache=ref_state).logits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert flat_state.length == ref_state.length == 25


@pytest.mark.parametrize("name", ["gpt learned", "gpt rope, no bias", "llama GQA"])
def test_greedy_tokens_equal_over_64_steps(name, monkeypatch):
    model = MODELS[name]()
    with torch.no_grad():  # larger weights: the tokens depend on the context
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.lm_head:
                module.weight.mul_(8)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    greedy = SamplingConfig(temperature=0, max_new_tokens=64)
    calls = []
    real = eager.flat_step

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(eager, "flat_step", counted)
    for static in (True, False):
        runner = eager.EagerRunner(model)
        got = decode(
            model, prompts, greedy, DecodeOptions(static=static, lookahead=0, runner=runner)
        )
        assert calls, "the flat step did not run"
        plain = eager.EagerRunner(model)
        plain.flat = False  # the forward at every step
        want = decode(
            model, prompts, greedy, DecodeOptions(static=static, lookahead=0, runner=plain)
        )
        assert got == want
        assert len(set(got[0])) > 3  # not one token repeated


def test_left_to_the_forward():
    model = llama()
    tok = torch.tensor([[1]])
    cache = KVCache(model.config.n_layer)
    with torch.inference_mode():
        assert flat_step_applies(model, tok, cache)
        assert not flat_step_applies(model, torch.tensor([[1, 2]]), cache)  # a prompt
        fixed = StaticKVCache(model.config.n_layer, 8)
        fixed.fixed = True
        assert not flat_step_applies(model, tok, fixed)  # a compiled step's buffers
        model.train()
        assert not flat_step_applies(model, tok, cache)
        model.eval()
    assert not flat_step_applies(model, tok, cache)  # gradients on
    with torch.inference_mode():
        assert not flat_step_applies(gpt(positions="alibi"), tok, cache)
        assert not flat_step_applies(gpt(norm="post"), tok, cache)
        with pytest.raises(Exception, match="out of range"):
            flat_step(model, torch.tensor([[V]]), cache)
