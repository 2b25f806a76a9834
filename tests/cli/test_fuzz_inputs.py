"""Every text input of every command, fed what the one strict reader (``attnlm.base.textio``) must
refuse: bytes that are not UTF-8, a lone surrogate, a NUL, a 10 MB line and nothing at all
(issue 26). Each case must exit 2 with one stderr line naming the input (the option, the file
or ``stdin``), no traceback, and no output file left behind.

The table is read from the parser itself, so a new command is covered without editing this
file: an argument whose ``type`` is ``cli.common.text_value`` is a text given on the command
line, one whose type is ``cli.common.text_file(...)`` names a file whose contents are read,
and a command with ``reads_stdin=True`` reads standard input when given no text. A new
string option that is neither must be listed in ``NOT_TEXT`` (a name, a path, a setting), so
nothing slips through unclassified. What a command needs besides the input under test (a
checkpoint, a tokenizer) comes from ``RUNNABLE``; the files are built in ``conftest.py``.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from attnlm.cli import build_parser, main
from support import attnlm_process

HUGE = 10 * 1024 * 1024  # the issue's 10 MB line
VALUES = {
    "invalid-utf8": "caf\udce9 au lait",  # what Python makes of the shell's byte 0xe9
    "lone-surrogate": "a\ud800b",
    "nul": "the cat\x00 sat",
    "huge-line": "a" * HUGE,
    "empty": "",
}
BYTES = {
    "invalid-utf8": b"caf\xe9 au lait\n",
    "lone-surrogate": b"a\xed\xa0\x80b\n",  # a surrogate encoded as UTF-8 bytes: not UTF-8
    "nul": b"the cat\x00 sat\n",
    "huge-line": b"a" * HUGE + b"\n",
    "empty": b"",
}

# String options that are not text a command reads: names, paths to write, settings. Every
# other string option must be marked text_value / text_file (see test_every_string_is_classified).
NOT_TEXT = {
    "out", "vocab_out", "html", "resume", "checkpoint", "model", "device", "host", "pattern",
    "special", "set", "stop", "compile", "progress", "time_budget", "translate_budget",
    "compare_budget", "budget", "models", "ids", "text_field",
}  # fmt: skip

# What makes a command runnable up to the input under test: options with {placeholders} naming
# the files of conftest.py; (command, option) entries replace or drop (None) some of them.
RUNNABLE: dict[str, dict[str, str]] = {
    "tokenize train": {"--kind": "char", "--out": "{out}"},
    "tokenize encode": {"--tokenizer": "{tok}"},
    "tokenize decode": {"--tokenizer": "{tok}"},
    "tokenize show": {"--tokenizer": "{tok}"},
    "tokenize info": {"--tokenizer": "{tok}"},
    "train": {"--preset": "tiny-test", "--text": "{text}", "--max-iters": "1", "--out": "{outdir}"},
    "eval": {"--checkpoint": "{ckpt}"},
    "generate": {"--checkpoint": "{ckpt}", "--max-new-tokens": "1"},
    "chat": {"--model": "{ckpt}", "--max-new-tokens": "1"},
    "lens": {"--model": "{ckpt}"},
    "trace": {"--model": "{ckpt}", "--hook": "hook_embed"},
    "attribute": {"--model": "{ckpt}"},
    "ablate": {"--model": "{ckpt}", "--head": "0.0"},
    "patch": {"--model": "{ckpt}"},
    "translate": {"--checkpoint": "{mt}"},
    "demo": {"--preset": "tiny-test", "--text": "{text}", "--time-budget": "1s",
             "--translate-budget": "0", "--compare-budget": "0", "--out": "{outdir}"},
    "ngram train": {"--order": "2", "--arpa": "{out}"},
    "ngram score": {"--lm": "{model}"},
    "ngram sample": {"--lm": "{model}"},
    "params": {"--preset": "tiny-test"},
    "attention": {"--checkpoint": "{ckpt}"},
    "fill-mask": {"--checkpoint": "{ckpt}"},
    "embed": {"--checkpoint": "{ckpt}"},
    "contextual": {"--checkpoint": "{ckpt}"},
    "compare": {"--out": "{outdir}", "--time-budget": "1s"},
    "data prepare": {"--out": "{outdir}"},
    "serve": {"--checkpoint": "{ckpt}", "--port": "0"},
    "hmm fit": {"--text": "{text}", "--iters": "1", "--out": "{outdir}"},
    "hmm viterbi": {"--checkpoint": "{ckpt}"},
    "word2vec train": {"--out": "{out}", "--min-count": "1", "--epochs": "1"},
    "word2vec similar": {"--vectors": "{vectors}"},
    "word2vec analogy": {"--vectors": "{vectors}"},
    "word2vec evaluate": {"--vectors": "{vectors}", "--wordsim": "{wordsim}",
                          "--simlex": "{wordsim}", "--analogies": "{analogies}"},
}  # fmt: skip
OVERRIDES = {
    ("eval", "--pairs"): {"--checkpoint": "{mt}"},
    ("train", "--pairs"): {"--preset": "translate-transformer", "--text": None},
    ("train", "--valid-pairs"): {
        "--preset": "translate-transformer",
        "--text": None,
        "--pairs": "{pairs}",
    },
    ("train", "--test-pairs"): {
        "--preset": "translate-transformer",
        "--text": None,
        "--pairs": "{pairs}",
    },
    ("ngram score", "--arpa"): {"--lm": None},
    ("ngram sample", "--arpa"): {"--lm": None},
}
# Literal texts a command needs before the input under test (attention's TEXT before TARGET).
BEFORE: dict[tuple[str, str], list[str]] = {
    ("attention", "target"): ["the cat"],
    ("attention", "--target"): ["the cat"],
}
GOOD = {"text": "the cat", "input": "the cat", "word": "cat", "sentences": "the cat sat"}
GOOD["words"] = "cat"
# patch and attribute: two texts of one length in tokens, answers starting with other tokens
GOOD.update(clean="the cat", corrupt="the hat", answer=" s", wrong="d")


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*path, name))


def _kind(action: argparse.Action) -> str | None:
    return getattr(action.type, "text_input", None)


def _flag(action: argparse.Action) -> str:
    """How the input is named in RUNNABLE / OVERRIDES and test ids: ``--prompt`` or ``text``."""
    return action.option_strings[-1] if action.option_strings else action.dest


def _name(action: argparse.Action) -> str:
    """The name argparse gives the argument in its messages (``--prompt``, ``SENTENCE``)."""
    return argparse._get_action_name(action)


def _inputs():
    """(command, input, kind) for every text input of every command: kind is ``value``,
    ``file`` or ``stdin``."""
    for command, parser in _leaves(build_parser()):
        for action in parser._actions:
            if _kind(action):
                yield command, _flag(action), _kind(action)
        if parser.get_default("reads_stdin"):
            yield command, "stdin", "stdin"


INPUTS = list(_inputs())
CASES = [pytest.param(c, i, k, bad, id=f"{c} {i} {bad}") for c, i, k in INPUTS for bad in VALUES]


def test_the_table_reaches_every_kind_of_input():
    kinds = {(c, i): k for c, i, k in INPUTS}
    assert kinds[("generate", "--prompt")] == "value" and kinds[("translate", "text")] == "value"
    assert kinds[("train", "--text")] == "file" and kinds[("data pairs", "--pairs")] == "file"
    assert kinds[("translate", "stdin")] == "stdin"
    assert len({c for c, _, _ in INPUTS}) >= 15


def test_every_string_is_classified():
    """A string option of any command is a marked text input or listed in NOT_TEXT."""
    loose = []
    for command, parser in _leaves(build_parser()):
        for action in parser._actions:
            if action.type is None and action.nargs != 0 and not action.choices:
                if not isinstance(action, argparse._HelpAction | argparse._VersionAction):
                    if action.dest not in NOT_TEXT:
                        loose.append(f"{command} {_name(action)}")
    assert not loose, f"mark these text_value/text_file or list them in NOT_TEXT: {loose}"


def _argv(command, parser, name, kind, bad_path, files):
    options = {**RUNNABLE.get(command, {}), **OVERRIDES.get((command, name), {})}
    argv = command.split()
    for opt, value in options.items():
        if value is not None and opt != name:
            argv += [opt, value.format(**files)]
    positional = []
    for action in parser._actions:
        is_positional = not action.option_strings
        required = action.nargs not in ("?", "*") if is_positional else action.required
        count = action.nargs if isinstance(action.nargs, int) else 2 if action.nargs == "+" else 1
        if _flag(action) == name and kind != "stdin":
            value = [bad_path] if kind == "file" else ["\0BAD"]  # "\0BAD": the bad value
            value += [GOOD.get(action.dest, "cat")] * (count - 1 if is_positional else 0)
            (positional if is_positional else argv).extend(
                ([] if is_positional else [name]) + value
            )
        elif _kind(action) == "value" and required:
            good = GOOD[action.dest]
            (positional if is_positional else argv).extend(
                ([] if is_positional else [_flag(action)]) + [good] * count
            )
    return argv + BEFORE.get((command, name), []) + positional


@pytest.mark.parametrize(("command", "name", "kind", "bad"), CASES)
def test_bad_text_exits_2_with_one_line(
    command, name, kind, bad, files, tmp_path, capsys, monkeypatch
):
    parser = dict(_leaves(build_parser()))[command]
    bad_file = tmp_path / "bad.txt"
    bad_file.write_bytes(BYTES[bad])
    argv = [
        VALUES[bad] if a == "\0BAD" else a
        for a in _argv(command, parser, name, kind, str(bad_file), files)
    ]
    if kind == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(BYTES[bad])))
    monkeypatch.chdir(tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, f"exit {rc}: {err[:300]!r}"
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("attnlm: error: "), (
        err[:500]
    )
    action = next((a for a in parser._actions if _flag(a) == name), None)
    where = {
        "value": f"argument {action and _name(action)}",
        "file": str(bad_file),
        "stdin": "stdin",
    }[kind]
    assert where in err, f"the error does not name {where!r}: {err[:300]!r}"
    left = sorted(p.name for p in tmp_path.iterdir() if p != bad_file)
    assert not left, f"files left behind: {left}"
    for key in ("out", "outdir"):
        assert not Path(files[key]).exists(), f"{files[key]} was created"


def test_the_issue_case_in_a_real_process(files):
    """``printf 'caf\\xe9 au lait\\n' | attnlm translate --checkpoint RUN`` (issue 26)."""
    r = attnlm_process(
        "translate", "--checkpoint", files["mt"], input=b"caf\xe9 au lait\n", text=False
    )
    assert r.returncode == 2, r
    assert (
        r.stderr.decode() == "attnlm: error: stdin: not valid UTF-8 (bad byte 0xe9 at offset 3)\n"
    )


def test_any_argument_with_bytes_that_are_not_utf8_is_named(files):
    """Not only text inputs: a checkpoint path the shell passed as bytes that are not UTF-8 is
    refused as such, not as a missing folder (real process: the bytes go through exec)."""
    import os

    bad = os.fsdecode(b"run\xff")
    r = attnlm_process("generate", "--checkpoint", bad, "--prompt", "a")
    assert r.returncode == 2
    assert (
        r.stderr
        == "attnlm: error: argument --checkpoint: not valid UTF-8 (bad byte 0xff at offset 3)\n"
    )


ENDLESS_CHILD = """
import contextlib, io, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from attnlm.cli import main
answers = []
for argv, stdin in json.loads(sys.stdin.read()):
    if stdin:
        sys.stdin = io.TextIOWrapper(open(stdin, "rb"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            code = f"{type(e).__name__}: {e}"
    answers.append([code, err.getvalue()])
print(json.dumps(answers))
"""


def test_every_file_input_that_is_dev_zero_costs_one_block(files, tmp_path):
    """Every file input (the table above) given a symlink to ``/dev/zero``, and every command
    that reads standard input given ``< /dev/zero``: refused in one line (a NUL, or not a
    regular file) by a reader that stops at the first block. All cases
    run in one child process under 3 GB of address space, where a reader that reads the
    whole file fails for memory (``--chat-data`` and ``--preset`` did), which does not count
    as refused."""
    import json
    import os
    import subprocess
    import sys

    from support import SRC

    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    cases = [(c, i, k) for c, i, k in INPUTS if k in ("file", "stdin")]
    assert ("translate", "stdin", "stdin") in cases
    leaves = dict(_leaves(build_parser()))
    argvs = [
        [_argv(c, leaves[c], i, k, str(zero), files), str(zero) if k == "stdin" else None]
        for c, i, k in cases
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", ENDLESS_CHILD],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = {}
    for (command, name, kind), (code, err) in zip(cases, json.loads(proc.stdout), strict=True):
        lines = err.strip().splitlines()
        named = str(zero) in err or "/dev/zero" in err or (kind == "stdin" and "stdin:" in err)
        if code != 2 or len(lines) != 1 or "out of memory" in err or not named:
            bad[f"{command} {name}"] = (code, err[-300:])
    assert not bad, bad
