"""Helpers of the kill-and-resume and multi-process tests: run ``attnlm train`` in a
subprocess (or in 2 processes under torchrun), optionally SIGKILLed right after step 25, and
read a run's logged losses."""

import json
import os
import subprocess
import sys


def losses(run):
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in records]


def loss_curve(run):
    """``{step: training loss}`` of a run's logged steps."""
    return {step: loss for step, loss, _ in losses(run) if loss is not None}


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


def torchrun(args, killed=False, timeout=120):
    """``attnlm train ARGS`` in 2 CPU processes under torchrun (gloo over loopback, one thread
    each); ``killed``: through :data:`KILLER`, so every process dies right after step 25."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    cmd += ["--nproc_per_node", "2", "--no-python", sys.executable]
    if killed:
        cmd += ["-c", KILLER, *args]
    else:
        cmd += ["-m", "attnlm", "train", *args, "--no-progress", "--threads", "1"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
