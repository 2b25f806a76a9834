"""``attnlm compare`` on a tiny text with a tiny budget: table, compare.json, PNG, resume."""

import json
import math

import pytest

import attnlm.apps.compare as compare
import attnlm.cli.compare as compare_cli
from attnlm.base.errors import ConfigError
from attnlm.cli import main

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
    "Second Citizen:\nWe are accounted poor citizens, the patricians good.\n\n"
) * 10

TINY = ["--set", "ffnn:model.n_hidden=32", "--set", "lstm:model.n_embd=16"]
TINY += ["--set", "gru:model.n_embd=16", "--set", "rnn:model.n_embd=16"]
TINY += ["--set", "gpt:model.n_embd=32", "--set", "gpt:model.n_layer=1"]
TINY += ["--set", "llama:model.n_embd=32", "--set", "llama:model.n_layer=1"]
KEYS = {"model", "params", "train_seconds", "tokens_per_second", "val_bpc", "ppl"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run(tmp_path, models, budget="1s", extra=()):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    argv = ["compare", "--text", str(corpus), "--time-budget", budget, "--models", models, *extra]
    argv += ["--out", str(tmp_path / "cmp"), "--eval-interval", "5", "--no-progress", *TINY]
    return main(argv)


def forbid_training(monkeypatch):
    def fail(*_a, **_k):
        raise AssertionError("a finished model was trained again")

    monkeypatch.setattr(compare, "run_ngram", fail)
    monkeypatch.setattr(compare, "run_neural", fail)


def check_outputs(out, models):
    data = json.loads((out / "compare.json").read_text())
    assert [r["model"] for r in data["rows"]] == models
    for row in data["rows"]:
        assert set(row) == KEYS
        assert row["params"] > 0 and row["train_seconds"] > 0 and row["tokens_per_second"] > 0
        assert 0 < row["val_bpc"] < 8 and row["ppl"] >= 1
        assert math.isfinite(row["val_bpc"])
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    return data


@pytest.mark.slow
def test_compare_ngram_and_lstm_then_resume(tmp_path, capsys, monkeypatch):
    assert run(tmp_path, "ngram,lstm") == 0
    table = capsys.readouterr().out
    assert "val bits/char" in table and "ngram" in table and "lstm" in table
    data = check_outputs(tmp_path / "cmp", ["ngram", "lstm"])
    # all scored on the same characters; the char-level n-gram's bits/char and perplexity
    # per token agree (1 char per token)
    ngram = data["rows"][0]
    assert abs(math.log2(ngram["ppl"]) - ngram["val_bpc"]) < 1e-3
    forbid_training(monkeypatch)
    assert run(tmp_path, "ngram,lstm") == 0
    assert "already done" in capsys.readouterr().out
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"] == data["rows"]


def test_compare_shows_llama_beside_gpt(tmp_path, capsys):
    assert run(tmp_path, "gpt,llama") == 0
    table = capsys.readouterr().out
    rows = [
        line.split()[0] for line in table.splitlines() if line.split()[:1] in (["gpt"], ["llama"])
    ]
    assert rows == ["gpt", "llama"]
    data = check_outputs(tmp_path / "cmp", ["gpt", "llama"])
    gpt, llama = data["rows"]
    assert llama["params"] != gpt["params"]
    meta = json.loads((tmp_path / "cmp" / "llama" / "checkpoint" / "config.json").read_text())
    assert meta["model"]["type"] == "llama" and meta["model"]["n_kv_head"] == 2


def test_compare_refuses_bad_flags(tmp_path, capsys):
    assert run(tmp_path, "ngram,transformerxl") == 2
    assert "unknown model" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="budget"):
        compare.CompareConfig(budget="soon")
    with pytest.raises(ConfigError, match="MODEL:KEY"):
        compare_cli._parse_sets(["ngram:order=3"])


@pytest.mark.slow
def test_compare_every_model_then_resume_trains_nothing(tmp_path, capsys, monkeypatch):
    models = list(compare.MODELS)
    assert run(tmp_path, ",".join(models)) == 0
    check_outputs(tmp_path / "cmp", models)
    for name in models[1:]:
        assert (tmp_path / "cmp" / name / "checkpoint").is_dir()
    forbid_training(monkeypatch)
    capsys.readouterr()
    assert run(tmp_path, ",".join(models)) == 0
    assert capsys.readouterr().out.count("already done") == len(models)


@pytest.mark.slow
def test_compare_bpe_scores_every_model_on_the_same_characters(tmp_path):
    extra = ["--tokenizer", "bpe", "--bpe-vocab-size", "300"]
    assert run(tmp_path, "ngram,ffnn", extra=extra) == 0
    data = check_outputs(tmp_path / "cmp", ["ngram", "ffnn"])
    # bits per token / bits per char = characters per target token, the same for both rows
    ratios = [math.log2(r["ppl"]) / r["val_bpc"] for r in data["rows"]]
    # (rows are rounded to 4 decimals: a near-zero n-gram bits/char leaves ~1% error)
    assert ratios[0] > 1.2 and abs(ratios[0] - ratios[1]) < 0.02 * ratios[0]


def test_a_changed_set_trains_that_model_again_and_only_it(tmp_path, capsys):
    """A family's earlier result is keyed by its own ``--set`` values: after
    ``--set lstm:model.n_layer=1`` the LSTM is trained again (and has one layer), the GRU,
    whose settings did not change, is reused."""

    def lstm_params():
        rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"]
        return next(r["params"] for r in rows if r["model"] == "lstm")

    assert run(tmp_path, "lstm,gru") == 0
    layers = json.loads((tmp_path / "cmp" / "lstm" / "checkpoint" / "config.json").read_text())
    assert layers["model"]["n_layer"] == 2
    two_layers = lstm_params()
    capsys.readouterr()
    assert run(tmp_path, "lstm,gru", extra=["--set", "lstm:model.n_layer=1"]) == 0
    out = capsys.readouterr().out
    assert "gru: already done" in out and "lstm: already done" not in out
    config = json.loads((tmp_path / "cmp" / "lstm" / "checkpoint" / "config.json").read_text())
    assert config["model"]["n_layer"] == 1
    assert lstm_params() < two_layers
    # back to the first settings: trained again, not the one-layer result
    assert run(tmp_path, "lstm,gru") == 0
    assert "lstm: already done" not in capsys.readouterr().out
