"""One writer per run folder (docs/reliability.md): every command that writes into a run folder
or an output file holds ``fcntl.flock`` on its lock file, so a second writer is refused in one
line naming the first one's pid; the kernel releases the lock when the holder exits or is
killed. Also: ``--overwrite`` keeps the old run until the new one's inputs are valid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attnlm.base.fileio import LOCK_NAME, lock_file_for, output_lock
from support import CITIZENS, SRC, run_cli

HOLDER = (
    "import sys, time\n"
    "from attnlm.base.fileio import output_lock\n"
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


def writers(tmp_path, corpus, files) -> dict[tuple[str, str], list]:
    """(command, output option) -> an argv that writes there: one row for every option of
    every command whose type names an output (:data:`attnlm.cli.arguments.OUTPUT_TYPES`)."""
    out, f = tmp_path / "out", tmp_path / "out.file"
    fsdp = tmp_path / "fsdp"
    fsdp.mkdir(exist_ok=True)
    ck, text = files["ckpt"], ["--text", corpus]
    ngram, tok = ["ngram", "train", "--order", 2, *text], ["tokenize", "train", *text]
    return {
        ("train", "--out"): ["train", "--preset", "tiny-test", *text, "--out", out,
                             "--max-iters", 2],
        ("compare", "--out"): ["compare", *text, "--budget", "1s", "--models", "ngram",
                               "--out", out, "--no-progress"],
        ("data prepare", "--out"): ["data", "prepare", *text, "--tokenizer", "char", "--out", out],
        ("data task", "--out"): ["data", "task", "--out", f.with_suffix(".tsv")],
        ("export-checkpoint", "--out"): ["export-checkpoint", "--checkpoint", fsdp, "--out", out],
        ("demo", "--out"): ["demo", *text, "--out", out, "--no-llm"],
        ("ngram train", "--arpa"): [*ngram, "--arpa", f],
        ("ngram train", "--out"): [*ngram, "--out", f.with_suffix(".npz")],
        ("word2vec train", "--out"): ["word2vec", "train", *text, "--out", f, "--epochs", 1],
        ("tokenize train", "--out"): [*tok, "--kind", "char", "--out", f],
        ("tokenize train", "--vocab-out"): [*tok, "--kind", "wordpiece", "--out", out,
                                            "--vocab-out", f],
        ("tokenize train", "--tiktoken-out"): [*tok, "--kind", "bpe", "--out", out,
                                               "--tiktoken-out", f],
        ("hmm fit", "--out"): ["hmm", "fit", *text, "--out", out, "--states", 2],
        ("attention", "--out"): ["attention", "--checkpoint", ck, "the cat", "--out", f],
        ("attention", "--html"): ["attention", "--checkpoint", ck, "the cat", "--html", f],
        ("lens", "--out"): ["lens", "--model", ck, "the cat", "--out", f],
        ("contextual", "--out"): ["contextual", "--checkpoint", ck, "--word", "cat", "the cat",
                                  "a cat", "--out", f],
        ("eval", "--out"): ["eval", "--model", ck, "--task", _task_file(tmp_path), "--out", f],
        ("trace", "--save"): ["trace", "--model", ck, "the cat", "--hook", "hook_embed",
                              "--save", f.with_suffix(".npz")],
        ("patch", "--out"): ["patch", "--model", ck, "--clean", "the cat", "--corrupt",
                             "the dog", "--answer", "s", "--wrong", "d", "--out", f],
        ("attribute", "--out"): ["attribute", "--model", ck, "the cat", "--answer", "s",
                                 "--out", f],
        ("heads", "--out"): ["heads", "--model", ck, "--induction", "--length", 4, "--out", f],
        ("ablate", "--out"): ["ablate", "--model", ck, "the cat", "--head", "0.0", "--out", f],
        ("export", "--gguf"): ["export", "--model", ck, "--gguf", f],
        ("export", "--out"): ["export", "--model", ck, "--out", out],
    }  # fmt: skip


def _task_file(folder: Path) -> Path:
    """A two-example multiple-choice task in the characters the tiny checkpoint knows."""
    path = folder / "task.jsonl"
    rows = ['{"context": "the cat", "choices": [" sat", " dog"], "gold": 0}'] * 2
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def output_options() -> dict[tuple[str, str], bool]:
    """Every (command, option) whose value is written: a folder (True) or a file (False)."""
    from test_argument_layer import commands

    from attnlm.cli.arguments import OUTPUT_TYPES

    found = {}
    for command, parser in commands():
        for a in parser._actions:
            kind = OUTPUT_TYPES.get(getattr(a.type, "checks", None))
            if kind is not None:
                found[(command, a.option_strings[0])] = kind
    return found


def test_every_output_of_every_command_has_a_row(tmp_path, corpus, files):
    found = output_options()
    assert ("train", "--out") in found and ("attention", "--html") in found  # the walk works
    assert sorted(found) == sorted(writers(tmp_path, corpus, files))


def test_every_writer_is_refused_while_another_holds_its_output(tmp_path, corpus, files, capsys):
    """A second writer into the same output (a run folder or a file, whichever option names
    it) is refused in one line naming the holder's pid, before it writes anything."""
    kinds = output_options()
    for (command, option), argv in writers(tmp_path, corpus, files).items():
        target = Path(argv[argv.index(option) + 1])
        holder = hold(target, kinds[(command, option)])
        try:
            r = run_cli(capsys, *argv)
        finally:
            holder.kill()
            holder.wait()
        assert r.code == 2, (command, option, r.err)
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0], (command, option, r.err)
        assert "another attnlm process" in lines[0] and str(target) in lines[0]


