"""ATTNLM_DOCS_BUDGET: set, every training loop is capped (the doc tests run the README's
commands with it); unset, nothing changes; a bad value is a one-line ConfigError."""

from __future__ import annotations

import json

import pytest

from attnlm.base.errors import ConfigError
from attnlm.base.validate import DOCS_BUDGET_ENV, docs_budget
from attnlm.train.config import TrainConfig
from attnlm.word2vec.config import Word2VecConfig


def test_unset_changes_nothing(monkeypatch):
    monkeypatch.delenv(DOCS_BUDGET_ENV, raising=False)
    assert docs_budget() is None
    cfg = TrainConfig(max_iters=5000, eval_iters=20, eval_interval=250, warmup_iters=100)
    assert (cfg.max_iters, cfg.eval_iters, cfg.eval_interval, cfg.warmup_iters) == (
        5000, 20, 250, 100,
    )  # fmt: skip
    assert Word2VecConfig(epochs=5).epochs == 5


def test_set_caps_steps_evaluation_and_epochs(monkeypatch):
    monkeypatch.setenv(DOCS_BUDGET_ENV, "3")
    cfg = TrainConfig(max_iters=5000, eval_iters=20, eval_interval=250, warmup_iters=100)
    assert (cfg.max_iters, cfg.eval_iters, cfg.eval_interval, cfg.warmup_iters) == (3, 3, 3, 3)
    assert TrainConfig(max_iters=2, warmup_iters=0).max_iters == 2  # below the cap: as given
    assert Word2VecConfig(epochs=5).epochs == 1


def test_train_command_stops_at_the_budget(cli, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv(DOCS_BUDGET_ENV, "2")
    r = cli("train", "--preset", "tiny-test", "--text", corpus, "--max-iters", "500",
            "--no-progress", "--out", tmp_path / "run")  # fmt: skip
    assert r.code == 0, r.err
    assert "done: 2 steps" in r.out


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_bad_value_is_one_line(monkeypatch, value):
    monkeypatch.setenv(DOCS_BUDGET_ENV, value)
    with pytest.raises(ConfigError, match=DOCS_BUDGET_ENV):
        TrainConfig()


def test_eval_scores_a_slice(cli, corpus, tmp_path, monkeypatch):
    """`attnlm eval` under the budget scores at most N x 1,000 tokens (--max-tokens lower still
    applies); unset, the whole split."""
    monkeypatch.setenv(DOCS_BUDGET_ENV, "1")
    run = tmp_path / "run"
    r = cli("train", "--preset", "tiny-test", "--text", corpus, "--no-progress", "--out", run)
    assert r.code == 0, r.err
    text = tmp_path / "long.txt"
    text.write_text(corpus.read_text() * 3, encoding="utf-8")  # ~9,000 characters

    def tokens(*extra):
        r = cli("eval", "--checkpoint", run, "--text", text, "--json", *extra)
        assert r.code == 0, r.err
        return json.loads(r.out)["tokens"]

    assert tokens() <= 1000 and tokens("--max-tokens", "300") <= 300
    monkeypatch.delenv(DOCS_BUDGET_ENV)
    assert tokens() > 5000
