"""A Hugging Face folder is replaced as a whole (attnlm.base.fileio.atomic_folder, used by
``save_hf`` and ``attnlm export --out``): a reader, or an export killed at any point, finds the
old folder or the complete new one, never the new tokenizer beside the old weights; the next
export removes what a killed one left; a folder that is not a model folder is not replaced."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from attnlm.base.errors import InputError
from attnlm.base.fileio import KILL_ENV, LOCK_NAME, TEMP_MARK
from gguf_export_support import tiny_run
from support import attnlm_process, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    """Temporary folders, retired folders and lock files beside ``folder``."""
    beside = folder.parent.glob(f".{folder.name}*")
    return sorted(
        p.name for p in beside if TEMP_MARK in p.name or p.name.endswith((LOCK_NAME, ".old"))
    )


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two runs of different families, and each one's export (the old and the new folder)."""
    import io
    from contextlib import redirect_stdout

    from attnlm.cli import main

    t = tmp_path_factory.mktemp("export")
    runs = {family: tiny_run(t / family, family) for family in ("llama", "gpt")}
    made = {}
    for family, run in runs.items():
        with redirect_stdout(io.StringIO()):
            assert main(["export", "--model", str(run), "--out", str(t / f"{family}-hf")]) == 0
        made[family] = files_of(t / f"{family}-hf")
    assert made["llama"].keys() & made["gpt"].keys() >= {"config.json", "model.safetensors"}
    return runs, made


def _kill_at(k: int, runs, made, out: Path) -> int:
    """Start from the old folder, export the new one over it killed at write point ``k``;
    the folder must be the old one or the complete new one. Returns the exit code."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for name, data in made["llama"].items():
        (out / name).write_bytes(data)
    argv = ("export", "--model", runs["gpt"], "--out", out, "--overwrite")
    r = attnlm_process(*argv, timeout=300, env={KILL_ENV: f"*:{k}"})
    assert r.returncode in (0, -signal.SIGKILL), r.stderr
    now = files_of(out)
    assert now in (made["llama"], made["gpt"]), (
        f"killed at write {k}: a mix of the old and new folders: "
        + ", ".join(f"{n} {'new' if made['gpt'].get(n) == d else 'old'}" for n, d in now.items())
    )
    return r.returncode


def test_an_export_killed_midway_leaves_the_old_folder(exports, tmp_path, capsys):
    """Killed after its first file (today's writer put the new tokenizer.json beside the old
    config.json and weights there), then run again: the complete new folder, nothing beside."""
    runs, made = exports
    out = tmp_path / "hf"
    assert _kill_at(2, runs, made, out) == -signal.SIGKILL
    assert files_of(out) == made["llama"]
    r = run_cli(capsys, "export", "--model", runs["gpt"], "--out", out, "--overwrite")
    assert r.code == 0, r.err
    assert files_of(out) == made["gpt"] and leftovers(out) == []


@pytest.mark.slow
def test_an_export_killed_at_every_write_point(exports, tmp_path):
    runs, made = exports
    out = tmp_path / "hf"
    for k in range(1, 20):
        if _kill_at(k, runs, made, out) == 0:  # fewer write points than k: it finished
            break
    else:
        pytest.fail("the export never finished")
    assert files_of(out) == made["gpt"] and leftovers(out) == []


def test_save_hf_replaces_the_folder_as_a_whole(exports, tmp_path):
    """A file the new folder does not have (an old shard, a README) is gone with the old
    folder; a folder of other files is refused, not emptied; a folder renamed aside by a
    writer killed between two renames is found again."""
    from attnlm.models import from_hf, save_hf

    runs, made = exports
    out = tmp_path / "hf"
    out.mkdir()
    for name, data in made["llama"].items():
        (out / name).write_bytes(data)
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    model = from_hf(out)
    save_hf(model, out)
    assert "model-00001-of-00002.safetensors" not in files_of(out)
    assert files_of(out)["model.safetensors"] == made["llama"]["model.safetensors"]
    assert leftovers(out) == []

    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a Hugging Face folder"):
        save_hf(model, other)
    assert (other / "notes.txt").read_text() == "keep me" and leftovers(other) == []

    from attnlm.base.fileio import atomic_folder

    before = files_of(out)
    aside = out.with_name(f".{out.name}.old")  # what a kill between two renames leaves
    out.rename(aside)
    with pytest.raises(RuntimeError), atomic_folder(out) as folder:  # a writer that fails
        (folder / "config.json").write_text("{}")
        raise RuntimeError("disk full")
    assert files_of(out) == before and leftovers(out) == []  # the old folder, back in place
    save_hf(model, out, files=lambda folder: (folder / "extra.json").write_text("{}"))
    assert (out / "extra.json").read_text() == "{}" and leftovers(out) == []
