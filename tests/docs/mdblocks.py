"""The code blocks of a Markdown page, the doc-test markers before them, and the shape check
of a shown transcript against what the commands printed.

Blocks
  A fenced block whose info string is ``bash``, ``sh``, ``console`` or ``python`` is code. A
  plain fence (or ``text``) whose lines start with ``$ COMMAND`` is a transcript: each command
  runs and what it prints is compared with the lines shown under it (:func:`same_shape`).

A transcript whose shown output has ``error:`` may exit non-zero (the page shows an error).

Markers (an HTML comment on its own line(s), anywhere between the previous block and this one)
  ``<!-- doctest: slow -->``              runs only in the full suite (pytest marker ``slow``)
  ``<!-- doctest: skip (REASON) -->``     illustration only: not run (counted, see test_docs)
  ``<!-- doctest: cuda -->``              runs only where CUDA is available (counted apart)
  ``<!-- doctest: bf16 -->``              runs only where ``--backward-precision bfloat16``
                                          can (a CPU with AMX or AVX512-BF16)
  ``<!-- doctest: numbers 0.01 -->``      numbers in the transcript must agree within 1 %
  ``<!-- doctest: lines -->``             generated text: only that the command printed
  ``<!-- doctest: lines translate -->``   the same for the commands with one of the words
  ``<!-- doctest: given\nPYTHON\n-->``    python run before a python block (names the page says
                                          you have, e.g. ``text``)
  ``<!-- doctest: process -->``           run in a fresh process (commands otherwise run in the
                                          test's process where they can: shell.py)
  ``<!-- doctest: continues -->``         python: run after the page's earlier python blocks
                                          (the same names are defined)
  ``<!-- doctest: setup\\nCOMMANDS\\n-->``  shell commands run before the block (what the page
                                          says the user already has, e.g. a corpus file)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

CODE = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "bash", "python": "python"}
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
_MARK = re.compile(r"<!--\s*doctest:\s*(.*?)\s*-->", re.S)
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?%?")


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    kind: str  # bash | python | transcript
    code: str  # the script (for a transcript: the commands, one per entry of `shown`)
    marks: list[str] = field(default_factory=list)
    setups: list[str] = field(default_factory=list)  # one entry per setup marker, in order
    given: str = ""  # python run before a python block (the names the page says you have)
    shown: list[tuple[str, list[str]]] = field(default_factory=list)  # (command, lines)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def mark(self, name: str) -> str | None:
        """The marker starting with ``name`` (its full text), or None."""
        return next((m for m in self.marks if m.split()[0] == name), None)

    @property
    def setup(self) -> str:
        return "".join(self.setups)

    def free(self, command: str) -> bool:
        """Whether ``command``'s shown output is generated text (``lines``, or ``lines WORD...``
        for the commands that have one of the words)."""
        m = self.mark("lines")
        words = m.split()[1:] if m else []
        return m is not None and (not words or any(w in command.split() for w in words))

    @property
    def tolerance(self) -> float | None:
        m = self.mark("numbers")
        return float(m.split()[1]) if m else None


def blocks(path: Path, name: str) -> list[Block]:
    """Every code block and transcript of the page, in order, with its markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending = ""  # text between the previous block and this one (markers live there)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            pending += lines[i] + "\n"
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).lower(), i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(
                lines[i][len(m.group(1)) :] if lines[i].startswith(m.group(1)) else lines[i]
            )
            i += 1
        i += 1
        marks, setups, given = [], [], ""
        for text in _MARK.findall(pending):
            if text.startswith("setup"):
                setups.append(text[len("setup") :].strip() + "\n")
            elif text.startswith("given"):
                given += text[len("given") :].strip() + "\n"
            else:
                marks.append(text.strip())
        pending = ""
        if info in CODE and body and body[0].startswith("$ "):
            info = ""  # a shell block written as a transcript
        if info in CODE:
            code = "\n".join(body) + "\n"
            found.append(Block(name, start + 1, CODE[info], code, marks, setups, given=given))
        elif info in ("", "text") and body and body[0].startswith("$ "):
            shown = _transcript(body)
            code = "".join(cmd + "\n" for cmd, _ in shown)
            found.append(Block(name, start + 1, "transcript", code, marks, setups, shown=shown))
    return found


def _transcript(body: list[str]) -> list[tuple[str, list[str]]]:
    shown: list[tuple[str, list[str]]] = []
    for line in body:
        if line.startswith("$ "):
            shown.append((line[2:], []))
        elif shown and shown[-1][1] == [] and shown[-1][0].endswith("\\"):
            shown[-1] = (shown[-1][0] + "\n" + line, [])  # a continued command
        else:
            shown[-1][1].append(line)
    return shown


# -- the shape check -----------------------------------------------------------------------


def _skeleton(line: str) -> tuple[list[str], list[float]]:
    """The line's words with every number replaced by ``#``, and the numbers."""
    numbers: list[float] = []

    def take(m: re.Match) -> str:
        text = m.group(0).replace(",", "").rstrip("%")
        try:
            numbers.append(float(text))
        except ValueError:
            return m.group(0)
        return "#"

    words = [_NUMBER.sub(take, w) for w in line.split()]
    return words, numbers


def _line_matches(shown: str, got: str, tol: float | None, free: bool) -> bool:
    sw, sn = _skeleton(shown)
    gw, gn = _skeleton(got)
    if free:
        return True
    if "..." in sw:  # `...` inside a line: any words there
        head = sw[: sw.index("...")]
        tail = sw[sw.index("...") + 1 :]
        return gw[: len(head)] == head and (not tail or gw[-len(tail) :] == tail)
    if sw != gw:
        return False
    if tol is None:
        return True
    return all(abs(a - b) <= tol * max(abs(a), abs(b)) + 1e-3 for a, b in zip(sn, gn))


def same_shape(shown: list[str], got: str, tol: float | None = None, free: bool = False) -> str:
    """Compare a shown output with what the command printed: the same lines with the same
    words, a number where a number is shown (within relative ``tol`` when given; any value
    otherwise), ``...`` on its own line standing for any lines. ``free``: generated text,
    only that there is output. Returns "" when they agree, else the first difference."""
    out = [ln.split("\r")[-1].rstrip() for ln in got.splitlines()]
    out = [ln for ln in out if ln.strip()]
    want = [ln.rstrip() for ln in shown if ln.strip()]
    # segments between `...` lines must appear in order, each as consecutive lines
    segments: list[list[str]] = [[]]
    for ln in want:
        if ln.strip() == "...":
            segments.append([])
        else:
            segments[-1].append(ln)
    if free:  # generated text: any lines, but something where the page shows something
        return "" if out or not want else "printed nothing; the page shows output"
    pos = 0
    for k, seg in enumerate(segments):
        if not seg:
            continue
        anchored = k == 0
        starts = [pos] if anchored else range(pos, len(out) - len(seg) + 1)
        for s in starts:
            chunk = out[s : s + len(seg)]
            if len(chunk) == len(seg) and all(
                _line_matches(a, b, tol, free) for a, b in zip(seg, chunk)
            ):
                pos = s + len(seg)
                break
        else:
            near = out[pos : pos + len(seg)]
            return "shown:\n  " + "\n  ".join(seg) + "\nprinted:\n  " + "\n  ".join(near)
    if segments[-1] and pos != len(out) and want and want[-1].strip() != "...":
        extra = "\n  ".join(out[pos : pos + 5])
        return f"printed more lines than shown:\n  {extra}"
    return ""
