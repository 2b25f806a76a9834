"""torchrun, 2 CPU processes (gloo): the same losses as 1 process with twice the batch."""

import json
import os
import subprocess
import sys

import pytest

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 12


def loss_curve(run):
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
def test_two_processes_match_one_process_with_double_batch(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    common = ["train", "--preset", "tiny-test", "--text", str(corpus), "--max-iters", "12"]
    common += ["--eval-interval", "6", "--set", "log_interval=1", "--no-progress", "--threads", "1"]
    one, two = tmp_path / "one", tmp_path / "two"

    single = [sys.executable, "-m", "attnlm", *common, "--batch-size", "8", "--out", str(one)]
    proc = subprocess.run(single, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    launcher += ["--nproc_per_node", "2", "-m", "attnlm"]
    proc = subprocess.run(
        [*launcher, *common, "--batch-size", "4", "--out", str(two)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[:4000]
    assert "2 processes" in proc.stdout and proc.stdout.count("done:") == 1  # rank 0 prints

    a, b = loss_curve(one), loss_curve(two)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
    assert a[12] < a[1]
