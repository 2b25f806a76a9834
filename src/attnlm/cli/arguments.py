"""The argument layer of the command line: one-line usage errors, validators as ``argparse``
types, old spellings as hidden aliases.

Every option of every command that takes a value parses it with a type made here, from
:func:`arg` (a validator of :mod:`attnlm.base.validate`: integers in ASCII digits only, finite
floats, sizes, durations, thread counts, devices, non-empty paths), :func:`text_value` or
:func:`text_file`, or it lists its ``choices``; ``tests/cli/test_argument_layer.py`` walks every
command and fails on an option that does not (the shared options built on these are in
:mod:`attnlm.cli.common`). Bad values are refused at parse time with exit
code 2 and one line (with :class:`OneLineArgumentParser`)::

    p.add_argument("--threads", type=arg(threads))
    p.add_argument("--temperature", type=arg(finite_float, lo=0, lo_open=True))

An option renamed for one vocabulary keeps its old spelling as a hidden alias
(:func:`add_option`): scripts keep working, ``--help`` shows the one name.

A command's options are a table: a sequence of *builders*, functions that add options to a
parser, applied in order by :func:`add_options` (or given to :func:`add_command`). An option
of one command is :func:`option` (``add_argument``'s arguments, as data) or :func:`flag`; a
shared one is its ``add_..._argument`` function of :mod:`attnlm.cli.common`, itself a builder;
:func:`one_of` and :func:`section` group options::

    add_command(sub, "info", _info, add_text_argument, flag("--json", "print one JSON object"))
"""

from __future__ import annotations

import argparse
import functools
import inspect
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from attnlm.base.errors import AttnlmError, InputError
from attnlm.base.textio import text_problem, value_problem
from attnlm.base.validate import existing_path, name_or_path

T = TypeVar("T")

#: a piece of a command's options: adds them to a parser (or a group of one) when called
Builder = Callable[[Any], Any]


def arg(check: Callable[..., T], **options: Any) -> Callable[[str], T]:
    """An ``argparse`` ``type=`` from a validator: ``type=arg(positive_int)``,
    ``type=arg(finite_float, lo=0, lo_open=True)``. Errors become ``ArgumentTypeError``, so
    argparse reports ``argument --name: must be ...`` and exits with code 2."""

    @functools.wraps(check)
    def convert(text: str) -> T:
        try:
            return check(text, None, **options)
        except AttnlmError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.checks = check.__name__  # type: ignore[attr-defined]  # the argument layer's mark
    return convert


def add_option(
    p: argparse.ArgumentParser | argparse._ActionsContainer,
    *names: str,
    aliases: tuple[str, ...] = (),
    **options: Any,
) -> argparse.Action:
    """``p.add_argument(*names, **options)``, and each old spelling in ``aliases`` accepted
    with the same meaning (the same ``dest`` and type) but left out of ``--help``, so that
    scripts written against an older name keep working. A required option and its aliases
    become a required group (any one spelling, not two)."""
    if not aliases:
        return p.add_argument(*names, **options)
    required = options.pop("required", False)
    where = p.add_mutually_exclusive_group(required=True) if required else p
    action = where.add_argument(*names, **options)
    copied = ("type", "action", "choices", "nargs", "const", "metavar")
    same = {k: v for k, v in options.items() if k in copied}
    for alias in aliases:
        where.add_argument(
            alias, dest=action.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **same
        )
    return action


def add_command(
    sub: argparse._SubParsersAction,
    name: str,
    func: Callable[..., int],
    *builders: Builder,
    **options: Any,
) -> argparse.ArgumentParser:
    """The subcommand ``name`` run by ``func``, with the options of ``builders`` (see
    :func:`add_options`): its ``--help`` line is the first paragraph of ``func``'s docstring and
    its description the rest, so a command's prose is written once, on the function that does
    it."""
    doc = inspect.cleandoc(func.__doc__ or "")
    first, _, rest = doc.partition("\n\n")
    p = sub.add_parser(
        name, help=" ".join(first.split()), description=" ".join(rest.split()) or None, **options
    )
    p.set_defaults(func=func)
    return add_options(p, *builders)


def add_options(p: Any, *builders: Builder) -> Any:
    """Apply a table of options to ``p`` (a parser or a group), in order: ``--help`` lists them
    so. Returns ``p``."""
    for build in builders:
        build(p)
    return p


def option(*names: str, **options: Any) -> Builder:
    """One option as data: the arguments of :func:`add_option` (``add_argument``'s, and
    ``aliases``), added when the table is applied."""
    return lambda p: add_option(p, *names, **options)