def test_the_lock_is_released_when_the_holder_is_killed(tmp_path):
    out = tmp_path / "run"
    holder = hold(out)
    with pytest.raises(Exception, match=f"pid {holder.pid}"):
        with output_lock(out):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock_file_for(out).is_file()  # a killed holder leaves it: harmless, and reused
    assert not out.exists()  # the lock lives beside the folder: it creates nothing in it
    with output_lock(out) as lock:
        assert lock.read_text().strip() == str(os.getpid())
    assert not lock_file_for(out).exists()  # a holder that lets go deletes it


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

    from attnlm.base.errors import InputError
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


def test_no_command_leaves_a_lock_file_behind(tmp_path, corpus, capsys):
    """A command that writes, and one refused for bad input, leave no ``.NAME.attnlm.lock``."""
    ok = run_cli(capsys, "tokenize", "train", "--kind", "char", "--text", corpus, "--out",
                 tmp_path / "tok.json")  # fmt: skip
    assert ok.code == 0, ok.err
    refused = run_cli(capsys, "tokenize", "train", "--kind", "char", "--text",
                      tmp_path / "missing.txt", "--out", tmp_path / "other.json")  # fmt: skip
    assert refused.code == 2
    assert sorted(p.name for p in tmp_path.iterdir() if LOCK_NAME in p.name) == []


def test_a_lock_file_deleted_under_a_waiting_process_is_not_held(tmp_path, monkeypatch):
    """The race the deletion opens: a process that opened the lock file before its holder
    deleted it must not hold that file (a second writer would lock a new one beside it). It
    notices the path names another file and locks that one."""
    import fcntl

    from attnlm.base import fileio

    key = lock_file_for(tmp_path / "run")
    key.write_text("1\n")
    stale = os.open(key, os.O_RDWR)  # opened before the holder let go...
    key.unlink()  # ...which deletes the file as it lets go
    real, opened = os.open, []

    def first_the_stale_one(path, *args, **kwargs):
        opened.append(path)
        return stale if len(opened) == 1 else real(path, *args, **kwargs)

    monkeypatch.setattr(fileio.os, "open", first_the_stale_one)
    fd = fileio._lock_path(key, tmp_path / "run", fcntl)
    try:
        assert len(opened) == 2  # the stale file let go of, the path opened again
        assert os.fstat(fd).st_ino == os.stat(key).st_ino  # the file the path names is held
    finally:
        os.close(fd)
