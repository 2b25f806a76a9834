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
import inspect
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from attnlm.errors import AttnlmError, InputError
from attnlm.textio import text_problem, value_problem
from attnlm.validate import (
    DEVICE_FORMS,
    MAX_THREADS,
    WEIGHT_FORMATS,
    device,
    existing_dir,
    existing_path,
    finite_float,
    int_in_range,
    positive_int,
    seed,
    threads,
)

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


def add_command(
    sub: argparse._SubParsersAction, name: str, func: Callable[..., int], **options: Any
) -> argparse.ArgumentParser:
    """The subcommand ``name`` run by ``func``: its ``--help`` line is the first paragraph of
    ``func``'s docstring and its description the rest, so a command's prose is written once,
    on the function that does it."""
    doc = inspect.cleandoc(func.__doc__ or "")
    first, _, rest = doc.partition("\n\n")
    p = sub.add_parser(
        name, help=" ".join(first.split()), description=" ".join(rest.split()) or None, **options
    )
    p.set_defaults(func=func)
    return p


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
    a line over :data:`attnlm.textio.MAX_LINE`, or nothing (see :mod:`attnlm.textio`)."""
    problem = text_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


text_value.text_input = "value"  # type: ignore[attr-defined]  # found by the fuzz test


def text_file(check: Callable[..., T] = existing_path) -> Callable[[str], T]:
    """``type=text_file()``: a path whose *contents* are text the command reads (a corpus, a
    pairs file, a preset); the reader (:mod:`attnlm.textio`) checks them when it reads."""
    convert = arg(check)
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


CORPUS_FORMATS = (
    "a UTF-8 text file, .jsonl/.jsonl.gz/.jsonl.zst, .parquet, a folder of these, or a "
    "datasets.save_to_disk folder"
)


def add_text_argument(p: argparse.ArgumentParser, default: str = "the built-in corpus") -> None:
    """The shared ``--text PATH`` option: a corpus in any format :mod:`attnlm.data.sources`
    reads; ``default`` says what is read without it."""
    help = f"{CORPUS_FORMATS} (default: {default})"
    p.add_argument("--text", metavar="PATH", default=None, type=text_file(), help=help)


def add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    """How a corpus is read and encoded (``attnlm train`` and ``attnlm data prepare``):
    ``--text-field``, ``--skip-bad``, ``--workers``, ``--tokenizer-sample``."""
    p.add_argument(
        "--text-field",
        default=None,
        metavar="NAME",
        help="the document field of .jsonl records / column of .parquet and Arrow (text)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_const",
        const=True,
        default=None,
        help="skip bad records (not JSON, no field, not a string) and count them, instead of "
        "stopping at the first",
    )
    p.add_argument(
        "--workers",
        type=arg(positive_int),
        default=None,
        metavar="N",
        help="processes encoding the corpus (default: the machine's cores for corpora over 32 "
        "MiB, else 1); the token files are the same for any N",
    )
    p.add_argument(
        "--tokenizer-sample",
        type=arg(positive_int),
        default=None,
        metavar="CHARS",
        help="characters of the training split a trained tokenizer learns on (64000000; "
        "whole chunks spread evenly over a larger split)",
    )


def add_data_dir_argument(p: argparse.ArgumentParser) -> None:
    """``--data-dir DIR``: token files prepared before (``attnlm data prepare``, nanoGPT)."""
    help = (
        "train on prepared token files: a folder from attnlm data prepare, or nanoGPT's "
        "train.bin/val.bin (uint16 GPT-2 ids, with --tokenizer gpt2)"
    )
    p.add_argument("--data-dir", metavar="DIR", default=None, type=arg(existing_dir), help=help)


def add_pairs_argument(p: argparse.ArgumentParser) -> None:
    """The shared ``--pairs PATH`` option of translation commands (``attnlm.data.pairs``);
    ``None`` means the built-in task (resolve it with ``attnlm.data.tasks.load_pairs``)."""
    help = (
        "a UTF-8 tab-separated file source<TAB>target[<TAB>...] (default: the built-in "
        "English-to-German dates and numbers task)"
    )
    p.add_argument("--pairs", metavar="PATH", default=None, type=text_file(as_given), help=help)


# ---------------------------------------------------------------- options every kind of run shares


def add_device_argument(p: argparse.ArgumentParser, default: str | None = "auto") -> None:
    """``--device``: checked at parse time (``bogus``, ``cuda:99`` are one-line errors)."""
    said = default or "the preset's"
    p.add_argument(
        "--device", default=default, type=arg(device), help=f"{DEVICE_FORMS} (default {said})"
    )


def add_threads_argument(p: argparse.ArgumentParser, default: int | None = None) -> None:
    """``--threads N``: torch's intra-op threads, 1 to 4 per core; set by :func:`use_threads`.
    With a ``default``, 0 means torch's own choice."""
    said = "torch's choice" if default is None else f"{default}; 0: torch's choice"
    p.add_argument(
        "--threads",
        type=arg(threads) if default is None else arg(int_in_range, lo=0, hi=MAX_THREADS),
        default=default,
        metavar="N",
        help=f"torch threads, 1..{MAX_THREADS} (default: {said})",
    )


