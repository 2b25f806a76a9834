"""Nothing is lost (docs/reliability.md): every file attnlm writes goes through the atomic
writer of :mod:`attnlm.base.fileio`. This test scans ``src/`` for the ways Python writes a file at
its final name (``open(..., "w")``, ``write_text``, ``np.save``, ``torch.save``, renames, ...)
and fails on any line that is not in :data:`ALLOWED`, with the reason it is safe. A new
writer either uses ``atomic_open``/``atomic_write_*``/``atomic_path`` or adds a reasoned entry
here (and a row to the kill test, ``tests/cli/test_kill_every_writer.py``)."""

from __future__ import annotations

import re

from support import SRC

PATTERNS = {
    "open for writing": re.compile(r"""\bopen\([^)\n]*["'](?:[wax]|r\+)[bt+]*["']"""),
    "os.open": re.compile(r"\bos\.open\("),
    "write_text": re.compile(r"\.write_text\("),
    "write_bytes": re.compile(r"\.write_bytes\("),
    "numpy save": re.compile(r"\bnp\.save(?:z|z_compressed|txt)?\("),
    "torch.save": re.compile(r"\btorch\.save\("),
    "safetensors save": re.compile(r"\bsave_(?:file|model)\("),
    "savefig": re.compile(r"\.savefig\("),
    "tofile": re.compile(r"\.tofile\("),
    "rename": re.compile(r"\bos\.(?:replace|rename)\("),
    "shutil copy/move": re.compile(r"\bshutil\.(?:copy\w*|move)\("),
    "temp folder": re.compile(r"\btempfile\.\w+\("),
}

_TEMP = "writes a temporary name given by atomic_path, renamed into place by it"
_CKPT = "inside the checkpoint's temporary folder, renamed into place as a whole"

# (file under src/, the stripped line) -> why it is safe
ALLOWED = {
    ("attnlm/native/__init__.py", "os.replace(tmp, path)"):
        "the C compiler wrote the temporary library beside it; renamed into place when whole",
    ("attnlm/base/fileio.py", "with open(tmp, \"wb\") as raw:"): "the atomic writer itself",
    ("attnlm/base/fileio.py", "os.replace(tmp, target)"): "the atomic writer's rename",
    ("attnlm/base/fileio.py", "3. ``os.replace(tmp, target)`` (atomic on POSIX and Windows);"):
        "the module docstring",
    ("attnlm/base/fileio.py", "os.replace(old, target)"):
        "atomic_folder: a folder renamed aside by a killed writer goes back to its name",
    ("attnlm/base/fileio.py", "os.replace(target, old)"):
        "atomic_folder without renameat2: the complete old folder renamed aside",
    ("attnlm/base/fileio.py", "os.replace(new, target)"):
        "atomic_folder: the complete new folder renamed into place",
    ("attnlm/base/fileio.py", "with open(path, \"ab\") as f:  # the one appending writer (see the "
     "module docstring)"): "append_line: appends one log line; a kill cuts only that line",
    ("attnlm/base/fileio.py",
     "fd = os.open(folder, os.O_RDONLY | getattr(os, \"O_DIRECTORY\", 0))"):
        "fsync_dir opens a folder read-only",
    ("attnlm/base/fileio.py", "fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)"):
        "the run-folder lock file (holds only the pid; never read for data)",
    ("attnlm/loading/checkpoint.py", "fd = os.open(path, os.O_RDONLY)"): "fsync of a written file",
    ("attnlm/loading/checkpoint.py", "save_model(standard_layout(model), str(tmp / "
     "\"model.safetensors\"))"): _CKPT,
    ("attnlm/loading/checkpoint.py", "torch.save(state, tmp / \"state.pt\")"): _CKPT,
    ("attnlm/loading/checkpoint.py", "save_file("): _CKPT + " (a LoRA run's adapters)",
    ("attnlm/loading/checkpoint.py", "os.replace(folder, tmp / name)"): _CKPT,
    ("attnlm/loading/checkpoint.py", "os.replace(final, old)"):
        "the old checkpoint is kept as checkpoint.old until the new one is in place",
    ("attnlm/loading/checkpoint.py", "os.replace(tmp, final)"):
        "the checkpoint folder's atomic rename",
    ("attnlm/cli/__init__.py", "os.dup2(os.open(os.devnull, os.O_WRONLY), "
     "sys.stdout.fileno())"): "standard output to /dev/null after a closed pipe",
    ("attnlm/apps/compare.py", "shutil.copy2(shared.folder / f, tmp)"): _TEMP,
    ("attnlm/data/pretrained.py", "with zf.open(member) as src, open(out, \"wb\") as dst:"):
        "extracts into a temporary folder that is renamed into place as a whole",
    ("attnlm/data/pretrained.py", "shutil.copyfileobj(src, dst, 1 << 20)"):
        "extracts into a temporary folder that is renamed into place as a whole",
    ("attnlm/data/pretrained.py", "os.rename(tmp, target)"):
        "the extracted folder's atomic rename",
    ("attnlm/data/text_ranges.py", "with atomic_path(out / \"train.bin\") as train_tmp, "
     "open(train_tmp, \"w+b\") as f:"): _TEMP,
    ("attnlm/data/text_ranges.py", "with atomic_path(out / \"val.bin\") as val_tmp, "
     "open(val_tmp, \"wb\") as g:"): _TEMP,
    ("attnlm/data/text_ranges.py", "shutil.copyfileobj(f, g, 1 << 24)"): _TEMP,
    ("attnlm/inspect/heatmap.py", "fig.savefig(tmp, dpi=110, format=fmt)"): _TEMP,
    ("attnlm/models/hf/folder.py", "save_file(tensors, tmp, metadata={\"format\": \"pt\"})"):
        _TEMP,
    ("attnlm/models/hf/folder.py", "save_file(shard, tmp, metadata={\"format\": \"pt\"})"):
        _TEMP,
    ("attnlm/ngram/bounded.py", "with tempfile.TemporaryDirectory(prefix=\"attnlm-ngram-\", "
     "dir=tmp_dir) as tmp:"): "only when the caller names tmp_dir; removed at the end",
    ("attnlm/ngram/disk.py", "self._out = open(self.path, \"ab\")  # noqa: SIM115 - closed "
     "by close()/read()"): "shard files in the n-gram work folder, never a final output",
    ("attnlm/ngram/disk.py", "np.ascontiguousarray(values, dtype=self.dtype)"
     ".tofile(self._out)"): "shard files in the n-gram work folder, never a final output",
    ("attnlm/ngram/model.py", "np.savez(f, header=head, vocab=vocab_blob, **arrays)"):
        "f is an atomic_open file",
    ("attnlm/cli/interp.py", "np.savez(buffer, **{k: v.float().numpy() for k, v in "
     "result.items()})"): "an in-memory buffer, written by atomic_write_bytes",
    ("attnlm/train/data_dir.py", "shutil.copyfile(target, tmp)"):
        "a temporary name beside the link, renamed into place below",
    ("attnlm/train/data_dir.py", "os.replace(tmp, link)"): "the link's atomic rename",
    ("attnlm/train/run.py", "os.replace(ckpt, old)"):
        "--overwrite retires the old checkpoint whole to checkpoint.old (still found on load)",
}  # fmt: skip


