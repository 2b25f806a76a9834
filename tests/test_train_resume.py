"""A run killed with SIGKILL and resumed ends exactly like an uninterrupted run (CPU)."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 12


def losses(run):
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in records]


def train(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnlm", "train", *args, "--no-progress", "--threads", "1"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


# The same command line, run through the library with an on_step hook that SIGKILLs the
# process right after step 25 (the public hook; nothing test-only in the trainer).
KILLER = """
import os, signal, sys
from attnlm.cli import main
import attnlm.train.run as run
real = run.train_run
def killing(spec, run_dir, resume=False, log=print, on_step=None):
    def hook(step):
        if step == 25:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(spec, run_dir, resume=resume, log=log, on_step=hook)
run.train_run = killing
sys.exit(main(["train", *sys.argv[1:], "--no-progress", "--threads", "1"]))
"""


def train_killed(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", KILLER, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
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
