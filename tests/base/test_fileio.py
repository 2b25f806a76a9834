"""Atomic writes (attnlm.base.fileio) and kill injection: a writer SIGKILLed mid-write leaves the
old file intact, for every kind of file the project writes outside train/models/generate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from attnlm.base.errors import InputError
from attnlm.base.fileio import (
    atomic_open,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    remove_stale_temps,
)
from support import SRC


def test_write_replace_and_no_leftovers(tmp_path):
    p = tmp_path / "sub" / "a.txt"
    atomic_write_text(p, "one\n")
    atomic_write_text(p, "two\r\nlines\n")
    assert p.read_bytes() == b"two\r\nlines\n"
    atomic_write_bytes(p, b"\x00\xff")
    assert p.read_bytes() == b"\x00\xff"
    with atomic_open(p, "w") as f:
        f.write("streamed ")
        f.write("text\n")
    assert p.read_text() == "streamed text\n"
    assert sorted(x.name for x in p.parent.iterdir()) == ["a.txt"]


def test_failed_write_keeps_old_file_and_removes_temp(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(p, "w") as f:
            f.write("new partial")
            raise RuntimeError("writer failed")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["a.txt"]
    with pytest.raises(ZeroDivisionError):
        with atomic_path(p) as tmp:
            tmp.write_text("x")
            raise ZeroDivisionError
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["a.txt"]


def test_unwritable_target_is_one_line_input_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="cannot write") as e:
        atomic_write_text(blocker / "a.txt", "x")  # parent is a file
    assert "\n" not in str(e.value)


def test_a_device_or_a_pipe_is_never_replaced_by_a_file(tmp_path):
    """The rename would swap a device node (``/dev/full``) or a FIFO for a regular file: refused
    in one line, the node left as it was (a FIFO stands in for the device)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file") as e:
        atomic_write_text(fifo, "x")
    assert "\n" not in str(e.value) and fifo.is_fifo()
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file either


def test_a_lock_that_cannot_be_made_names_the_output(tmp_path):
    from attnlm.base.fileio import lock_file_for, output_lock

    out = tmp_path / "out.png"
    lock_file_for(out, folder=False).mkdir()  # the lock file cannot be opened (as in /proc)
    with pytest.raises(InputError, match="cannot write") as e:
        with output_lock(out, folder=False):
            pass
    assert str(e.value).startswith(f"{out}: "), e.value  # not the hidden lock file's name


# ---------------------------------------------------------------- kill injection
# The child writes the old file, installs a patch that calls stop() in the middle of the next
# write (stop() announces itself with a marker file and sleeps), and starts that write; the
# parent SIGKILLs it once the marker exists and checks the old file byte for byte.

CHILD_PRELUDE = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop():
    (out.parent / "STOPPED").write_text("x")
    time.sleep(60)
"""

ARPA_SETUP = """
import random
from attnlm.ngram import train
from attnlm.ngram.arpa import write_arpa
rng = random.Random(0)
words = [f"w{i}" for i in range(300)]
sents = [[rng.choice(words) for _ in range(12)] for _ in range(400)]
model = train(sents, 3)
model2 = train(sents[:200], 3)
"""
ARPA_STOP = """
import attnlm.ngram.arpa_write as arpa_write
real_chunk, calls = arpa_write._chunk_bytes, [0]
def chunk(*a):
    calls[0] += 1
    if calls[0] == 3:  # the unigrams and bigrams already written
        stop()
    return real_chunk(*a)
arpa_write._chunk_bytes = chunk
write_arpa(model2, out)
"""
FSYNC_STOP = """
import attnlm.base.fileio as fio
fio.os.fsync = lambda fd: stop()  # the temp file is complete, the rename not yet done
"""
# Stops in the middle of the write itself: the file object opened for writing writes half of
# what it is given and stops (an in-place write would leave the target cut in half).
HALF_WRITE_STOP = """
import builtins, io
real_open = io.open
class Half:
    def __init__(self, f):
        self.f = f
    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        stop()
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def __getattr__(self, name):
        return getattr(self.f, name)
