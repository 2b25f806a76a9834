"""Fast pre-tokenization for the built-in patterns: ASCII stretches go to the stdlib ``re``.

The built-in patterns use Unicode classes (``\\p{L}``, ``\\p{N}``, ``\\s``) that only the
``regex`` module knows. On ASCII text each has an exact stdlib ``re`` twin (letters
``A-Za-z``, digits ``0-9``, whitespace ``\\t\\n\\v\\f\\r`` and space, the Unicode White_Space
characters below 128), which splits about twice as fast. Most real text is mostly ASCII, so
:class:`Splitter` cuts the text into ASCII and non-ASCII blocks at *safe breaks*, points that no
chunk of the pattern crosses and where matching starts afresh, splits ASCII blocks with the twin
and the rest with ``regex``. The result is ``regex.findall(pattern, text)`` exactly (tested).

Safe breaks:

* ``gpt2`` (published and reordered): between a non-space and a space. Letter, digit and
  punctuation chunks stop at whitespace and whitespace chunks hold only whitespace, whose
  lookahead ``(?!\\S)`` never looks past the run.
* ``cl100k``: after ``\\r`` or ``\\n`` followed by a non-space. A chunk that holds a line break
  holds only whitespace, or punctuation then line breaks, so it ends there; a whitespace run at
  a block's end ends in a line break and is one chunk (``\\s*[\\r\\n]`` in the whole text,
  ``\\s++$`` in the block), the same either way.

Python's ``str.isspace`` (and ``re``'s ``\\s``) also counts U+001C..U+001F, which are not
White_Space: the break tests are written so that this only ever removes breaks.
"""

from __future__ import annotations

import re

import regex

_W = r"\t\n\x0b\x0c\r "  # Unicode White_Space below U+0080
_GPT2_TAIL = rf" ?[0-9]+| ?[^{_W}A-Za-z0-9]+|[{_W}]+(?![^{_W}])|[{_W}]+"

#: (full pattern, its stdlib-re twin on ASCII text, safe-break regex: break after match start)
_FAST: list[tuple[str, str, str]] = [
    (
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+|" + _GPT2_TAIL,
        r"\S(?=[^\S\x1c-\x1f])",
    ),
    (
        r""" ?\p{L}+|'(?:[stmd]|re|ve|ll)| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        r" ?[A-Za-z]+|'(?:[stmd]|re|ve|ll)|" + _GPT2_TAIL,
        r"\S(?=[^\S\x1c-\x1f])",
    ),
    (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
        r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        r"'(?:[sdmtSDMT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\nA-Za-z0-9]?+[A-Za-z]++|[0-9]{1,3}+"
        rf"| ?[^{_W}A-Za-z0-9]++[\r\n]*+|[{_W}]++$|[{_W}]*[\r\n]|[{_W}]+(?![^{_W}])|[{_W}]",
        r"[\r\n](?=\S)",
    ),
]
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_WINDOW = 256  # how far back to look for a safe break at first


def _last_break(brk: re.Pattern[str], text: str, lo: int, s: int) -> int:
    """The last safe break ``b`` with ``lo < b <= s``, or ``lo`` if there is none.

    The window searched back from ``s`` doubles each time it holds no break, so finding a
    break at distance ``d`` scans O(d) characters (a fixed step made a long run without
    breaks before a non-ASCII character quadratic), and only ``[start, s]`` is rescanned."""
    width = _WINDOW
    end = s + 1
    while True:
        start = max(lo, s - width)
        last = -1
        for m in brk.finditer(text, start, end):
            last = m.start() + 1
        if last > lo or start == lo:
            return max(last, lo)
        # nothing in [start, end): look further back only (a break match needs one character
        # of lookahead, so overlap the old window by one)
        end = start + 1
        width *= 2


class Splitter:
    """``Splitter(pattern)(text) == regex.findall(pattern, text)``: the fast mixed split for a
    built-in pattern, plain ``regex`` for any other. Picklable."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._full = regex.compile(pattern)
        self._twin: re.Pattern[str] | None = None
        self._brk: re.Pattern[str] | None = None
        for known, ascii_twin, breaks in _FAST:
            if pattern == known:
                self._twin, self._brk = re.compile(ascii_twin), re.compile(breaks)

    def __call__(self, text: str) -> list[str]:
        twin, brk, full = self._twin, self._brk, self._full
        if twin is None or brk is None:
            return full.findall(text)
        if text.isascii():
            return twin.findall(text)
        out: list[str] = []
        pos, n = 0, len(text)
        while pos < n:
            m = _NON_ASCII.search(text, pos)
            if m is None:
                out += twin.findall(text, pos)
                break
            start = _last_break(brk, text, pos, m.start())
            nxt = brk.search(text, m.end())
            end = nxt.start() + 1 if nxt else n
            if start > pos:
                out += twin.findall(text, pos, start)
            out += full.findall(text[start:end])
            pos = end
        return out
