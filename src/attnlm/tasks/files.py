"""Task files: what ``attnlm eval --task FILE`` reads, checked line by line.

A task is a JSON Lines file (one example per line) or a folder holding ``test.jsonl`` and, for
few-shot prompts, an optional ``train.jsonl``. Three kinds of example:

=================  ==========================================  ==================================
kind               keys of one line                            scored by
=================  ==========================================  ==================================
multiple_choice    ``context``, ``choices`` (list), ``gold``    log-likelihood of each choice
cloze              ``context``, ``target``                      log-likelihood of the target,
                                                               and whether greedy decoding
                                                               reproduces it
generation         ``prompt``, ``answer``                       greedy decoding to a stop string,
                                                               exact match after normalisation
=================  ==========================================  ==================================

A task may start with a header line ``{"task": {...}}`` (in a folder: a ``task.json`` file
holding the same object) with any of: ``kind`` (otherwise inferred from the first example's keys
and stated), ``name``, ``description`` (text put before the examples), ``target_delimiter``
(between a context and its answer; default a space, as lm-evaluation-harness), ``fewshot_delimiter``
(between examples; default a blank line), ``until`` (generation's stop strings; default the
few-shot delimiter), ``max_gen_toks`` (default 256), ``ignore_case`` and ``ignore_punctuation``
(generation's normalisation; both false by default). Every problem is one line naming the file
and line number.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.foreign import parse_json

KINDS = ("multiple_choice", "cloze", "generation")
#: the keys that make each kind (the first example's keys decide the kind when none is named)
KEYS = {
    "multiple_choice": ("context", "choices", "gold"),
    "cloze": ("context", "target"),
    "generation": ("prompt", "answer"),
}
HEADER_KEYS = {"kind": str, "name": str, "description": str, "target_delimiter": str,
               "fewshot_delimiter": str, "until": list, "max_gen_toks": int,
               "ignore_case": bool, "ignore_punctuation": bool}  # fmt: skip
#: refuse an example with more choices than this (a file of one example with a million choices
#: would otherwise be scored)
MAX_CHOICES = 1000


@dataclass(frozen=True)
class Example:
    """One example, whatever its kind: the text the model is given (``context``; a
    generation's ``prompt``), the answers it is scored on (``choices``: a multiple choice's
    options, a cloze's one target, a generation's one answer) and ``gold``, the index of the
    right one (0 unless multiple choice)."""

    context: str
    choices: tuple[str, ...]
    gold: int = 0
    line: int = field(default=0, compare=False)  # where it was read (1-based), for messages

    @property
    def answer(self) -> str:
        """The right answer's text (what a few-shot example shows after its context)."""
        return self.choices[self.gold]


@dataclass(frozen=True)
class Task:
    """A task read from a file or built in: its kind, settings and examples."""

    name: str
    kind: str
    test: tuple[Example, ...]
    train: tuple[Example, ...] = ()
    description: str = ""
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    until: tuple[str, ...] = ()
    max_gen_toks: int = 256
    ignore_case: bool = False
    ignore_punctuation: bool = False
    kind_inferred: bool = False
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def stops(self) -> tuple[str, ...]:
        """Generation's stop strings: ``until``, else the few-shot delimiter (which is what
        follows an answer in the prompt)."""
        return self.until or (self.fewshot_delimiter,)

    def limited(self, n: int | None) -> Task:
        """The first ``n`` test examples only (all with None)."""
        return self if n is None else replace(self, test=self.test[:n])


def read_task(path: str | os.PathLike[str]) -> Task:
    """The task in a JSON Lines file or a folder (``test.jsonl``, optional ``train.jsonl`` and
    ``task.json``); :class:`InputError` naming the file and line of the first problem."""
    p = Path(path).expanduser()
    if p.is_dir():
        test_file = p / "test.jsonl"
        if not test_file.is_file():
            raise InputError(f"{p}: a task folder holds test.jsonl (and optionally train.jsonl)")
        header = _folder_header(p / "task.json")
        header, test = _read_lines(test_file, header)
        train: list[Example] = []
        if (p / "train.jsonl").is_file():
            _, train = _read_lines(p / "train.jsonl", header)
        return _task(header, test, train, p)
    if not p.is_file():
        raise InputError(f"{p}: no such task file or folder")
    header, test = _read_lines(p, {})
    return _task(header, test, [], p)