def flag(name: str, help: str, default: bool | None = False, **options: Any) -> Builder:
    """A switch that sets True; with ``default=None`` an absent switch leaves None (a preset or
    a later default decides), with ``default=True`` it is on already (the other spelling of a
    pair turns it off)."""
    if default is None:
        return option(name, action="store_const", const=True, default=None, help=help, **options)
    return option(name, action="store_true", default=default, help=help, **options)


def one_of(*builders: Builder, required: bool = False) -> Builder:
    """Options of which at most one may be given (exactly one when ``required``)."""
    return lambda p: add_options(p.add_mutually_exclusive_group(required=required), *builders)


def section(title: str, *builders: Builder) -> Builder:
    """Options listed under their own heading in ``--help``."""
    return lambda p: add_options(p.add_argument_group(title), *builders)


def defaults(**values: Any) -> Builder:
    """Values set on the command's namespace without an option (``reads_stdin=True``)."""
    return lambda p: p.set_defaults(**values)


def add_command_group(
    sub: argparse._SubParsersAction, name: str, help: str
) -> argparse._SubParsersAction:
    """``attnlm NAME ACTION ...``: a command made of actions; returns where they are added."""
    group = sub.add_parser(name, help=help)
    return group.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)


def text_value(value: str) -> str:
    """``type=text_value``: a text given on the command line (a prompt, a sentence, a word):
    refused at parse time, as ``argument --prompt: not valid UTF-8 (bad byte 0xff at offset
    3)``, when the shell passed bytes that are not UTF-8, or it holds a lone surrogate, a NUL,
    a line over :data:`attnlm.base.textio.MAX_LINE`, or nothing (see :mod:`attnlm.base.textio`)."""
    problem = text_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


text_value.text_input = "value"  # type: ignore[attr-defined]  # found by the fuzz test
text_value.checks = "text_value"  # type: ignore[attr-defined]


def text_file(check: Callable[..., T] = existing_path) -> Callable[[str], T]:
    """``type=text_file()``: a path whose *contents* are text the command reads (a corpus, a
    pairs file, a preset); the reader (:mod:`attnlm.base.textio`) checks them when it reads."""
    convert = arg(check)
    convert.checks = f"text_file({convert.checks})"  # type: ignore[attr-defined]
    convert.text_input = "file"  # type: ignore[attr-defined]  # found by the fuzz test
    return convert


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every string argument of the command that ran, checked by the one text reader: bytes
    the shell passed that are not UTF-8 (and lone surrogates, NULs, huge lines) are one line
    naming the option, ``argument --checkpoint: not valid UTF-8 (...)``, never a
    "not in the vocabulary" or a file-not-found further on."""
    for action in _actions(parser, args):
        problem = value_problem(getattr(args, action.dest, None))
        if problem:
            raise InputError(f"argument {argparse._get_action_name(action)}: {problem}")


#: the argument types that name what a command writes: a folder (True) or a file (False)
OUTPUT_TYPES = {"output_dir": True, "output_file": False, "output_file_or_stdout": False}


def outputs_of(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[Any], list[Any]]:
    """``(folders, files)``: what the command that ran writes, the values of its options whose
    type is one of :data:`OUTPUT_TYPES` (``-``, standard output, included: the lock skips
    it). ``main`` holds :func:`attnlm.base.fileio.output_lock` on each while the command runs."""
    found: tuple[list[Any], list[Any]] = ([], [])
    for action in _actions(parser, args):
        folder = OUTPUT_TYPES.get(getattr(action.type, "checks", None))
        value = getattr(args, action.dest, None)
        if folder is not None and value is not None:
            found[0 if folder else 1].append(value)
    return found


def _actions(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The actions of ``parser`` and of the subcommand parsers ``args`` went through."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                yield from _actions(chosen, args)
        else:
            yield action


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit code 2, in the
    same form as every other error:
    ``attnlm: error: tokenize train: argument --min-freq: must be an integer >= 1, got 0 (see
    attnlm tokenize train --help)`` (the usage text is left to ``--help``)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        program, _, command = self.prog.partition(" ")
        where = f"{command}: " if command else ""
        self.exit(2, f"{program}: error: {where}{line} (see {self.prog} --help)\n")


def as_given(value: str, name: str | None = None) -> str:
    """A path (or name) left as given (the reader says what is wrong with it, e.g. "no such
    file"); only an empty one, which would mean the current folder, is refused here."""
    return name_or_path(value, name)
