"""One writer per run folder (docs/reliability.md): every command that writes into a run folder
or an output file holds ``fcntl.flock`` on its lock file, so a second writer is refused in one
line naming the first one's pid; the kernel releases the lock when the holder exits or is
killed. Also: ``--overwrite`` keeps the old run until the new one's inputs are valid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from attnlm.fileio import LOCK_NAME, lock_file_for, output_lock
from support import CITIZENS, SRC, run_cli

HOLDER = (
    "import sys, time\n"
    "from attnlm.fileio import output_lock\n"
    "with output_lock(sys.argv[1], sys.argv[2] == 'dir'):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(120)\n"
)


def hold(target, folder=True):
    """A child process holding the lock of ``target`` (a run folder, or an output file)."""
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(target), "dir" if folder else "file"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text(CITIZENS, encoding="utf-8")
    return p


def writers(tmp_path, corpus):
    """(argv, target, is_folder) of every command that writes a run folder or output file."""
    out = tmp_path / "out"
    f = tmp_path / "out.file"
    fsdp = tmp_path / "fsdp"
    fsdp.mkdir(exist_ok=True)
    return [
        (["train", "--preset", "tiny-test", "--text", corpus, "--out", out, "--max-iters", 2],
         out, True),
        (["compare", "--text", corpus, "--budget", "1s", "--models", "ngram", "--out", out,
          "--no-progress"], out, True),
        (["data", "prepare", "--text", corpus, "--tokenizer", "char", "--out", out], out, True),
        (["export-checkpoint", "--checkpoint", fsdp, "--out", out], out, True),
        (["ngram", "train", "--order", 2, "--text", corpus, "--arpa", f], f, False),
        (["ngram", "train", "--order", 2, "--text", corpus, "--out", f.with_suffix(".npz")],
         f.with_suffix(".npz"), False),
        (["word2vec", "train", "--text", corpus, "--out", f, "--epochs", 1, "--dim", 4],
         f, False),
        (["tokenize", "train", "--kind", "char", "--text", corpus, "--out", f], f, False),
    ]  # fmt: skip


def test_every_writer_is_refused_while_another_holds_its_folder(tmp_path, corpus, capsys):
    for argv, target, folder in writers(tmp_path, corpus):
        holder = hold(target, folder)
        try:
            r = run_cli(capsys, *argv)
        finally:
            holder.kill()
            holder.wait()
        assert r.code == 2, (argv, r.err)
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0], (argv, r.err)
        assert "another attnlm process" in lines[0]


def test_the_lock_is_released_when_the_holder_is_killed(tmp_path):
    out = tmp_path / "run"
    holder = hold(out)
    with pytest.raises(Exception, match=f"pid {holder.pid}"):
        with output_lock(out):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock_file_for(out).is_file()  # left behind, and harmless
    assert not out.exists()  # the lock lives beside the folder: it creates nothing in it
    with output_lock(out) as lock:
        assert lock.read_text().strip() == str(os.getpid())


def test_the_lock_is_reentrant_in_one_process_and_free_after(tmp_path):
    out = tmp_path / "run"
    with output_lock(out), output_lock(out):
        pass
    holder = hold(out)  # released: another process can take it
    holder.kill()
    holder.wait()
    assert lock_file_for(tmp_path / "v.txt", folder=False).name == ".v.txt" + LOCK_NAME
    assert lock_file_for(tmp_path / "run").name == ".run" + LOCK_NAME


def test_overwrite_with_bad_input_keeps_the_old_checkpoint(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    base = ["train", "--preset", "tiny-test", "--out", out, "--max-iters", 2, "--no-progress"]
    assert run_cli(capsys, *base, "--text", corpus).code == 0
    before = sorted(p.name for p in (out / "checkpoint").iterdir())
    weights = (out / "checkpoint" / "model.safetensors").read_bytes()
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    r = run_cli(capsys, *base, "--text", empty, "--overwrite")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == before
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == weights
    # a valid new text with --overwrite does replace it
    other = tmp_path / "other.txt"
    other.write_text(CITIZENS.upper(), encoding="utf-8")
    assert run_cli(capsys, *base, "--text", other, "--overwrite").code == 0
    assert (out / "checkpoint" / "model.safetensors").read_bytes() != weights
    assert not (out / "checkpoint.old").exists()  # retired, then removed by the new save


def test_the_hugging_face_export_holds_the_folder_lock(tmp_path):
    import torch

    from attnlm.errors import InputError
    from attnlm.models.hf.folder import write_hf_folder

    out = tmp_path / "hf"
    holder = hold(out)
    try:
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            write_hf_folder(out, {"model_type": "gpt2"}, {"w": torch.zeros(2)})
    finally:
        holder.kill()
        holder.wait()
    write_hf_folder(out, {"model_type": "gpt2"}, {"w": torch.zeros(2)})
    assert (out / "model.safetensors").stat().st_size > 0
