"""The ffnn and rnn families through the registry and the command line: train, eval,
generate, params on each preset (tiny overrides), resume, gradient accumulation, DDP."""

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from attnlm.cli import main
from attnlm.loading.checkpoint import load_checkpoint
from attnlm.models import registry
from support import loss_curve, losses, torchrun, train, train_killed

# tiny shapes of each preset so a run takes a second or two
TINY = {
    "ffnn-char": ["--set", "model.n_hidden=32", "--set", "model.block_size=16"],
    "lstm-char": ["--set", "model.n_embd=16", "--set", "model.block_size=16"],
    "gru-char": ["--set", "model.n_embd=16", "--set", "model.block_size=16"],
    "rnn-char": ["--set", "model.n_embd=16", "--set", "model.block_size=16"],
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_registry_knows_the_new_families():
    assert {"ffnn", "rnn"} <= set(registry.known_types())
    assert registry.get("rnn").objective == "causal-stream"
    assert registry.get("ffnn").objective == "causal"
    assert set(registry.presets_of("rnn")) >= {"lstm-char", "gru-char"}
    assert registry.presets_of("ffnn") == ["ffnn-char"]


@pytest.mark.parametrize("preset", sorted(TINY))
def test_train_eval_generate_params(preset, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--preset", preset, "--text", str(corpus), "--out", str(out)]
    argv += ["--max-iters", "30", "--eval-interval", "15", "--batch-size", "4", "--no-progress"]
    assert main(argv + TINY[preset]) == 0
    recs = [r for s, r, _ in losses(out) if r is not None]
    assert recs[-1] < recs[0]  # it learns
    ck = load_checkpoint(out)
    assert ck.family.type == ("ffnn" if preset.startswith("ffnn") else "rnn")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert 0 < res["bpc"] < 8 and res["tokens"] > 0
    gen = ["generate", "--checkpoint", str(out), "--prompt", "First", "--max-new-tokens", "12"]
    options = [
        ["--temperature", "0"],
        ["--top-k", "5", "--top-p", "0.9", "--seed", "3"],
        ["--num-samples", "2", "--seed", "1", "--stop", "\n\n"],
        ["--no-cache"],
        ["--stream", "--temperature", "0.7", "--seed", "2"],
    ]
    for extra in options:
        assert main(gen + extra) == 0, extra
    assert main(gen + ["--temperature", "0", "--no-cache"]) == 0
    greedy_nocache = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(gen + ["--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == greedy_nocache
    assert main(["params", "--preset", preset]) == 0
    table = capsys.readouterr().out
    assert "total (exact)" in table and "12·L·d²" not in table


def test_grad_accumulation_equals_one_big_batch(corpus, tmp_path):
    common = ["train", "--preset", "lstm-char", "--text", str(corpus), "--max-iters", "6"]
    common += [
        "--eval-interval",
        "6",
        "--set",
        "log_interval=1",
        "--no-progress",
        *TINY["lstm-char"],
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*common, "--batch-size", "8", "--out", str(a)]) == 0
    assert main([*common, "--batch-size", "4", "--grad-accum", "2", "--out", str(b)]) == 0
    la = {s: x for s, x, _ in losses(a) if x is not None}
    lb = {s: x for s, x, _ in losses(b) if x is not None}
    assert sorted(la) == sorted(lb) == list(range(1, 7))
    for step in la:
        assert abs(la[step] - lb[step]) < 1e-5, (step, la[step], lb[step])


def test_changed_batch_size_on_resume_is_refused(corpus, tmp_path):
    out = tmp_path / "run"
    common = ["train", "--preset", "lstm-char", "--text", str(corpus), "--no-progress"]
    assert main([*common, "--max-iters", "4", "--eval-interval", "2", "--out", str(out),
                 *TINY["lstm-char"]]) == 0  # fmt: skip
    assert main(["train", "--resume", str(out), "--max-iters", "6", "--batch-size", "3"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["lstm-char", "ffnn-char"])
def test_sigkill_then_resume_matches_uninterrupted_run(preset, corpus, tmp_path):
    common = ["--preset", preset, "--text", str(corpus), "--max-iters", "40", "--batch-size", "4"]
    common += ["--eval-interval", "10", "--set", "log_interval=1", "--set", "model.dropout=0.1"]
    common += TINY[preset]
    full, killed = tmp_path / "full", tmp_path / "killed"

    done = train([*common, "--out", str(full)])
    assert done.returncode == 0, done.stderr
    dead = train_killed([*common, "--out", str(killed)])
    assert dead.returncode == -signal.SIGKILL
    assert json.loads((killed / "checkpoint" / "config.json").read_text())["step"] == 20
    resumed = train(["--resume", str(killed)])
    assert resumed.returncode == 0, resumed.stderr
    assert "from step 20" in resumed.stdout
    assert losses(killed) == losses(full)  # the streams' positions and hidden states too
    a = load_file(str(full / "checkpoint" / "model.safetensors"))
    b = load_file(str(killed / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_processes_match_one_process_with_double_batch(corpus, tmp_path):
    common = ["--preset", "lstm-char", "--text", str(corpus), "--max-iters", "12"]
    common += ["--eval-interval", "6", "--set", "log_interval=1"]
    common += TINY["lstm-char"]
    one, two = tmp_path / "one", tmp_path / "two"
    proc = train([*common, "--batch-size", "8", "--out", str(one)])
    assert proc.returncode == 0, proc.stderr
    proc = torchrun([*common, "--batch-size", "4", "--out", str(two)])
    assert proc.returncode == 0, proc.stderr[:4000]
    a, b = loss_curve(one), loss_curve(two)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
    # the checkpoint of the 2-process run holds both processes' carried states
    state = torch.load(two / "checkpoint" / "state.pt", weights_only=True)
    assert len(state["model_carry"]) == 2 and state["source"]["n_streams"] == 8
