"""`attnlm demo` never deletes another run, and takes any path for --text (issue 15)."""

import json

import pytest
import torch

from attnlm.apps.demo import check_demo_folder
from attnlm.base.errors import InputError
from attnlm.cli import main
from support import ROMEO


def _other_run(folder):
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "checkpoint" / "model.safetensors").write_bytes(b"weights of another run")
    (folder / "train.bin").write_bytes(b"\x01\x00" * 10)
    (folder / "data.json").write_text("{}")


def test_demo_refuses_to_delete_another_run(romeo_file, tmp_path, capsys):
    out = tmp_path / "run"
    _other_run(out)
    rc = main(["demo", "--preset", "tiny-test", "--text", str(romeo_file), "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err and "Traceback" not in err
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == b"weights of another run"
    assert (out / "train.bin").exists() and (out / "data.json").exists()


def test_demo_folder_check():
    from pathlib import Path

    check_demo_folder(Path("/nonexistent/folder"))  # a new folder is fine


def test_demo_marker_and_overwrite_allow_reuse(tmp_path):
    out = tmp_path / "run"
    _other_run(out)
    with pytest.raises(InputError):
        check_demo_folder(out)
    check_demo_folder(out, overwrite=True)
    (out / "demo.json").write_text("{}")
    check_demo_folder(out)


@pytest.mark.slow
def test_demo_text_path_with_backslash_and_quote(tmp_path, capsys):
    folder = tmp_path / 'we"ird\\dir'
    folder.mkdir()
    corpus = folder / 'pl"ays\\.txt'
    corpus.write_text(ROMEO, encoding="utf-8")
    out = tmp_path / "demo"
    threads = torch.get_num_threads()
    try:
        argv = ["demo", "--preset", "tiny-test", "--text", str(corpus), "--out", str(out)]
        budgets = ["--time-budget", "1s", "--translate-budget", "0", "--compare-budget", "1s"]
        assert main([*argv, *budgets, "--threads", "1"]) == 0  # compare reads the path too
        # the folder is now marked as a demo folder: a second demo may replace it
        assert json.loads((out / "demo.json").read_text())["attnlm"] == "demo"
    finally:
        torch.set_num_threads(threads)
    assert (out / "checkpoint" / "model.safetensors").is_file()
    assert "Traceback" not in capsys.readouterr().err
