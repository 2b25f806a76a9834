"""The planner (attnlm.runtime.planner): one decision per decode, named with its reason, the
same decision whether it is only described (``choose``, ``attnlm params``) or built
(``runner_for``), and the commands say it (``generate --json``, ``params``)."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm import native
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.rnn import RNNLM, RNNConfig
from attnlm.quant.layers import quantize_weights
from attnlm.runtime.planner import BACKENDS, choose, runner_for

needs_c = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")


def gpt(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, block_size=32, n_layer=1, n_head=2, n_embd=32, **kw)
    return GPT(GPTConfig(**cfg)).eval()


def rnn():
    torch.manual_seed(0)
    return RNNLM(RNNConfig(vocab_size=40, n_embd=16, n_layer=1)).eval()


MODELS = {
    "gpt": gpt,
    "gpt q4": lambda: quantize_weights(gpt(), "q4"),
    "gpt alibi": lambda: gpt(positions="alibi"),
    "rnn": rnn,
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("asked", [None, "eager"])
def test_described_and_built_agree(name, asked):
    model = MODELS[name]()
    described = choose(model, backend=asked)
    runner = runner_for(model, backend=asked)
    assert (runner.name, runner.reason) == described and runner.name in BACKENDS


@needs_c
def test_what_rules_the_c_step_out_is_said(monkeypatch):
    assert choose(gpt()) == ("c-step", "f32 weights on the CPU: each step is one C call")
    assert choose(quantize_weights(gpt(), "q4"))[1].startswith("q4 weights")
    name, reason = choose(gpt(positions="alibi"))
    assert name == "eager" and "ALiBi" in reason
    assert "not a causal decoder" in choose(rnn())[1]
    with torch.device("meta"):  # params' shapes-only model stands for the CPU model
        assert choose(gpt())[0] == "c-step"
    assert choose(gpt(), compile=True)[0] == "compiled"
    monkeypatch.setenv("ATTNLM_NATIVE", "0")
    assert choose(gpt()) == ("eager", "ATTNLM_NATIVE=0")


@needs_c
def test_generate_json_and_params_name_the_backend(cli, tmp_path, monkeypatch):
    cli("train", "--preset", "tiny-test", "--text", _corpus(tmp_path), "--out", tmp_path / "run",
        "--max-iters", "2", "--no-progress")  # fmt: skip
    args = ("generate", "--checkpoint", tmp_path / "run", "--prompt", "To", "--max-new-tokens",
            "4", "--json")  # fmt: skip
    record = json.loads(cli(*args).out.strip().splitlines()[-1])
    assert record["backend"] == "c-step" and "C call" in record["backend_reason"]
    assert "decoding backend: c-step" in cli("params", "--preset", "tiny-test").out
    monkeypatch.setenv("ATTNLM_NATIVE", "0")
    record = json.loads(cli(*args).out.strip().splitlines()[-1])
    assert (record["backend"], record["backend_reason"]) == ("eager", "ATTNLM_NATIVE=0")
    assert "decoding backend: eager (ATTNLM_NATIVE=0)" in cli("params", "--preset", "tiny-test").out


def _corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("To be, or not to be, that is the question.\n" * 40, encoding="utf-8")
    return path
