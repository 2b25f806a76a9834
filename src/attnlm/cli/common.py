"""What every command shares: one-line usage errors, validators as ``argparse`` types, and the
``--text`` / ``--pairs`` options.

:func:`arg` turns a validator of :mod:`attnlm.validate` into an ``argparse`` ``type=``, so bad
values are refused at parse time with exit code 2 and one line (with
:class:`OneLineArgumentParser`)::

    p.add_argument("--threads", type=arg(threads))
    p.add_argument("--temperature", type=arg(finite_float, lo=0, lo_open=True))
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from attnlm.errors import AttnlmError
from attnlm.validate import existing_path

T = TypeVar("T")


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

    return convert


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


def add_text_argument(p: argparse.ArgumentParser) -> None:
    """The shared ``--text PATH`` option: a file or a folder of .txt files."""
    p.add_argument(
        "--text",
        metavar="PATH",
        default=None,
        type=arg(existing_path),
        help="a UTF-8 text file or a folder of .txt files (default: the built-in corpus)",
    )


def add_pairs_argument(p: argparse.ArgumentParser) -> None:
    """The shared ``--pairs PATH`` option of translation commands (``attnlm.data.pairs``);
    ``None`` means the built-in task (resolve it with ``attnlm.data.tasks.load_pairs``)."""
    p.add_argument(
        "--pairs",
        metavar="PATH",
        default=None,
        help="a UTF-8 tab-separated file source<TAB>target[<TAB>...] (default: the built-in "
        "English-to-German dates and numbers task)",
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--checkpoint DIR | --model NAME`` (one of them), resolved by
    :func:`attnlm.checkpoint.load_model_ref`."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", metavar="DIR", help="attnlm run/checkpoint or HF model folder")
    g.add_argument(
        "--model", metavar="NAME", help="pretrained name (minilm) or Hugging Face model folder"
    )
