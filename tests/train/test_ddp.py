"""torchrun, 2 CPU processes (gloo): the same losses as 1 process with twice the batch, and a
killed run resumed with dropout on gives the uninterrupted run's losses exactly (every rank's
random state is saved)."""

import json

import pytest

from support import CITIZENS, loss_curve, losses, torchrun, train


@pytest.mark.slow
def test_two_processes_match_one_process_with_double_batch(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    common = ["--preset", "tiny-test", "--text", str(corpus), "--max-iters", "12"]
    common += ["--eval-interval", "6", "--set", "log_interval=1"]
    one, two = tmp_path / "one", tmp_path / "two"

    proc = train([*common, "--batch-size", "8", "--out", str(one)])
    assert proc.returncode == 0, proc.stderr

    proc = torchrun([*common, "--batch-size", "4", "--out", str(two)])
    assert proc.returncode == 0, proc.stderr[:4000]
    assert "2 processes" in proc.stdout and proc.stdout.count("done:") == 1  # rank 0 prints

    a, b = loss_curve(one), loss_curve(two)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
    assert a[12] < a[1]


@pytest.mark.slow
def test_two_processes_resume_exactly_with_dropout(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    common = ["--preset", "tiny-test", "--text", str(corpus), "--max-iters", "30"]
    common += ["--eval-interval", "10", "--set", "log_interval=1", "--set", "model.dropout=0.2"]
    common += ["--batch-size", "4"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    done = torchrun([*common, "--out", str(full)], timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    dead = torchrun([*common, "--out", str(killed)], killed=True, timeout=180)  # dies at step 25
    assert dead.returncode != 0
    assert json.loads((killed / "checkpoint" / "config.json").read_text())["step"] == 20
    resumed = torchrun(["--resume", str(killed)], timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "from step 20" in resumed.stdout
    assert losses(killed) == losses(full)  # the dropout masks of both ranks continue exactly


def test_resumed_random_state_per_rank():
    """Which saved random state a rank continues from: its own when the number of processes
    is the same; else rank 0 the saved one, other ranks a fresh stream per rank."""
    from types import SimpleNamespace

    import torch

    from attnlm.train.trainer import Trainer

    def state(seed):
        torch.manual_seed(seed)
        return torch.get_rng_state()

    saved = {"rng_torch": state(1), "rng_ranks": [{"rng_torch": state(1)}, {"rng_torch": state(2)}]}

    def own(rank, world, sd):
        fake = SimpleNamespace(dist=SimpleNamespace(rank=rank, world_size=world))
        return Trainer._own_rng(fake, sd)["rng_torch"]

    assert torch.equal(own(1, 2, saved), state(2)) and torch.equal(own(0, 2, saved), state(1))
    assert torch.equal(own(0, 3, saved), state(1))  # another world size: rank 0 continues
    fresh = [own(r, 3, saved) for r in (1, 2)]
    assert not torch.equal(fresh[0], fresh[1]) and not torch.equal(fresh[0], state(1))
    assert torch.equal(own(1, 3, saved), fresh[0])  # deterministic
    old = {"rng_torch": state(1)}  # a checkpoint of one process
    assert torch.equal(own(0, 1, old), state(1))
    assert not torch.equal(own(1, 2, old), state(1))
