"""The argument layer (cli/arguments.py): every option of every command that takes a value parses
it with a type of the shared layer (``arg(validator)``, ``text_value``, ``text_file``) or lists
its choices, so a new command cannot forget to check a number or a path; and every numeric and
path option refuses the same bad values (``1_6``, `` 3``, other scripts' digits, NaN,
infinities, negatives, huge numbers, empty paths) at parse time, exit 2, one line naming it."""

from __future__ import annotations

import argparse
import os

import pytest

from attnlm.base.validate import MAX_THREADS, positive_int
from attnlm.cli import build_parser, main
from attnlm.cli.arguments import OneLineArgumentParser, arg, text_value

# The validators that read a number, and those that read a path (or a name that may be one).
NUMERIC = {
    "int_in_range", "positive_int", "non_negative_int", "finite_float", "positive_float",
    "probability", "seed", "threads", "duration", "memory_size",
}  # fmt: skip
PATHS = {
    "existing_file", "existing_dir", "existing_path", "output_file", "output_dir",
    "output_file_or_stdout", "name_or_path", "as_given", "_text_path",
}  # fmt: skip
# How an option that reads a path or a number shows itself without its type.
PATH_METAVARS = {"PATH", "DIR", "FILE", "F", "M", "MODEL", "OUT", "SPEC", "FILE.png", "FILE.html",
                 "FILE.json"}  # fmt: skip
NUMBER_METAVARS = {"N", "K", "P", "T", "SIZE", "CHARS"}
PATH_DESTS = {"out", "html", "resume", "checkpoint", "model", "lm", "arpa", "vectors", "preset",
              "tokenizer", "data_dir", "pairs", "valid_pairs", "test_pairs", "messages",
              "template", "vocab_out", "tiktoken_out", "text_file", "target_file"}  # fmt: skip
# Options whose meaning allows a negative value.
NEGATIVE_OK = {("translate", "--length-penalty")}

BAD_NUMBERS = ["1_6", " 3", "3 ", "\u0663", "nan", "inf", "-inf", "-1", "1e400", "9" * 400, ""]
HUGE_INT = "9" * 30  # beyond int64: no count, size or seed holds it
FLOATS = {"finite_float", "positive_float", "probability"}


def commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()):
    """Every leaf command: (its words, its parser)."""
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(prefix), parser
        return
    for name, child in subs[0].choices.items():
        yield from commands(child, (*prefix, name))


def takes_value(action: argparse.Action) -> bool:
    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return action.nargs != 0 and not isinstance(action, skip)


def checks(action: argparse.Action) -> str | None:
    return getattr(action.type, "checks", None)


