"""Reading and writing sentence-pair files: the tab-separated Tatoeba / manythings.org layout.

File format::

    source<TAB>target[<TAB>anything else]      one pair per line, UTF-8

How each irregularity is handled (``strict=False`` is the default):

=====================  ====================================  ==============================
case                   lenient (default)                     ``strict=True``
=====================  ====================================  ==============================
CRLF / CR line ends    read as line ends                     same
UTF-8 byte order mark  removed                               same
header line            dropped when ``header=True``, or      same
                       with ``"auto"`` when the first
                       non-blank line's first two fields
                       are column names (``source``,
                       ``target``, ``en``, ``English``, ...)
blank line             skipped, counted as ``blank``         same (never an error)
missing tab            skipped, counted as ``no_tab``        ``InputError`` ``FILE:LINE: ...``
empty source / target  skipped, ``empty_source`` /           ``InputError`` ``FILE:LINE: ...``
                       ``empty_target``
third and later        ignored (counted in                   same
columns                ``extra_columns``)
spaces around a side   removed                               same
non-UTF-8 bytes        ``InputError`` naming line and byte   same
no pair left           ``InputError`` with the skip counts   same
=====================  ====================================  ==============================

Every skip is reported in a :class:`PairsReport` (lines read, pairs kept, skips by reason with
the first few line numbers), so nothing disappears silently. :func:`write_pairs` writes the same
format back (UTF-8, LF line ends, no quoting).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.fileio import atomic_write_text
from attnlm.base.foreign import register as _register_reader
from attnlm.base.textio import decode_text

SKIP_REASONS = ("blank", "no_tab", "empty_source", "empty_target")
FIRST_LINES = 5  # line numbers remembered per skip reason
HEADER_NAMES = frozenset(
    "source target src tgt input output text translation english french german "
    "en fr de eng fra fre deu ger".split()
)
HeaderMode = bool | Literal["auto"]


class Pair(NamedTuple):
    """One sentence pair: the ``source`` text and its translation ``target`` (both stripped,
    non-empty, without tabs or line breaks)."""

    source: str
    target: str


@dataclass
class PairsReport:
    """What reading a pairs file did.

    ``lines``: physical lines in the file (blank and header lines included, a final line end
    not counted as an extra line); ``kept``: pairs returned; ``skipped``: count per reason (see
    :data:`SKIP_REASONS`); ``first_lines``: the first few line numbers (1-based) per reason;
    ``header_line``: the line dropped as a header, if any; ``extra_columns``: kept lines that
    had a third or later column (ignored); ``crlf``: lines that ended in CR LF or CR;
    ``bom``: whether a UTF-8 byte order mark was removed.
    """

    source: str
    lines: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    first_lines: dict[str, list[int]] = field(default_factory=dict)
    header_line: int | None = None
    extra_columns: int = 0
    crlf: int = 0
    bom: bool = False

    @property
    def n_skipped(self) -> int:
        """Lines skipped for any reason (blank lines included)."""
        return sum(self.skipped.values())

    def _skip(self, reason: str, line: int) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        first = self.first_lines.setdefault(reason, [])
        if len(first) < FIRST_LINES:
            first.append(line)

    def describe_skips(self, reasons: Iterable[str] = SKIP_REASONS) -> str:
        """``2 no_tab (lines 4, 9), 1 empty_target (line 7)``; empty when nothing matched."""
        parts = []
        for r in reasons:
            n = self.skipped.get(r, 0)
            if n:
                lines = self.first_lines.get(r, [])
                where = ", ".join(map(str, lines)) + (", ..." if n > len(lines) else "")
                parts.append(f"{n} {r} (line{'s' if len(lines) > 1 else ''} {where})")
        return ", ".join(parts)

    def warning(self) -> str | None:
        """One line for stderr when pairs were dropped (blank lines alone are not worth it)."""
        dropped = [r for r in SKIP_REASONS if r != "blank" and self.skipped.get(r)]
        if not dropped:
            return None
        n = sum(self.skipped[r] for r in dropped)
        return f"{self.source}: skipped {n} malformed line(s): {self.describe_skips(dropped)}"

    def format(self) -> str:
        """A few lines for ``attnlm data pairs``."""
        out = [f"pairs: {self.kept:,} kept of {self.lines:,} lines"]
        skips = self.describe_skips()
        out.append(f"skipped: {skips or 'none'}")
        notes = []
        if self.header_line is not None:
            notes.append(f"header on line {self.header_line}")
        if self.extra_columns:
            notes.append(f"{self.extra_columns:,} line(s) with extra columns (ignored)")
        if self.crlf:
            notes.append(f"{self.crlf:,} CRLF/CR line ends")
        if self.bom:
            notes.append("byte order mark removed")
        if notes:
            out.append("notes: " + "; ".join(notes))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "lines": self.lines,
            "kept": self.kept,
            "skipped": dict(self.skipped),
            "first_lines": {k: list(v) for k, v in self.first_lines.items()},
            "header_line": self.header_line,
            "extra_columns": self.extra_columns,
            "crlf": self.crlf,
            "bom": self.bom,
        }


def looks_like_header(fields: Sequence[str]) -> bool:
    """Whether the first two fields of a line are both column names such as ``source`` /
    ``target`` or ``English`` / ``French`` (case-insensitive, see :data:`HEADER_NAMES`)."""
    if len(fields) < 2:
        return False
    a, b = fields[0].strip().lower(), fields[1].strip().lower()
    return a != b and a in HEADER_NAMES and b in HEADER_NAMES


def _split_lines(text: str, report: PairsReport) -> list[str]:
    """The lines of ``text``, its byte order mark removed and CRLF / CR line ends read as line
    ends (both noted in ``report``, with the number of lines)."""
    if text.startswith("\ufeff"):
        text = text[1:]
        report.bom = True
    if "\r" in text:
        report.crlf = text.count("\r")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line end
    report.lines = len(lines)
    return lines


def parse_pairs(
    text: str,
    *,
    name: str = "<text>",
    strict: bool = False,
    header: HeaderMode = "auto",
    reverse: bool = False,
) -> tuple[list[Pair], PairsReport]:
    """Parse tab-separated pairs from a string (see the module docstring for each case).

    ``name`` prefixes error messages (a file name); ``header``: ``True`` drops the first
    non-blank line, ``False`` never drops one, ``"auto"`` drops it when it
    :func:`looks_like_header`; ``reverse`` swaps the columns (target first). Returns the pairs
    and a :class:`PairsReport`; raises :class:`InputError` for a malformed line when ``strict``
    and when no pair is left.
    """
    if header not in (True, False, "auto"):
        raise ConfigError(f"header must be True, False or 'auto', got {header!r}")
    report = PairsReport(source=name)
    lines = _split_lines(text, report)
    pairs: list[Pair] = []
    first_content = True
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            report._skip("blank", lineno)
            continue
        fields = line.split("\t")
        if first_content:
            first_content = False
            if header is True or (header == "auto" and looks_like_header(fields)):
                report.header_line = lineno
                continue
        if len(fields) < 2:
            if strict:
                raise InputError(
                    f"{name}:{lineno}: no tab between source and target "
                    f"(expected source<TAB>target): {_preview(line)}"
                )
            report._skip("no_tab", lineno)
            continue
        src, tgt = fields[0].strip(), fields[1].strip()
        if reverse:
            src, tgt = tgt, src
        if not src or not tgt:
            side = "source" if not src else "target"
            if strict:
                raise InputError(f"{name}:{lineno}: empty {side} sentence: {_preview(line)}")
            report._skip(f"empty_{side}", lineno)
            continue
        if len(fields) > 2:
            report.extra_columns += 1
        pairs.append(Pair(src, tgt))
    report.kept = len(pairs)
    if not pairs:
        skips = report.describe_skips()
        raise InputError(f"{name}: no sentence pairs found" + (f" ({skips})" if skips else ""))
    return pairs, report


def _preview(line: str, n: int = 60) -> str:
    return repr(line if len(line) <= n else line[:n] + "...")


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` as text, read by the one strict reader (:func:`attnlm.base.textio.decode_text`): an
    :class:`InputError` naming the file, line and byte otherwise."""
    text = decode_text(data, name, empty_ok=True)
    return "\ufeff" + text if data.startswith(b"\xef\xbb\xbf") else text  # the report notes it


def read_pairs(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    header: HeaderMode = "auto",
    reverse: bool = False,
) -> tuple[list[Pair], PairsReport]:
    """Read a tab-separated pairs file (see :func:`parse_pairs` and the module docstring)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{p}: is a folder; --pairs needs one tab-separated file")
    from attnlm.base.fileio import read_file_bytes

    data = read_file_bytes(p, text=True)
    return parse_pairs(
        decode_utf8(data, str(p)), name=str(p), strict=strict, header=header, reverse=reverse
    )


def write_pairs(
    path: str | os.PathLike[str],
    pairs: Iterable[Sequence[str]],
) -> int:
    """Write pairs (or longer rows: source, target, extra columns) as UTF-8 TSV with LF line
    ends; returns the number of rows. A field containing a tab or line break is an
    :class:`InputError` (the format has no quoting)."""
    rows = []
    for i, row in enumerate(pairs):
        for f in row:
            if any(c in f for c in "\t\r\n"):
                raise InputError(f"pair {i}: field {f!r} contains a tab or line break")
        rows.append("\t".join(row) + "\n")
    atomic_write_text(Path(path), "".join(rows))  # one-line InputError on failure
    return len(rows)


_register_reader("pairs", f"{__name__}.read_pairs")
