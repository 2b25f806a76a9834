"""Trainer: schedule, optimizer groups, configs/presets, CLI train/eval/generate, bad input."""

import json
import math
from pathlib import Path

import pytest
import torch

from attnlm.base.config import list_presets
from attnlm.base.errors import ConfigError
from attnlm.cli import main
from attnlm.train.config import TrainConfig, load_spec, parse_duration
from attnlm.train.optim import lr_at, param_groups

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def train_cli(corpus, out, *extra):
    argv = ["train", "--preset", "tiny-test", "--text", str(corpus), "--out", str(out)]
    return main(argv + ["--no-progress", *extra])


# -- schedule and optimizer ------------------------------------------------------------------


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=110)
    assert lr_at(0, cfg) == pytest.approx(1e-3 / 11)
    assert lr_at(9, cfg) == pytest.approx(1e-3 * 10 / 11)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4)  # halfway: cos(pi/2) = 0
    assert lr_at(110, cfg) == pytest.approx(1e-4)
    lrs = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    # with a wall-clock budget the cosine follows the larger of step and time fractions
    assert lr_at(20, cfg, time_fraction=0.5) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lr_at(20, cfg, time_fraction=1.0) == pytest.approx(1e-4)


def test_weight_decay_on_matrices_only():
    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
    )
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and len(decay["params"]) == 2
    assert all(p.dim() == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 3


# -- configs and presets ---------------------------------------------------------------------


def test_presets_load_and_build():
    from attnlm.models import registry
    from attnlm.models.gpt import GPTConfig

    names = list_presets()
    assert {"tiny-test", "shakespeare-char", "shakespeare-bpe"} <= set(names)
    for name in ("tiny-test", "shakespeare-char", "shakespeare-bpe"):
        spec = load_spec(name)
        family, cfg = registry.make_config({**spec.model, "vocab_size": 65})
        assert family.type == "gpt" and isinstance(cfg, GPTConfig)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="unknown config key train.lrate"):
        load_spec("tiny-test", ["train.lrate=1"])
    with pytest.raises(ConfigError, match="train.batch_size must be int"):
        load_spec("tiny-test", ["batch_size=1.5"])
    with pytest.raises(ConfigError, match="train.lr must be > 0"):
        load_spec("tiny-test", ["lr=-1"])
    with pytest.raises(ConfigError, match="time budget"):
        load_spec("tiny-test", ['time_budget="soon"'])
    with pytest.raises(ConfigError, match="unknown preset"):
        load_spec("no-such-preset")
    assert parse_duration("120s") == 120 and parse_duration("2m") == 120
    assert parse_duration("1.5h") == 5400 and parse_duration("30") == 30


def test_every_float_setting_refuses_nan_and_infinities():
    """``--set train.lr=inf`` trained one step to NaN weights and saved them, exit 0: every
    float field of TrainConfig (found from the dataclass, so a new one is covered) refuses
    NaN and both infinities, naming the field."""
    import dataclasses

    from attnlm.train.config import TrainConfig

    floats = [f.name for f in dataclasses.fields(TrainConfig) if f.type == "float"]
    assert {"lr", "min_lr", "weight_decay", "grad_clip", "lora_alpha"} <= set(floats)
    for name in floats:
        for bad in ("nan", "inf", "-inf"):
            with pytest.raises(ConfigError, match=f"train.{name} must be a finite number"):
                load_spec("tiny-test", [f"train.{name}={bad}"])


def test_cli_bad_values_are_one_line_errors(corpus, tmp_path, capsys):
    assert train_cli(corpus, tmp_path / "r", "--set", "model.n_head=3") == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlm: error:") and "n_head" in err
    assert train_cli(corpus, tmp_path / "r", "--time-budget", "fast") == 2
    assert "time budget" in capsys.readouterr().err
    assert main(["train", "--preset", "nope", "--out", str(tmp_path / "x")]) == 2


# -- end to end through the CLI --------------------------------------------------------------


