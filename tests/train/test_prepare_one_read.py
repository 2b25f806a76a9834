"""The one-read preparation (a text corpus and a byte-level BPE given beforehand) writes the
files of the multi-pass preparation byte for byte (token files, their metadata, ``data.json``
with the corpus's SHA-256 digests) with one worker or two, and fails with the same one-line
errors; a folder it prepared is reused, and a changed file of the same size and time is not."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlm.base.errors import InputError
from attnlm.base.textio import MAX_LINE
from attnlm.tokenizers import BPETokenizer
from attnlm.train.config import TrainConfig
from attnlm.train.data import prepare
from support import CITIZENS

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ("train.bin", "val.bin", "train.json", "val.json", "data.json")


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "bpe.json"
    BPETokenizer.train(CITIZENS + "caf\u00e9 \u4e2d\u6587\r\n", 300).save(path)
    return path


def _outcome(run: Path, text: Path, tok: Path, **kw) -> dict[str, bytes] | str:
    """The files a preparation writes, or its error line."""
    workers = kw.pop("workers", 1)
    cfg = TrainConfig(text=str(text), tokenizer=str(tok), workers=workers, progress=False)
    try:
        prepare(run, cfg, **kw)
    except InputError as e:
        return str(e)
    return {name: (run / name).read_bytes() for name in NAMES}


def _both(tmp: Path, text: Path, tok: Path, chunk: int, workers: int = 1):
    one = _outcome(tmp / "one", text, tok, chunk_chars=chunk, workers=workers)
    passes = _outcome(tmp / "passes", text, tok, chunk_chars=chunk, one_read=False)
    return one, passes


def _lines(n: int) -> str:
    words = CITIZENS.split()
    return "".join(f"{words[i % len(words)]} {i} caf\u00e9{',' if i % 3 else '.'}\r\n"
                   + ("\n" if i % 7 == 0 else "") for i in range(n))  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_one_file_in_one_read_equals_the_passes(tmp_path, tok_file, workers):
    text = tmp_path / "c.txt"
    text.write_text("\ufeff" + _lines(3000) + "  no final line break \u4e2d", encoding="utf-8")
    one, passes = _both(tmp_path, text, tok_file, 2000, workers)
    assert isinstance(one, dict) and one == passes


def test_a_folder_in_one_read_equals_the_passes(tmp_path, tok_file):
    folder = tmp_path / "corpus"
    files = {
        "a/1.txt": _lines(500) + "no final line break",
        "a/2.txt": "",
        "b/3.txt": "  starts with spaces\n\u3000ideographic space\n" + _lines(700),
        "b/4.txt": "\ufeff",
        "c.txt": "\ufeff\n\n" + _lines(900),
    }
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content, encoding="utf-8")
    one, passes = _both(tmp_path, folder, tok_file, 1500)
    assert isinstance(one, dict) and one == passes


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="ab \n\r\u00e9\u00a0\u4e2d.", min_size=0, max_size=300),
       st.integers(1, 60), st.sampled_from([1, 7]))  # fmt: skip
def test_any_text_in_one_read_equals_the_passes(tok_file, text, chunk, copies):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.txt"
        path.write_text(text * copies, encoding="utf-8")
        one, passes = _both(Path(d), path, tok_file, chunk)
    assert one == passes  # the same files, or the same error line


@pytest.mark.parametrize(
    "content",
    [
        b"".join(b"line %d\n" % i for i in range(3000)) + b"caf\xe9\n",  # bad UTF-8 on a line
        b"ok\n" * 3000 + b"the cat\x00 sat\n",  # a NUL
        b"ok\n" * 10 + b"a" * (MAX_LINE + 10) + b"\n",  # a line over the limit
        b"",  # empty
        b" \n\t\n \n",  # spaces only
        b"\xff\xfeh\x00i\x00",  # UTF-16
    ],
    ids=["bad-utf8", "nul", "long-line", "empty", "spaces", "utf16"],
)
def test_one_read_fails_with_the_passes_error(tmp_path, tok_file, content):
    text = tmp_path / "c.txt"
    text.write_bytes(content)
    one, passes = _both(tmp_path, text, tok_file, 1000)
    assert isinstance(one, str) and one == passes


@pytest.mark.parametrize("where", [10, -10])
def test_a_special_token_in_the_text_fails_as_in_the_passes(tmp_path, where):
    tok = tmp_path / "tok.json"
    BPETokenizer.train(CITIZENS, 300, special_tokens=["<|eot|>"]).save(tok)
    lines = _lines(3000).splitlines(keepends=True)
    lines[where] = "here <|eot|> is\n"
    text = tmp_path / "c.txt"
    text.write_text("".join(lines), encoding="utf-8")
    one, passes = _both(tmp_path, text, tok, 1000)
    split = "training" if where > 0 else "validation"
    assert isinstance(one, str) and one == passes and one.startswith(f"{split} text: ")


def test_one_read_folder_is_reused_and_a_same_size_same_time_change_is_not(tmp_path, tok_file):
    text = tmp_path / "c.txt"
    text.write_text(_lines(2000), encoding="utf-8")
    cfg = TrainConfig(text=str(text), tokenizer=str(tok_file), workers=1, progress=False)
    first = prepare(tmp_path / "run", cfg, chunk_chars=4000)
    assert first.seconds > 0
    again = prepare(tmp_path / "run", cfg, chunk_chars=4000)
    assert again.seconds == 0  # reused: data.json's digests match the file
    st_ = text.stat()
    data = bytearray(text.read_bytes())
    data[:5] = b"XXXXX"  # same size; the time is put back below
    text.write_bytes(bytes(data))
    os.utime(text, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    changed = prepare(tmp_path / "run", cfg, chunk_chars=4000)
    assert changed.seconds > 0  # the content hash differs: prepared again
    resumed = prepare(tmp_path / "run", cfg, resume=True)
    assert resumed.seconds == 0
