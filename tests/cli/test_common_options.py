"""The shared options of cli/common.py: every command that takes --device, --threads, --seed or
a sampling option parses it with the same validator, so a bad value is the same one-line
error (exit 2) whichever command it was given to; and a command's --help line is its
handler's docstring."""

from __future__ import annotations

import argparse

import pytest

from attnlm.base.validate import MAX_THREADS
from attnlm.cli import build_parser
from attnlm.cli.common import add_command

# (option, bad value, the words of the error)
BAD = [
    ("--device", "bogus", "must be one of auto, cpu, cuda, cuda:N or mps, got 'bogus'"),
    ("--device", "cuda:99", "cuda:99"),
    ("--threads", str(MAX_THREADS + 1), f", {MAX_THREADS}], got {MAX_THREADS + 1}"),
    ("--threads", "-1", f", {MAX_THREADS}], got -1"),
    ("--threads", "1_6", "got '1_6'"),
    ("--threads", " 3", "got ' 3'"),
    ("--threads", "\u0663", "must be an integer"),
    ("--seed", "-1", "must be an integer in [0, 9223372036854775807]"),
    ("--top-k", "0", "must be an integer"),
    ("--top-p", "nan", "must be a finite number > 0 and <= 1"),
    ("--temperature", "inf", "must be a finite number"),  # ngram sample: > 0
    ("--max-new-tokens", "-1", "must be an integer in ["),
]


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every leaf command: (argv prefix, its parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*prefix, name))


def _takes(parser: argparse.ArgumentParser, option: str) -> bool:
    return any(option in a.option_strings for a in parser._actions)


def test_the_shared_options_are_everywhere_and_say_the_same(capsys):
    seen: dict[str, int] = {}
    for argv, parser in _commands(build_parser()):
        for option, value, words in BAD:
            if not _takes(parser, option):
                continue
            seen[option] = seen.get(option, 0) + 1
            with pytest.raises(SystemExit) as e:
                parser.parse_args([f"{option}={value}"])
            err = capsys.readouterr().err
            assert e.value.code == 2, (argv, option)
            assert err.count("\n") == 1 and f"argument {option}: " in err, (argv, err)
            assert words in err, (argv, option, err)
    # the options are shared, not one command's
    assert seen["--device"] >= 8 * 2 and seen["--threads"] >= 6 * 5 and seen["--seed"] >= 6
    assert seen["--top-k"] >= 2 and seen["--max-new-tokens"] >= 2


def test_device_and_threads_parse_the_same_everywhere():
    for argv, parser in _commands(build_parser()):
        for option, good, want in (("--device", "CPU", "cpu"), ("--threads", "2", 2)):
            if _takes(parser, option):
                action = next(a for a in parser._actions if option in a.option_strings)
                assert action.type(good) == want, (argv, option)


def test_add_command_takes_its_prose_from_the_handler():
    def run(args):
        """count the words of a text

        Prints the number of whitespace-separated words
        of the text, one line."""
        return 0

    sub = argparse.ArgumentParser(prog="x").add_subparsers(dest="command")
    p = add_command(sub, "count", run)
    assert p.description == "Prints the number of whitespace-separated words of the text, one line."
    assert p.parse_args([]).func is run
    assert sub._choices_actions[0].help == "count the words of a text"
