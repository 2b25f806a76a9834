"""Where `train` writes without --out (runs/PRESET, runs/auto for --text alone), and the hint
when the folder already holds a run: --resume only for a run on the same data; another
--out or --overwrite otherwise."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")

FEW = ["--max-iters", "2", "--eval-iters", "1", "--no-progress"]


def test_default_folders_are_runs_preset_and_runs_auto(cli, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("train", "--preset", "tiny-test", "--text", corpus, *FEW)
    assert r.code == 0, r.err
    assert (tmp_path / "runs" / "tiny-test" / "checkpoint").is_dir()
    assert "run folder: runs/tiny-test" in r.out
    r = cli("train", "--text", corpus, *FEW)
    assert r.code == 0, r.err
    assert (tmp_path / "runs" / "auto" / "checkpoint").is_dir()


def test_second_corpus_is_not_told_to_resume(cli, corpus, romeo_file, tmp_path):
    run = tmp_path / "run"
    assert cli("train", "--preset", "tiny-test", "--text", corpus, *FEW, "--out", run).code == 0
    r = cli("train", "--preset", "tiny-test", "--text", romeo_file, *FEW, "--out", run)
    assert r.code == 2
    assert "--resume " + str(run) not in r.err
    assert "--out NEW" in r.err and "--overwrite" in r.err
    assert str(corpus.resolve()) in r.err and str(romeo_file.resolve()) in r.err
    r = cli("train", "--preset", "tiny-test", "--text", corpus, *FEW, "--out", run)
    assert r.code == 2 and f"--resume {run}" in r.err and "--overwrite" in r.err
    # the hint's way out works
    r = cli(
        "train", "--preset", "tiny-test", "--text", romeo_file, *FEW, "--out", run, "--overwrite"
    )
    assert r.code == 0, r.err
