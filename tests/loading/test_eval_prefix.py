"""``eval --max-tokens N`` (issue 15): only a prefix of the text is encoded, and the result is
the exact evaluation of the first N tokens."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from attnlm.loading.checkpoint import save_checkpoint
from attnlm.loading.evaluation import evaluate_checkpoint, evaluate_ids
from attnlm.models import registry
from attnlm.tokenizers import CharTokenizer
from attnlm.train.config import TrainConfig

LINE = "the quick brown fox jumps over the lazy dog\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("evalprefix")
    text = d / "big.txt"
    text.write_text(LINE * 20000, encoding="utf-8")  # 880k characters
    tok = CharTokenizer.train(LINE)
    torch.manual_seed(0)
    table = {"type": "gpt", "vocab_size": tok.vocab_size, "block_size": 16, "n_layer": 1}
    model, cfg, family = registry.build({**table, "n_head": 1, "n_embd": 8})
    config = {"step": 0, "preset": "t", "model": registry.config_table(family, cfg)}
    config["train"] = dataclasses.asdict(TrainConfig(text=str(text)))
    save_checkpoint(d / "run" / "checkpoint", model, config, tok, {})
    return d, text, tok, model


def test_max_tokens_encodes_a_prefix_only(run, monkeypatch):
    d, text, tok, model = run
    encoded = []
    real = CharTokenizer.encode

    def counting(self, s):
        encoded.append(len(s))
        return real(self, s)

    monkeypatch.setattr(CharTokenizer, "encode", counting)
    result, what = evaluate_checkpoint(str(d / "run"), str(text), max_tokens=1000, device="cpu")
    assert sum(encoded) < 20_000, f"encoded {sum(encoded):,} characters for 1,000 tokens"
    ids = np.asarray(real(tok, LINE * 30)[:1000], dtype=np.int64)
    want = evaluate_ids(model, ids, 1000, 16, 16, "cpu")
    assert result.tokens == want.tokens and result.loss == pytest.approx(want.loss, rel=1e-6)
    assert result.bpc == pytest.approx(want.bpc, rel=1e-6)  # 1 char per token here
    assert "first 1,000 tokens" in what