def raw_writes() -> dict[tuple[str, str], str]:
    """(file, stripped line) -> the kind of raw write, for every match in src/."""
    found = {}
    for f in sorted((SRC / "attnlm").rglob("*.py")):
        rel = f.relative_to(SRC).as_posix()
        for line in f.read_text(encoding="utf-8").splitlines():
            for kind, pat in PATTERNS.items():
                if pat.search(line):
                    found[(rel, line.strip())] = kind
    return found


def test_every_raw_write_is_allowed_with_a_reason():
    found = raw_writes()
    new = [f"{f}: {kind}: {line}" for (f, line), kind in found.items() if (f, line) not in ALLOWED]
    assert not new, "write these through attnlm.base.fileio (or allow them with a reason):\n" + (
        "\n".join(new)
    )
    stale = [k for k in ALLOWED if k not in found]
    assert not stale, f"allowed lines no longer in src/ (remove them): {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_scan_finds_each_kind_of_raw_write():
    """The patterns catch what they should (so an empty result above means something)."""
    lines = [
        'with open(p, "w") as f:',
        "with gzip.open(p, 'wt') as f:",
        'p.open("ab")',
        'p.write_text("x")',
        "p.write_bytes(b)",
        "np.save(p, a)",
        "np.savez_compressed(p, a=a)",
        "torch.save(s, p)",
        "save_file(t, p)",
        "fig.savefig(p)",
        "a.tofile(f)",
        "os.rename(a, b)",
        "shutil.copyfile(a, b)",
        "tempfile.mkdtemp()",
    ]
    for line in lines:
        assert any(p.search(line) for p in PATTERNS.values()), line
    for line in ['open(p, "rb")', 'open(p, encoding="utf-8")', "atomic_open(p, 'w')"]:
        assert not [k for k, p in PATTERNS.items() if p.search(line)], line


def _child(code: str, env_value: str, tmp_path):
    import os
    import subprocess
    import sys

    from attnlm.base.fileio import KILL_ENV

    env = {**os.environ, KILL_ENV: env_value, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, timeout=60)


def test_a_kill_mid_append_cuts_only_the_last_line(tmp_path):
    import json

    code = (
        "from attnlm.base.fileio import append_line\n"
        "for i in range(5):\n"
        "    append_line('m.jsonl', '{\"step\": %d, \"pad\": \"%s\"}' % (i, 'x' * 20))\n"
    )
    r = _child(code, "append:3", tmp_path)
    assert r.returncode == -9
    lines = (tmp_path / "m.jsonl").read_text().split("\n")
    assert [json.loads(x)["step"] for x in lines[:-1]] == [0, 1]
    assert lines[-1] and not lines[-1].endswith("}")  # the third line, cut half-way


def test_kill_points_count_by_label_and_all_together(tmp_path):
    code = (
        "from attnlm.base.fileio import atomic_write_text, kill_point\n"
        "for i in range(4):\n"
        "    atomic_write_text(f'f{i}.txt', 'x')\n"
    )
    r = _child(code, "*:3", tmp_path)
    assert r.returncode == -9
    assert sorted(p.name for p in tmp_path.glob("f*.txt")) == ["f0.txt", "f1.txt"]
    assert len(list(tmp_path.glob(".f2.txt.tmp-*"))) == 1  # complete, never renamed
    assert _child(code, "append:1", tmp_path).returncode == 0  # no append point: runs through
