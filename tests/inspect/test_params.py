"""Parameter counting: per-module rows, the 12·L·d² estimate, and ``attnlm params``."""

from __future__ import annotations

import pytest
import torch

from attnlm.cli import main
from attnlm.inspect.params import count_params, lecture_estimate, param_rows
from attnlm.models.gpt import GPT, GPTConfig


def test_rows_add_up_and_tied_head_counts_once():
    cfg = GPTConfig(vocab_size=100, block_size=16, n_layer=3, n_head=2, n_embd=8)
    model = GPT(cfg)
    rows = param_rows(model)
    top = [r for r in rows if not r.per_layer]
    assert sum(r.count for r in top) == count_params(model) == model.num_params()
    head = next(r for r in rows if r.name == "lm_head")
    assert head.count == 0 and head.note == "tied"
    block = [r for r in rows if r.per_layer]
    stack = next(r for r in rows if r.name.startswith("blocks"))
    assert stack.name == "blocks (3 x)" and stack.count == 3 * sum(r.count for r in block)
    # by hand, one block of width d: 2 LN (2·2d) + attention (4d² + 4d) + MLP (8d² + 5d)
    d = 8
    assert sum(r.count for r in block) == 4 * d + 4 * d * d + 4 * d + 8 * d * d + 5 * d
    untied = GPT(GPTConfig(**{**cfg.__dict__, "tie_embeddings": False}))
    assert next(r for r in param_rows(untied) if r.name == "lm_head").count == 100 * 8


def test_lecture_estimate():
    assert lecture_estimate(12, 768) == 84_934_656


def test_cli_gpt2_small(capsys):
    assert main(["params", "--preset", "gpt2-small"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out and "84,934,656" in out
    assert "tied" in out and "blocks (12 x)" in out


def test_cli_preset_without_vocab(tmp_path, capsys):
    preset = tmp_path / "char.toml"
    preset.write_text(
        "[model]\nblock_size = 64\nn_layer = 4\nn_head = 4\nn_embd = 128\n[train]\nlr = 1e-3\n"
    )
    assert main(["params", "--preset", str(preset), "--vocab-size", "65"]) == 0
    with torch.device("meta"):
        expected = GPT(
            GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
        ).num_params()
    assert f"{expected:,}" in capsys.readouterr().out
    assert main(["params", "--preset", str(preset)]) == 0
    assert "using 256 from the default" in capsys.readouterr().out
    preset.write_text(preset.read_text() + "bpe_vocab_size = 1024\n")
    assert main(["params", "--preset", str(preset)]) == 0
    assert "using 1024 from train.bpe_vocab_size" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, message",
    [
        ("[model]\nvocab_size=10\nblock_size=8\nn_layer=1\nn_head=3\nn_embd=8\n", "model.n_embd"),
        ("[model]\nvocab_size=10\nblock_size=8\nn_layer=1\nn_head=2\nn_embd=8\nwidth=3\n",
         "model.width"),
        ("[train]\nlr=1\n", "no [model] table"),
    ],
)  # fmt: skip
def test_cli_bad_presets(tmp_path, capsys, text, message):
    preset = tmp_path / "bad.toml"
    preset.write_text(text)
    assert main(["params", "--preset", str(preset)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("kv, tied", [(4, True), (2, False), (1, True)])
def test_llama_formula_equals_the_exact_count(kv, tied):
    from attnlm.inspect.params import kv_cache_bytes_per_token, llama_count
    from attnlm.models.llama import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=50, block_size=16, n_layer=3, n_head=4, n_kv_head=kv,
                      n_embd=32, d_ff=40, tie_embeddings=tied)  # fmt: skip
    with torch.device("meta"):
        model = Llama(cfg)
    # by hand, one block of width d = 32: W_Q, W_O (d² each), W_K, W_V (d·8·kv each),
    # gate, up, down (d·40 each), two RMSNorm weights (d each)
    block = 2 * 32 * 32 + 2 * 32 * 8 * kv + 3 * 32 * 40 + 2 * 32
    assert llama_count(cfg) == count_params(model) == 3 * block + 50 * 32 * (1 + (not tied)) + 32
    assert kv_cache_bytes_per_token(cfg) == 2 * 3 * kv * 8 * 4


def test_cli_llama_char(capsys):
    assert main(["params", "--preset", "llama-char", "--vocab-size", "65"]) == 0
    out = capsys.readouterr().out
    from attnlm.inspect.params import llama_count
    from attnlm.models.llama import LlamaConfig

    cfg = LlamaConfig(vocab_size=65, block_size=128, n_layer=4, n_head=4, n_kv_head=2,
                      n_embd=128, d_ff=352, tie_embeddings=True)  # fmt: skip
    exact = next(line for line in out.splitlines() if line.startswith("total (exact)"))
    assert exact.split()[-1] == f"{llama_count(cfg):,}"
    assert f"= {llama_count(cfg):,}" in out and "Hkv=2 (GQA)" in out
    assert "2,048 bytes float32" in out and "of multi-head attention's 4,096" in out
    assert "12·L·d² estimate" not in out