def problems(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """What is wrong with a command's options, by the argument layer's rule."""
    found = []
    for a in parser._actions:
        if not takes_value(a):
            continue
        name = argparse._get_action_name(a)
        kind = checks(a)
        if a.choices:  # argparse checks the value against them
            continue
        if kind is None:
            found.append(f"{command} {name}: no type from the argument layer")
            continue
        numeric_default = isinstance(a.default, int | float) and not isinstance(a.default, bool)
        if (numeric_default or a.metavar in NUMBER_METAVARS) and kind not in NUMERIC:
            found.append(f"{command} {name}: looks numeric, checked as {kind}")
        looks_path = a.metavar in PATH_METAVARS or a.dest in PATH_DESTS
        if looks_path and kind not in PATHS and not (kind or "").startswith("text_file("):
            found.append(f"{command} {name}: looks like a path, checked as {kind}")
    return found


def test_every_option_goes_through_the_argument_layer():
    found = [p for command, parser in commands() for p in problems(parser, command)]
    assert not found, "\n".join(found)


def test_the_walk_finds_an_option_that_bypasses_the_layer():
    """The rule above can fail: plain ``type=int``, a str with a numeric default, and a path
    option without a checked type are each reported."""
    p = OneLineArgumentParser(prog="x")
    p.add_argument("--count", type=int)
    p.add_argument("--rate", default=0.5)
    p.add_argument("--out", metavar="DIR")
    p.add_argument("--size", type=arg(positive_int), default=3)  # fine
    p.add_argument("--word", type=text_value)  # fine
    found = problems(p, "x")
    assert [f.split(":")[0] for f in found] == ["x --count", "x --rate", "x --out"], found


def numeric_options():
    for command, parser in commands():
        for a in parser._actions:
            if takes_value(a) and checks(a) in NUMERIC and a.option_strings:
                yield pytest.param(command, a, id=f"{command} {a.dest}")


@pytest.mark.parametrize(("command", "action"), list(numeric_options()))
def test_every_number_refuses_the_same_bad_values(command, action, capsys):
    parser = dict(commands())[command]
    option = action.option_strings[-1]
    bads = BAD_NUMBERS + ([] if checks(action) in FLOATS else [HUGE_INT])
    for bad in bads:
        if bad == "-1" and (command, option) in NEGATIVE_OK:
            continue
        with pytest.raises(SystemExit) as e:
            parser.parse_args([f"{option}={bad}"])
        err = capsys.readouterr().err
        assert e.value.code == 2, (command, option, bad)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"argument {argparse._get_action_name(action)}: " in err, (command, bad, err)


def path_options():
    for command, parser in commands():
        for a in parser._actions:
            kind = checks(a) or ""
            if takes_value(a) and a.option_strings and (kind in PATHS or "text_file(" in kind):
                yield pytest.param(command, a.option_strings[-1], id=f"{command} {a.dest}")


@pytest.mark.parametrize(("command", "option"), list(path_options()))
def test_every_path_refuses_an_empty_one(command, option, capsys):
    """``--out ""`` would mean the current folder: refused everywhere (``compare --out ""`` and
    ``data task --out ""`` wrote there)."""
    parser = dict(commands())[command]
    for empty in ("", " "):
        with pytest.raises(SystemExit) as e:
            parser.parse_args([f"{option}={empty}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, (command, option, err)
        assert f"argument {option}" in err, err


def output_options():
    from attnlm.cli.arguments import OUTPUT_TYPES

    for command, parser in commands():
        for a in parser._actions:
            if checks(a) in OUTPUT_TYPES:
                yield pytest.param(command, a.option_strings[-1], id=f"{command} {a.dest}")


@pytest.mark.parametrize(("command", "option"), list(output_options()))
def test_every_output_refuses_a_device_or_a_pipe(command, option, tmp_path, capsys):
    """An output that exists and is no regular file (``--html /dev/full`` replaced the device
    by the page, as root, through the atomic rename) is refused at parse time; here a FIFO
    stands in for the device, and stays one."""
    parser = dict(commands())[command]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as e:
        parser.parse_args([f"{option}={fifo}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, (command, option, err)
    assert f"argument {option}" in err and str(fifo) in err, err
    assert fifo.is_fifo()


def test_the_layer_reaches_the_cases_the_probe_found(capsys):
    """The invocations of the probe round: each is one line and exit 2 from main()."""
    cases = [
        ["translate", "--checkpoint", "x", "--length-penalty", "nan", "a"],
        ["ngram", "train", "--order", "3", "--arpa", "x.arpa", "--memory", "9" * 20 + "G"],
        ["translate", "--checkpoint", "x", "--threads", "100000", "a"],
        ["serve", "--checkpoint", "x", "--threads", "100000"],
        ["serve", "--checkpoint", "x", "--threads", "-1"],
        ["serve", "--checkpoint", "x", "--device", "bogus"],
        ["serve", "--checkpoint", "x", "--device", "cuda:99"],
        ["compare", "--out", ""],
        ["data", "task", "--out", ""],
        ["compare", "--time-budget", "9" * 400],
        ["train", "--time-budget", "1_0s"],
        ["generate", "--checkpoint", "x", "--num-samples", "\u0663"],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("attnlm: error: "), (argv, err)
        assert "Traceback" not in err


def test_threads_are_bounded_by_the_machine_and_1024():
    assert 1 <= MAX_THREADS <= 1024
    assert MAX_THREADS <= 4 * (os.cpu_count() or 128)
