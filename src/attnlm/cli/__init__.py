"""The ``attnlm`` command line: parses arguments and calls library functions.

The top floor of the package: the only place ``argparse`` appears. One module per command
group (``attnlm.cli.train`` for ``train`` and ``eval``, ...), each with ``register(subparsers)``
that adds its subcommands and sets ``func`` on them; this file only assembles them, and
:mod:`attnlm.cli.common` holds what they share. Handlers import heavy
libraries (torch) lazily so ``attnlm --help`` stays fast. No work happens on import.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from attnlm import __version__
from attnlm.base.errors import AttnlmError
from attnlm.base.fileio import output_locks
from attnlm.cli.arguments import outputs_of
from attnlm.cli.common import OneLineArgumentParser, check_arguments

# Modules with a ``register(subparsers)`` function, in the order their commands are listed.
COMMAND_MODULES = [
    "attnlm.cli.data",
    "attnlm.cli.tokenize",
    "attnlm.cli.train",
    "attnlm.cli.generate",
    "attnlm.cli.chat",
    "attnlm.cli.demo",
    "attnlm.cli.ngram",
    "attnlm.cli.word2vec",
    "attnlm.cli.hmm",
    "attnlm.cli.models",
    "attnlm.cli.inspect",
    "attnlm.cli.lens",
    "attnlm.cli.interp",
    "attnlm.cli.encoders",
    "attnlm.cli.serve",
    "attnlm.cli.compare",
    "attnlm.cli.export",
]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(  # subcommand parsers inherit the one-line errors
        prog="attnlm",
        description="Build, train, evaluate and open up attention-based language models.",
    )
    parser.add_argument("--version", action="version", version=f"attnlm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def out_of_memory(e: BaseException) -> str | None:
    """One line for an allocation that failed (sizes beyond this machine: ``--batch-size
    1000000000``), or None when ``e`` is something else. The sizes themselves are checked where
    they can be (a model's parameters before it is built, see :mod:`attnlm.base.foreign`); this is
    the net under what cannot be estimated beforehand."""
    text = " ".join(str(e).split())
    if isinstance(e, MemoryError):
        return "out of memory" + (f" ({text[:200]})" if text else "") + "; ask for less"
    found = re.search(r"tried to allocate ([\d.]+ ?\w*)", text)
    if type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in text:
        size = f" (tried to allocate {found.group(1)})" if found else ""
        return (
            f"out of memory{size}: lower the sizes asked for (batch size, model size, tokens, rank)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (one line on stderr) returns 2; --help exits 0
        if not e.code:
            raise
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    args.whole_process = argv is None  # the command is the process (train's time budget)
    try:
        check_arguments(parser, args)
        # one writer per output: every run folder and file the command writes is locked
        # while it runs (a command that locks by itself, as train under torchrun, opts out)
        folders, files = (
            outputs_of(parser, args) if getattr(args, "lock_outputs", True) else ([], [])
        )
        with output_locks(tuple(folders), tuple(files)):
            result = args.func(args)
    except AttnlmError as e:
        print("attnlm: error: " + " ".join(str(e).split()), file=sys.stderr)  # one line
        return 2
    except KeyboardInterrupt:
        print("attnlm: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as e:  # torch's OutOfMemoryError is a RuntimeError
        problem = out_of_memory(e)
        if problem is None:
            raise
        print(f"attnlm: error: {problem}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (e.g. `attnlm models --json | head`)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
