"""Nothing is lost (docs/reliability.md): every command that writes files is SIGKILLed at its
N-th write point (``ATTNLM_TEST_KILL_AT=*:N``, read by :func:`attnlm.fileio.kill_point`: a
complete temporary file before its rename, or an appended log line half written) while it
replaces the outputs of an earlier run; every output file must then be the old file byte for
byte or a complete new one (never 0 bytes, never torn), and the command must run again to
the end. The table :data:`ROWS` holds one row per writing command; a command with an output
option (``--out``, ``--html``, ...) that has no row and no reason in :data:`EXEMPT` fails
:func:`test_every_writing_command_has_a_row`."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attnlm.fileio import KILL_ENV, LOCK_NAME, TEMP_MARK
from support import CITIZENS, ROMEO, attnlm_process, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

OUTPUT_OPTIONS = {"--out", "--html", "--arpa", "--vocab-out", "--tiktoken-out"}
READS_ARPA = {"ngram score", "ngram sample"}  # --arpa names their input

EXEMPT = {
    "demo": "runs train, compare and translate in a row (minutes); each is killed in its own row",
    "export-checkpoint": "needs an FSDP run (torchrun, two processes); its output is written by "
    "save_checkpoint, killed in the train row",
    "export": "writes one GGUF file through attnlm.fileio.atomic_path or a Hugging Face folder "
    "through write_hf_folder (the lock and atomic files of save_hf, tested in test_run_lock); "
    "needs a byte-level BPE run, which the rows' tiny char run is not",
    "data task": "writes one .tsv through attnlm.fileio (write_pairs), like data prepare's files",
}

# files removed on purpose before the files they describe are rewritten, and written last
MARKERS = {"data.json": "a prepared data folder's record: present only when its files are complete"}

# rows whose command refuses a folder holding a run (no --overwrite): each try starts afresh
NEW_FOLDER_ONLY = {"hmm fit"}

# rows whose command holds the output lock (the others write a single file atomically)
LOCKED = {"train", "compare", "data prepare", "ngram train", "word2vec train", "tokenize train",
          "hmm fit"}  # fmt: skip

Argv = Callable[[int], list]  # variant (0: the old run, 1: the new one) -> argv


def _rows(files: dict[str, str], t: Path) -> dict[str, tuple[Argv, list[Path]]]:
    texts = [t / "a.txt", t / "b.txt"]
    texts[0].write_text(CITIZENS, encoding="utf-8")
    texts[1].write_text(ROMEO, encoding="utf-8")
    ck, out, f = files["ckpt"], t / "out", t / "out.file"
    sentences = ["the cat sat", "the dog sat on"]  # within the checkpoint's 16 characters
    return {
        "train": (lambda v: ["train", "--preset", "tiny-test", "--text", texts[v], "--out", out,
                             "--max-iters", 4, "--set", "train.eval_interval=2", "--overwrite",
                             "--no-progress", "--threads", 1], [out]),
        "compare": (lambda v: ["compare", "--text", texts[v], "--budget", "1s", "--models",
                               "ngram", "--out", out, "--no-progress", "--val-chars", 200],
                    [out]),
        "data prepare": (lambda v: ["data", "prepare", "--text", texts[v], "--tokenizer", "char",
                                    "--out", out, "--no-progress"], [out]),
        "ngram train": (lambda v: ["ngram", "train", "--order", 2 + v, "--text", texts[v],
                                   "--arpa", f.with_suffix(".arpa"), "--out",
                                   f.with_suffix(".npz")],
                        [f.with_suffix(".arpa"), f.with_suffix(".npz")]),
        "word2vec train": (lambda v: ["word2vec", "train", "--text", texts[v], "--out",
                                      f.with_suffix(".txt"), "--epochs", 1, "--dim", 4 + v,
                                      "--min-count", 1, "--workers", 1, "--no-progress"],
                           [f.with_suffix(".txt")]),
        "tokenize train": (lambda v: ["tokenize", "train", "--kind", "wordpiece", "--vocab-size",
                                      60 + v, "--text", texts[v], "--out", f.with_suffix(".json"),
                                      "--vocab-out", f.with_suffix(".vocab")],
                           [f.with_suffix(".json"), f.with_suffix(".vocab")]),
        "attention": (lambda v: ["attention", "--checkpoint", ck, sentences[v],
                                 "--out", f.with_suffix(".png"), "--html",
                                 f.with_suffix(".html")],
                      [f.with_suffix(".png"), f.with_suffix(".html")]),
        "lens": (lambda v: ["lens", "--model", ck, sentences[v], "--out", f.with_suffix(".png"),
                            "--threads", 1], [f.with_suffix(".png")]),
        "contextual": (lambda v: ["contextual", "--checkpoint", ck, "--word", "sat",
                                  *sentences, "sat on the log"[: 10 + v], "--out",
                                  f.with_suffix(".png")], [f.with_suffix(".png")]),
        "hmm fit": (lambda v: ["hmm", "fit", "--text", texts[v], "--out", t / f"hmm{v}",
                               "--states", 2, "--iters", 1, "--threads", 1, "--no-progress"],
                    [t / "hmm1"]),
    }  # fmt: skip


ROW_NAMES = [
    "train", "compare", "data prepare", "ngram train", "word2vec train", "tokenize train",
    "attention", "lens", "contextual", "hmm fit",
]  # fmt: skip


def _is_scratch(p: Path) -> bool:
    """Temporary files and folders of killed writers, and lock files: not outputs."""
    return any(TEMP_MARK in part or part.endswith((LOCK_NAME, ".ngram-tmp")) for part in p.parts)


def snapshot(outputs: list[Path]) -> dict[Path, bytes]:
    found = {}
    for o in outputs:
        for p in [o] if o.is_file() else sorted(o.rglob("*")) if o.is_dir() else []:
            if p.is_file() and not _is_scratch(p.relative_to(o.parent)):
                found[p] = p.read_bytes()
    return found


def complete(p: Path, data: bytes) -> str | None:
    """Why ``data`` is not a complete file of its kind (None when it is)."""
    name = p.name
    if name.endswith(".jsonl"):  # a log: every line but a cut last one parses
        lines = data.decode().split("\n")
        for line in lines[:-1]:
            json.loads(line)
        return None
    if not data:
        return "0 bytes"
    if name.endswith(".json"):
        json.loads(data)
    elif name.endswith(".png"):
        return None if data.endswith(b"IEND\xaeB`\x82") else "PNG without its end"
    elif name.endswith(".html"):
        return None if data.rstrip().endswith(b"</html>") else "HTML without its end"
    elif name.endswith(".arpa"):
        return None if data.rstrip().endswith(b"\\end\\") else "ARPA without \\end\\"
    elif name.endswith(".npz"):
        import io

        with np.load(io.BytesIO(data)) as z:
            [z[k] for k in z.files]
    elif name.endswith(".safetensors"):
        from safetensors.numpy import load

        load(data)
    elif name.endswith((".txt", ".vocab", ".tsv")):
        return None if data.endswith(b"\n") else "text without its last line end"
    return None


def check(outputs: list[Path], old: dict[Path, bytes], when: str) -> None:
    now = snapshot(outputs)
    for p, data in now.items():
        if old.get(p) != data:
            assert complete(p, data) is None, f"{when}: {p}: {complete(p, data)}"
    for p in old:  # nothing lost: the old file, or the checkpoint kept as checkpoint.old
        kept = Path(str(p).replace("/checkpoint/", "/checkpoint.old/"))
        new = Path(str(p).replace("/checkpoint.old/", "/checkpoint/"))  # replaced it
        assert p in now or kept in now or new in now or p.name in MARKERS, f"{when}: {p} is gone"


def kill_run(name: str, files, tmp_path, capsys, points) -> None:
    argv, outputs = _rows(files, tmp_path)[name]
    first = run_cli(capsys, *argv(0))  # in this process: no second start-up
    assert first.code == 0, first.err
    old = snapshot(outputs)
    for k in points:
        if name in NEW_FOLDER_ONLY:
            for o in outputs:
                shutil.rmtree(o, ignore_errors=True)
        r = attnlm_process(*argv(1), timeout=300, env={KILL_ENV: f"*:{k}"})
        check(outputs, old, f"{name} killed at write {k}")
        if r.returncode != -signal.SIGKILL:  # fewer write points than k: it finished
            assert r.returncode == 0, r.stderr
            break
        old = {**old, **snapshot(outputs)}  # what survived is the state the next kill sees
    if name in NEW_FOLDER_ONLY:
        for o in outputs:
            shutil.rmtree(o, ignore_errors=True)
    again = run_cli(capsys, *argv(1))  # no lock and no leftover stops the next run
    assert again.code == 0, again.err
    if name in LOCKED:  # the next run under the lock removed what the killed ones left
        for o in outputs:
            left = o.rglob(f".*{TEMP_MARK}*") if o.is_dir() else o.parent.glob(f".{o.name}.tmp-*")
            assert not [p for p in left if p.is_file()], f"{name}: temporary files left"
    check(outputs, {}, f"{name} after the kills")


@pytest.mark.parametrize("name", ROW_NAMES)
def test_kill_at_the_first_write(name, files, tmp_path, capsys):
    kill_run(name, files, tmp_path, capsys, points=(1,))


@pytest.mark.slow
@pytest.mark.parametrize("name", ROW_NAMES)
def test_kill_at_every_write(name, files, tmp_path, capsys):
    kill_run(name, files, tmp_path, capsys, points=range(2, 40))


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _commands(sub, (*prefix, name))
            return
    yield " ".join(prefix), parser


def test_every_writing_command_has_a_row(files, tmp_path):
    from attnlm.cli import build_parser

    writers = set()
    for name, p in _commands(build_parser()):
        options = {o for a in p._actions for o in a.option_strings}
        if options & OUTPUT_OPTIONS and name not in READS_ARPA:
            writers.add(name)
    assert "train" in writers and "compare" in writers  # the discovery works
    missing = writers - set(ROW_NAMES) - set(EXEMPT)
    assert not missing, f"writing commands without a kill-test row: {sorted(missing)}"
    assert not (set(ROW_NAMES) | set(EXEMPT)) - writers, "rows for commands that do not write"
    assert sorted(_rows(files, tmp_path)) == sorted(ROW_NAMES)
