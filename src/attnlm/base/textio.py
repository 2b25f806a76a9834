"""The one strict reader of text: every way text enters attnlm goes through here.

Files and folders, standard input, command-line arguments, JSON request bodies and TOML presets
all come in as bytes (or, for arguments, as the ``str`` Python made of the shell's bytes) and
leave as checked text, or as one :class:`~attnlm.base.errors.InputError` line that names *where*:

- ``PATH:2: not valid UTF-8 (bad byte 0xe9 at byte 4 of the line)`` (a file and its line), and
  ``stdin: not valid UTF-8 (bad byte 0xe9 at offset 3)``;
- ``argument --prompt: not valid UTF-8 (bad byte 0xff at offset 3)``: Python hands a program
  the bytes of an argument that are not UTF-8 as lone surrogates U+DC80..U+DCFF
  (``surrogateescape``); they are turned back into the byte they stand for;
- ``field 'text': not valid text (lone surrogate U+D800 at offset 0)`` (a JSON ``\\ud800``);
- ``PATH: contains a NUL character at line 4 (a binary file?)``;
- ``PATH: line 7 is 10,485,760 characters long (the limit is 4,194,304; is it a text file?)``;
- ``stdin: empty input`` (where the caller asks for text).

UTF-8 is the only encoding: a byte-order mark is dropped, UTF-16 is recognised by its mark
and named, and nothing is ever replaced by U+FFFD silently. The checks on bytes run at C speed
(``bytes.find``, NumPy over the newline positions), so a corpus of gigabytes costs one pass.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from attnlm.base.errors import InputError

#: The longest line accepted from a file, standard input or an argument, in characters (in
#: bytes for files and stdin, which is never fewer): 4 MiB. Real text (prose, code, a
#: Wikipedia article per line) stays far below; a longer "line" is a binary or a minified blob.
MAX_LINE = 4 * 1024 * 1024

_SURROGATE = re.compile("[\ud800-\udfff]")


def _fail(where: str, what: str) -> InputError:
    return InputError(f"{where}: {what}")


def _line_of(data: bytes | str, offset: int, first_line: int) -> int:
    nl = b"\n" if isinstance(data, bytes) else "\n"
    return first_line + data.count(nl, 0, offset)


def _longest_line(data: bytes) -> tuple[int, int]:
    """(length in bytes, 0-based index) of the longest line of ``data``."""
    if len(data) <= MAX_LINE:
        return len(data), 0  # cannot be over the limit: skip the scan
    import numpy as np

    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    bounds = np.concatenate(([-1], ends, [len(data)]))
    lengths = np.diff(bounds) - 1
    i = int(lengths.argmax())
    return int(lengths[i]), i


def decode_text(
    data: bytes,
    where: str,
    *,
    empty_ok: bool = False,
    first_line: int = 1,
    first_offset: int = 0,
    name_line: bool = True,
) -> str:
    """``data`` as text: strict UTF-8 (a leading byte-order mark dropped), no NUL, no line over
    :data:`MAX_LINE`, not empty unless ``empty_ok``. A bad byte is named as ``WHERE:LINE:`` (a
    file) or, with ``name_line=False``, ``WHERE:`` and its offset alone (a stream such as
    stdin). ``first_line`` / ``first_offset`` place a chunk of a larger file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")) and first_offset == 0:
            raise _fail(where, "looks like UTF-16 (byte order mark); save it as UTF-8") from None
        byte = f"bad byte 0x{data[e.start]:02x}"
        if not name_line:
            what = f"not valid UTF-8 ({byte} at offset {first_offset + e.start})"
            raise _fail(where, what) from None
        line = _line_of(data, e.start, first_line)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(
            f"{where}:{line}", f"not valid UTF-8 ({byte} at byte {column} of the line)"
        ) from None
    nul = data.find(b"\x00")
    if nul >= 0:
        line = _line_of(data, nul, first_line)
        raise _fail(where, f"contains a NUL character at line {line} (a binary file?)")
    longest, index = _longest_line(data)
    if longest > MAX_LINE:
        raise _fail(
            where,
            f"line {first_line + index} is {longest:,} bytes long (the limit is {MAX_LINE:,}; "
            "is it a text file?)",
        )
    if text.startswith("\ufeff") and first_offset == 0:
        text = text[1:]
    if not empty_ok and not text:
        raise _fail(where, "empty input")
    return text


def text_problem(text: str, *, empty_ok: bool = False) -> str | None:
    """What is wrong with ``text`` that arrived as ``str`` (an argument, a JSON string), or
    None: surrogate-escaped bytes are named as the bytes they were, other lone surrogates as
    such, then NUL, line length and emptiness."""
    m = _SURROGATE.search(text)
    if m:
        code = ord(m.group())
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte the shell gave
            return f"not valid UTF-8 (bad byte 0x{code - 0xDC00:02x} at offset {m.start()})"
        return f"not valid text (lone surrogate U+{code:04X} at offset {m.start()})"
    nul = text.find("\x00")
    if nul >= 0:
        return f"contains a NUL character at offset {nul}"
    if len(text) > MAX_LINE:
        longest = max(map(len, text.split("\n")))
        if longest > MAX_LINE:
            return f"a line is {longest:,} characters long (the limit is {MAX_LINE:,})"
    if not empty_ok and not text:
        return "empty"
    return None


def value_problem(value: object) -> str | None:
    """:func:`text_problem` (empty allowed) of a parsed value, or of the first string of a
    list of them that has one; None for anything else (numbers, None)."""
    for v in value if isinstance(value, list) else [value]:
        problem = isinstance(v, str) and text_problem(v, empty_ok=True)
        if problem:
            return problem
    return None


def check_text(text: str, where: str, *, empty_ok: bool = False) -> str:
    """``text`` if :func:`text_problem` finds nothing wrong, else an :class:`InputError`
    naming ``where``."""
    problem = text_problem(text, empty_ok=empty_ok)
    if problem:
        raise _fail(where, problem)
    return text


def read_stdin(where: str = "stdin", *, empty_ok: bool = False) -> str:
    """All of standard input, read and checked (:func:`decode_text`)."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # replaced by a text stream (tests, embedding)
        return check_text(sys.stdin.read(), where, empty_ok=empty_ok)
    return decode_text(_read_bounded(stream), where, empty_ok=empty_ok, name_line=False)


def _read_bounded(stream: Any) -> bytes:
    """All of ``stream``, but no further than the block holding the first NUL byte or a line
    longer than :data:`MAX_LINE` (nothing after them can make the input text, and
    :func:`decode_text` names them): ``< /dev/zero`` costs one block, not all memory."""
    chunks: list[bytes] = []
    total = line_start = 0
    while chunk := stream.read(1 << 20):
        chunks.append(chunk)
        if b"\0" in chunk:
            break
        last = chunk.rfind(b"\n")
        if last >= 0:
            line_start = total + last + 1
        total += len(chunk)
        if total - line_start > MAX_LINE + 3:  # + a byte-order mark and a CR
            break
    return b"".join(chunks)