def patched(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    return Half(f) if "w" in mode and out.name in str(file) else f
builtins.open = io.open = patched
"""

#: case: (file name, setup, the first (old) write, patch + second write that gets killed)
CASES = {
    "arpa": ("lm.arpa", ARPA_SETUP, "write_arpa(model, out)", ARPA_STOP),
    "arpa.gz": ("lm.arpa.gz", ARPA_SETUP, "write_arpa(model, out)", ARPA_STOP),
    "npz": (
        "lm.npz",
        ARPA_SETUP,
        "model.save(out)",
        """
import attnlm.ngram.model as m
def savez(f, **arrays):
    f.write(b"PK\\x03\\x04 partial")
    f.flush()
    stop()
m.np.savez = savez
model2.save(out)
""",
    ),
    "tokenizer json": (
        "tok.json",
        "from attnlm.tokenizers import CharTokenizer",
        'CharTokenizer.train("old text").save(out)',
        FSYNC_STOP + 'CharTokenizer.train("a much longer new text" * 1000).save(out)',
    ),
    "tiktoken": (
        "tok.tiktoken",
        "from attnlm.tokenizers.tiktoken_io import write_tiktoken",
        "write_tiktoken(out, {bytes([b]): b for b in range(256)})",
        FSYNC_STOP + "write_tiktoken(out, {bytes([b]): 255 - b for b in range(256)})",
    ),
    "token file": (
        "train.bin",
        "from attnlm.data.windows import write_token_file",
        "write_token_file(list(range(100)), out, 100, 100)",
        FSYNC_STOP + "write_token_file(list(range(1000)) * 50, out, 1000, 50000)",
    ),
    "png": (
        "attention.png",
        "import numpy as np\nfrom attnlm.inspect.heatmap import plot_attention_grid",
        'plot_attention_grid([np.eye(3)[None]], ["a", "b", "c"], out)',
        FSYNC_STOP + 'plot_attention_grid([np.ones((2, 4, 4)) / 4], list("abcd"), out)',
    ),
    "metrics.jsonl resume": (
        "metrics.jsonl",
        "import json",
        "out.write_text(''.join(json.dumps({'step': i, 'loss': 1.0 / (i + 1)}) + '\\n' "
        "for i in range(72)))",
        "from attnlm.train.trainer import MetricsLog\n"
        + HALF_WRITE_STOP
        + "MetricsLog(out, True, keep_until=48)",
    ),
}


def _run_child(out: Path, *parts: str, **kw) -> subprocess.Popen:
    script = CHILD_PRELUDE + "\n".join(textwrap.dedent(p) for p in parts) + "\n"
    env = {**os.environ, "PYTHONPATH": str(SRC), "MPLBACKEND": "Agg"}
    return subprocess.Popen(
        [sys.executable, "-c", script, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigkill_mid_write_keeps_old_file(tmp_path, case):
    name, setup, first, second = CASES[case]
    # the old file, and the same bytes written again elsewhere as the reference
    ref = tmp_path / "ref" / name
    ref.parent.mkdir()
    for target in (tmp_path / name, ref):
        done = _run_child(target, setup, first)
        assert done.wait(120) == 0, done.stderr.read()
    old = (tmp_path / name).read_bytes()
    assert _same_content(name, old, ref.read_bytes())

    out = tmp_path / name
    child = _run_child(out, setup, second)
    marker = tmp_path / "STOPPED"
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if child.poll() is not None:
                pytest.fail(f"the writer finished without being stopped: {child.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail("the child never reached the injected stop")
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert out.read_bytes() == old, f"{case}: the old file was damaged by a killed write"
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(f".{name}.tmp-")]
    assert leftovers, "expected the killed writer's temp file"
    assert remove_stale_temps(tmp_path, name) == leftovers
    assert not any(p.name.startswith(f".{name}.tmp-") for p in tmp_path.iterdir())


def _same_content(name: str, a: bytes, b: bytes) -> bool:
    """Equal bytes, or equal content for formats whose header holds a time stamp."""
    if a == b:
        return True
    if name.endswith(".gz"):
        import gzip

        return gzip.decompress(a) == gzip.decompress(b)
    if name.endswith(".png"):
        import io

        from PIL import Image

        x, y = Image.open(io.BytesIO(a)), Image.open(io.BytesIO(b))
        return x.size == y.size and x.tobytes() == y.tobytes()
    return False


def test_a_file_made_by_a_private_writer_gets_the_usual_mode(tmp_path):
    """safetensors creates its files 0600; written through atomic_path, the file gets the mode
    open() gives (0666 less the umask), so an exported folder is readable like its JSON files."""
    from attnlm.base.fileio import atomic_path, atomic_write_text

    target = tmp_path / "weights.bin"
    with atomic_path(target) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"x")
        os.close(fd)
    atomic_write_text(tmp_path / "config.json", "{}")
    assert target.stat().st_mode & 0o777 == (tmp_path / "config.json").stat().st_mode & 0o777