def test_train_eval_generate_cli(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(corpus, out, "--max-iters", "30") == 0
    for name in (
        "checkpoint/model.safetensors",
        "checkpoint/config.json",
        "checkpoint/tokenizer.json",
        "checkpoint/state.pt",
        "tokenizer.json",
        "train.bin",
        "val.bin",
        "metrics.jsonl",
        "loss_curve.png",
    ):
        assert (out / name).is_file(), name
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0]  # it learns
    assert any("val_loss" in r for r in records)
    capsys.readouterr()

    assert main(["eval", "--checkpoint", str(out), "--text", str(corpus), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"loss", "ppl", "bpc"} <= set(result)
    assert result["ppl"] == pytest.approx(math.exp(result["loss"]), rel=1e-6)
    # char tokenizer: one token per character, so bits/char = loss / ln 2
    assert result["bpc"] == pytest.approx(result["loss"] / math.log(2), rel=1e-6)
    assert main(["eval", "--checkpoint", str(out)]) == 0
    assert "bits per character" in capsys.readouterr().out

    argv = ["generate", "--checkpoint", str(out), "--prompt", "First", "--max-new-tokens", "20"]
    assert main(argv + ["--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("First") and len(first) >= len("First") + 20
    assert main(argv + ["--seed", "1", "--stream"]) == 0
    assert capsys.readouterr().out == first  # streaming prints the same text


def test_eval_and_generate_bad_input(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(corpus, out, "--max-iters", "5") == 0
    capsys.readouterr()
    argv = [
        "generate",
        "--checkpoint",
        str(out),
        "--prompt",
        "Zebra \u00e9",
        "--max-new-tokens",
        "5",
    ]
    assert main(argv) == 2
    assert "cannot encode" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (out / "checkpoint" / "model.safetensors").write_bytes(b"garbage")
    assert main(["eval", "--checkpoint", str(out)]) == 2
    assert "corrupt" in capsys.readouterr().err
    other = tmp_path / "other.txt"
    other.write_text("\u4e2d\u6587", encoding="utf-8")
    (out / "checkpoint" / "model.safetensors").unlink()
    assert main(["eval", "--checkpoint", str(out), "--text", str(other)]) == 2  # no checkpoint


def test_new_run_refuses_existing_checkpoint_and_resume_checks_config(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(corpus, out, "--max-iters", "10") == 0
    capsys.readouterr()
    assert train_cli(corpus, out, "--max-iters", "10") == 2
    assert "--resume" in capsys.readouterr().err
    # a different model or optimisation setting is refused, nothing is touched
    before = (out / "checkpoint" / "model.safetensors").read_bytes()
    assert main(["train", "--resume", str(out), "--set", "model.n_layer=3"]) == 2
    assert "model.n_layer" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--lr", "0.1"]) == 2
    assert "train.lr" in capsys.readouterr().err
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == before
    # more steps is a fine change
    assert main(["train", "--resume", str(out), "--max-iters", "15", "--no-progress"]) == 0
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["step"] == 15


def test_time_budget_stops_the_run(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(corpus, out, "--max-iters", "1000000", "--time-budget", "1.5s") == 0
    assert "time_budget" in capsys.readouterr().out
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert 0 < config["step"] < 1000000


# -- library-level: NaN loss and early stopping ----------------------------------------------


class Tok:
    vocab_size = 16

    def save(self, path):
        Path(path).write_text('{"format": "stand-in"}')


class ToyLM(torch.nn.Module):
    """A bigram table; ``nan_at`` makes the loss NaN from that training forward on."""

    def __init__(self, nan_at=None, frozen=False):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(16, 16))
        self.calls, self.nan_at, self.frozen = 0, nan_at, frozen

    def forward(self, ids, targets=None):
        from attnlm.models.base import ModelOutput, token_loss

        self.calls += targets is not None and self.training  # training steps only
        logits = self.table[ids] * (0.0 if self.frozen else 1.0)
        out = ModelOutput(logits=logits)
        if targets is not None:
            out.loss, out.loss_sum, out.n_targets = token_loss(logits, targets)
            if self.nan_at is not None and self.calls >= self.nan_at:
                out.loss_sum = out.loss_sum * float("nan")
        return out


def toy_trainer(tmp_path, model, **cfg):
    import numpy as np

    from attnlm.loading.objectives import CausalWindows
    from attnlm.train.optim import make_optimizer
    from attnlm.train.trainer import Trainer, TrainJob

    cfg = TrainConfig(**{"batch_size": 4, "eval_iters": 2, "warmup_iters": 0, **cfg})
    ids = np.random.default_rng(0).integers(0, 16, 500).astype(np.uint16)
    w = CausalWindows(ids, 8, 1.0)
    job = TrainJob(
        model=model,
        optimizer=make_optimizer(model, cfg, "cpu"),
        config=cfg,
        train=w,
        val=w,
        run_dir=tmp_path,
        checkpoint_config={"model": {}},
        tokenizer=Tok(),
        device=torch.device("cpu"),
        log=lambda *a: None,
    )
    return Trainer(job)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    from attnlm.train.trainer import MetricsLog, TrainingError

    model = ToyLM(nan_at=8)  # NaN at step 8, after the checkpoint of step 5
    tr = toy_trainer(tmp_path, model, max_iters=20, eval_interval=5, progress=False)
    with pytest.raises(TrainingError, match="nan at step 8.*last good checkpoint"):
        tr.fit(MetricsLog(tmp_path / "m.jsonl", True, None))
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert config["step"] == 5
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=True)
    assert state["trainer"]["step"] == 5


def test_early_stopping(tmp_path):
    from attnlm.train.trainer import MetricsLog

    tr = toy_trainer(
        tmp_path, ToyLM(frozen=True), max_iters=100, eval_interval=2, early_stop=3, progress=False
    )
    result = tr.fit(MetricsLog(tmp_path / "m.jsonl", True, None))
    assert result.stop_reason == "early_stop"
    assert result.step == 8  # first eval sets the best; three more without improvement
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert config["step"] == 2  # the checkpoint holds the best model


def test_gradient_accumulation_matches_a_bigger_batch(corpus, tmp_path):
    def losses(run):
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if "loss" in r]

    common = ["--max-iters", "8", "--set", "log_interval=1"]
    assert train_cli(corpus, tmp_path / "big", *common, "--batch-size", "8") == 0
    assert (
        train_cli(corpus, tmp_path / "acc", *common, "--batch-size", "4", "--grad-accum", "2") == 0
    )
    big, acc = losses(tmp_path / "big"), losses(tmp_path / "acc")
    assert len(big) == len(acc) == 8
    assert big == pytest.approx(acc, abs=1e-5)


def test_bf16_autocast_and_device_choice(corpus, tmp_path):
    from attnlm.base.device import resolve_device

    expected = "cuda" if torch.cuda.is_available() else None
    assert resolve_device("auto").type in {expected, "mps", "cpu"} - {None}
    assert resolve_device("cpu") == torch.device("cpu")
    assert train_cli(corpus, tmp_path / "bf16", "--max-iters", "3", "--dtype", "bfloat16") == 0


def test_pair_files_on_a_text_model_are_refused(cli, corpus, tmp_path):
    """--valid-pairs / --test-pairs name splits of sentence pairs: a text model refuses them in
    one line instead of silently ignoring them, and writes no run folder."""
    pairs = tmp_path / "valid.tsv"
    pairs.write_text("one\teins\n", encoding="utf-8")
    out = tmp_path / "run"
    r = cli(
        "train", "--preset", "tiny-test", "--text", corpus, "--valid-pairs", pairs, "--out", out
    )
    assert r.code == 2 and r.err.count("\n") == 1 and "--valid-pairs" in r.err, r.err
    assert not (out / "checkpoint").exists()


def test_gpt2_presets_train_with_their_tokenizer_and_refuse_another(corpus, tmp_path, capsys):
    """The gpt2-* presets state vocab_size = 50257: training takes it with GPT-2's tokenizer
    (their own [train] tokenizer) and refuses, in one line naming both sizes, a tokenizer of
    another size."""
    small = ["--set", "model.n_layer=1", "--set", "model.n_head=2", "--set", "model.n_embd=16",
             "--set", "model.block_size=16", "--set", "model.dropout=0.0", "--max-iters", "2",
             "--set", "train.eval_interval=1", "--set", "train.eval_iters=1",
             "--set", "train.batch_size=2", "--no-progress"]  # fmt: skip
    out = tmp_path / "g"
    argv = ["train", "--preset", "gpt2-small", "--text", str(corpus), "--out", str(out)]
    assert main([*argv, *small]) == 0, capsys.readouterr().err
    from attnlm.loading.checkpoint import load_checkpoint

    assert load_checkpoint(out).model.config.vocab_size == 50257
    capsys.readouterr()
    bad = [*argv[:-1], str(tmp_path / "c"), *small, "--set", 'train.tokenizer="char"']
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "model.vocab_size = 50257" in err and err.count("\n") == 1


def test_resume_after_the_time_budget_says_which_flag_gives_it_time(corpus, tmp_path, capsys):
    """A run stopped by its wall-clock budget, resumed with a higher --max-iters only, would
    stop at once: refused in one line naming --time-budget; with a larger budget it goes on."""
    out = tmp_path / "r"
    assert train_cli(corpus, out, "--time-budget", "0.5s", "--max-iters", "100000") == 0
    done = capsys.readouterr().out
    assert "time_budget" in done
    from attnlm.loading.checkpoint import load_checkpoint

    step = load_checkpoint(out).step
    resume = ["train", "--resume", str(out), "--no-progress"]
    assert main([*resume, "--max-iters", str(step + 200)]) == 2
    err = capsys.readouterr().err
    assert "--time-budget" in err and "spent" in err and err.count("\n") == 1
    assert load_checkpoint(out).step == step  # nothing changed
    assert main([*resume, "--max-iters", str(step + 3), "--time-budget", "10m"]) == 0
    assert load_checkpoint(out).step == step + 3
