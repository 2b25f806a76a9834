"""A run killed with SIGKILL and resumed ends exactly like an uninterrupted run (CPU)."""

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from support import CITIZENS, losses, train, train_killed


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    common = ["--preset", "tiny-test", "--text", str(corpus), "--max-iters", "40"]
    common += ["--eval-interval", "10", "--set", "log_interval=1", "--set", "model.dropout=0.1"]
    full, killed = tmp_path / "full", tmp_path / "killed"

    done = train([*common, "--out", str(full)])
    assert done.returncode == 0, done.stderr
    # SIGKILL right after step 25: the last checkpoint is step 20, steps 21-25 are logged
    dead = train_killed([*common, "--out", str(killed)])
    assert dead.returncode == -signal.SIGKILL
    assert json.loads((killed / "checkpoint" / "config.json").read_text())["step"] == 20
    assert max(s for s, *_ in losses(killed)) == 25

    resumed = train(["--resume", str(killed)])
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and "from step 20" in resumed.stdout

    assert losses(killed) == losses(full)  # same logged losses, exactly (dropout RNG too)
    a = load_file(str(full / "checkpoint" / "model.safetensors"))
    b = load_file(str(killed / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