def _folder_header(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    from attnlm.base.fileio import read_file_text

    doc = parse_json(read_file_text(path), f"{path}")
    if isinstance(doc, dict) and isinstance(doc.get("task"), dict):
        doc = doc["task"]
    return _check_header(doc, f"{path}")


def _check_header(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: the task header must be a JSON object")
    for key, value in doc.items():
        want = HEADER_KEYS.get(key)
        if want is None:
            raise InputError(f"{where}: unknown task header key {key!r} "
                             f"(known: {', '.join(HEADER_KEYS)})")  # fmt: skip
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise InputError(f"{where}: task header {key!r} must be a {want.__name__}")
    if "kind" in doc and doc["kind"] not in KINDS:
        raise InputError(f"{where}: kind {doc['kind']!r} is not one of {', '.join(KINDS)}")
    if "until" in doc and not all(isinstance(s, str) and s for s in doc["until"]):
        raise InputError(f"{where}: task header 'until' must be a list of non-empty strings")
    if "max_gen_toks" in doc and not 1 <= doc["max_gen_toks"] <= 4096:
        raise InputError(f"{where}: task header 'max_gen_toks' must be in 1..4096")
    return dict(doc)


def _read_lines(path: Path, header: dict[str, Any]) -> tuple[dict[str, Any], list[Example]]:
    """The header (the one given, or this file's first line) and the examples of ``path``."""
    from attnlm.base.fileio import read_file_text

    text = read_file_text(path, empty_ok=True)  # names the line of a non-UTF-8 byte
    examples: list[Example] = []
    kind = header.get("kind")
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        doc = parse_json(raw, where)  # bad JSON, deep nesting, lone surrogates: one line
        if isinstance(doc, dict) and set(doc) == {"task"}:
            if examples or number != _first_line(text):
                raise InputError(f"{where}: a task header belongs on the first line")
            header = {**header, **_check_header(doc["task"], where)}
            kind = header.get("kind")
            continue
        if kind is None:
            kind = infer_kind(doc, where)
            header = {**header, "kind": kind, "_inferred": True}
        examples.append(parse_example(doc, kind, where, number))
    if not examples:
        raise InputError(f"{path}: no examples (one JSON object per line)")
    return header, examples


def _first_line(text: str) -> int:
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            return number
    return 1


def infer_kind(doc: Any, where: str) -> str:
    """The kind whose keys ``doc`` has (:data:`KEYS`); an error names the keys expected."""
    if isinstance(doc, dict):
        for kind, keys in KEYS.items():
            if all(k in doc for k in keys):
                return kind
    expected = "; ".join(f"{k}: {', '.join(v)}" for k, v in KEYS.items())
    raise InputError(f"{where}: an example needs the keys of one kind ({expected})")


def parse_example(doc: Any, kind: str, where: str, line: int = 0) -> Example:
    """One line's object as an :class:`Example` of ``kind``; :class:`InputError` at ``where``
    for a missing key, a wrong type, an empty choice, a gold index out of range."""
    if not isinstance(doc, dict):
        raise InputError(f"{where}: an example is a JSON object")
    missing = [k for k in KEYS[kind] if k not in doc]
    if missing:
        raise InputError(f"{where}: missing key {missing[0]!r} (a {kind} example has "
                         f"{', '.join(KEYS[kind])})")  # fmt: skip
    if kind == "generation":
        return Example(_text(doc, "prompt", where), (_text(doc, "answer", where),), 0, line)
    context = _text(doc, "context", where, empty_ok=True)
    if kind == "cloze":
        return Example(context, (_text(doc, "target", where),), 0, line)
    choices = doc["choices"]
    if not isinstance(choices, list) or not choices:
        raise InputError(f"{where}: 'choices' must be a non-empty list of strings")
    if len(choices) > MAX_CHOICES:
        raise InputError(f"{where}: {len(choices):,} choices (at most {MAX_CHOICES:,})")
    for i, c in enumerate(choices):
        if not isinstance(c, str) or not c:
            raise InputError(f"{where}: choice {i} is {'empty' if c == '' else 'not a string'}")
    gold = doc["gold"]
    if isinstance(gold, bool) or not isinstance(gold, int):
        raise InputError(f"{where}: 'gold' must be an integer index into 'choices'")
    if not 0 <= gold < len(choices):
        raise InputError(f"{where}: gold {gold} is out of range (0..{len(choices) - 1} "
                         f"for {len(choices)} choices)")  # fmt: skip
    return Example(context, tuple(choices), gold, line)


def _text(doc: dict[str, Any], key: str, where: str, empty_ok: bool = False) -> str:
    value = doc[key]
    if not isinstance(value, str):
        raise InputError(f"{where}: {key!r} must be a string")
    if not value and not empty_ok:
        raise InputError(f"{where}: {key!r} is empty")
    return value


def _task(header: dict[str, Any], test: list[Example], train: list[Example], path: Path) -> Task:
    settings = {k: v for k, v in header.items() if k in HEADER_KEYS and k != "kind"}
    if "until" in settings:
        settings["until"] = tuple(settings["until"])
    settings.setdefault("name", path.stem if path.is_file() else path.name)
    return Task(kind=header["kind"], test=tuple(test), train=tuple(train), source=str(path),
                kind_inferred=bool(header.get("_inferred")), **settings)  # fmt: skip


def write_task(task: Task, folder: str | os.PathLike[str]) -> Path:
    """Write ``task`` as a folder (``task.json``, ``test.jsonl``, ``train.jsonl``) that
    :func:`read_task` reads back to the same task; returns the folder."""
    from attnlm.base.fileio import atomic_write_text

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    header = {"kind": task.kind, "name": task.name, "target_delimiter": task.target_delimiter,
              "fewshot_delimiter": task.fewshot_delimiter}  # fmt: skip
    if task.description:
        header["description"] = task.description
    if task.until:
        header["until"] = list(task.until)
    atomic_write_text(out / "task.json", json.dumps({"task": header}, ensure_ascii=False) + "\n")
    for name, rows in (("test.jsonl", task.test), ("train.jsonl", task.train)):
        if rows:
            lines = [json.dumps(example_doc(task.kind, e), ensure_ascii=False) for e in rows]
            atomic_write_text(out / name, "\n".join(lines) + "\n")
    return out


def example_doc(kind: str, e: Example) -> dict[str, Any]:
    """An example as the JSON object of its kind (the inverse of :func:`parse_example`)."""
    if kind == "multiple_choice":
        return {"context": e.context, "choices": list(e.choices), "gold": e.gold}
    if kind == "cloze":
        return {"context": e.context, "target": e.choices[0]}
    return {"prompt": e.context, "answer": e.choices[0]}