def add_weights_argument(p: argparse.ArgumentParser) -> None:
    """``--weights f32|bf16|q8|q4``: the decode-time weight format (:mod:`attnlm.nn.quant`),
    passed to :func:`attnlm.sources.resolve`; unset: a GGUF file's own precision, else f32."""
    p.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default=None,
        help="weights kept in this format while decoding, gpt and llama models "
        "(default: a GGUF file's own precision class, else f32)",
    )


def add_seed_argument(
    p: argparse.ArgumentParser, default: int | None = None, help: str = "random seed"
) -> None:
    """``--seed``: an integer 0 <= seed < 2**63."""
    p.add_argument("--seed", type=arg(seed), default=default, help=f"{help}, 0..2**63-1")


def add_runtime_arguments(p: argparse.ArgumentParser, device: str | None = "auto") -> None:
    """``--device`` and ``--threads``, as every command that runs a model takes them."""
    add_device_argument(p, device)
    add_threads_argument(p)


def use_threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` (if given) before any model runs."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def add_sampling_arguments(
    p: argparse.ArgumentParser,
    *,
    temperature: float = 1.0,
    max_new_tokens: int | None = 200,
    max_new_tokens_help: str = "",
) -> None:
    """The sampling options of :class:`attnlm.generate.sampling.SamplingConfig`:
    ``--max-new-tokens --temperature --top-k --top-p --seed``."""
    from attnlm.generate.sampling import MAX_NEW_TOKENS_LIMIT

    default = "" if max_new_tokens is None else f"default {max_new_tokens}; "
    p.add_argument(
        "--max-new-tokens",
        type=arg(int_in_range, lo=0 if max_new_tokens is not None else 1, hi=MAX_NEW_TOKENS_LIMIT),
        default=max_new_tokens,
        metavar="N",
        help=max_new_tokens_help or f"{default}at most {MAX_NEW_TOKENS_LIMIT:,}",
    )
    p.add_argument(
        "--temperature",
        type=arg(finite_float, lo=0.0),
        default=temperature,
        help=f"0 means greedy (default {temperature:g})",
    )
    p.add_argument("--top-k", type=arg(positive_int), default=None, metavar="K")
    p.add_argument(
        "--top-p", type=arg(finite_float, lo=0.0, hi=1.0, lo_open=True), default=None, metavar="P"
    )
    add_seed_argument(p)


def add_stop_argument(p: argparse.ArgumentParser) -> None:
    """``--stop STR`` (repeatable): stop strings of :class:`SamplingConfig`."""
    p.add_argument(
        "--stop", action="append", default=[], metavar="STR", help="stop string (repeatable)"
    )


def sampling_config(args: argparse.Namespace) -> Any:
    """The :class:`attnlm.generate.sampling.SamplingConfig` of the shared sampling options
    (:func:`add_sampling_arguments`, and ``--stop`` where the command has it)."""
    from attnlm.generate.sampling import SamplingConfig

    return SamplingConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(getattr(args, "stop", ())),
        seed=args.seed,
    )


def as_given(value: str, name: str | None = None) -> str:
    """A path left as given (the reader says what is wrong with it, e.g. "no such file")."""
    return value


def add_model_spec_argument(
    p: argparse.ArgumentParser, *, checkpoint_synonym: bool = False, required: bool = True
) -> None:
    """``--model SPEC``: any model :func:`attnlm.sources.resolve` reads (an attnlm run or
    checkpoint folder, a Hugging Face folder, a ``.gguf`` file, a registered name, a Hub id
    ``org/name``), stored as ``args.model``. With ``checkpoint_synonym``, ``--checkpoint`` is
    kept as another spelling (one of the two; an error names the one given): the handler
    resolves ``args.model or args.checkpoint``."""
    what = (
        "run or checkpoint folder, Hugging Face folder, .gguf file, registered name "
        "(attnlm models --available) or Hub id org/name"
    )
    if not checkpoint_synonym:
        p.add_argument("--model", metavar="SPEC", required=required, help=what)
        return
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--model", metavar="SPEC", help=what)
    g.add_argument("--checkpoint", metavar="SPEC", help="the same as --model")
