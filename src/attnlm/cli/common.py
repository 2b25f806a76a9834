"""What every command shares: one-line usage errors, validators as ``argparse`` types, and the
options whose name and meaning are the same in every command (``--text``, ``--pairs``,
``--model``, ``--device``, ``--threads``, ``--seed``, the sampling options, ``--top-k``,
``--num-samples``, ``--prompt``, ``--time-budget``).

The argument layer: every option that takes a value parses it with a type made here, from
:func:`arg` (a validator of :mod:`attnlm.validate`: integers in ASCII digits only, finite
floats, sizes, durations, thread counts, devices, non-empty paths), :func:`text_value` or
:func:`text_file`, or it lists its ``choices``; ``tests/cli/test_argument_layer.py`` walks every
command and fails on an option that does not. Bad values are refused at parse time with exit
code 2 and one line (with :class:`OneLineArgumentParser`)::

    p.add_argument("--threads", type=arg(threads))
    p.add_argument("--temperature", type=arg(finite_float, lo=0, lo_open=True))

An option renamed for one vocabulary keeps its old spelling as a hidden alias
(:func:`add_option`): scripts keep working, ``--help`` shows the one name.
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
    device,
    duration,
    existing_dir,
    existing_file,
    existing_path,
    finite_float,
    int_in_range,
    name_or_path,
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
    required = options.pop("required", False)
    where = p.add_mutually_exclusive_group(required=True) if required and aliases else p
    action = where.add_argument(*names, required=required and not aliases, **options)
    copied = ("type", "action", "choices", "nargs", "const", "metavar")
    same = {k: v for k, v in options.items() if k in copied}
    for alias in aliases:
        where.add_argument(
            alias, dest=action.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **same
        )
    return action


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
text_value.checks = "text_value"  # type: ignore[attr-defined]


def text_file(check: Callable[..., T] = existing_path) -> Callable[[str], T]:
    """``type=text_file()``: a path whose *contents* are text the command reads (a corpus, a
    pairs file, a preset); the reader (:mod:`attnlm.textio`) checks them when it reads."""
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


def _text_path(value: str, name: str | None = None) -> Any:
    """A readable file for ``--text PATH`` where the text can also be given literally: a value
    that is no file is refused with the hint, never read as the literal text itself."""
    try:
        return existing_file(value, name)
    except InputError as e:
        raise InputError(f"{e}; --text names a file: give a literal text as an argument, "
                         "without --text (quote it)") from None  # fmt: skip


def add_literal_text_arguments(
    p: argparse.ArgumentParser,
    name: str = "text",
    *,
    flag: str = "--text",
    what: str = "the text",
) -> None:
    """A text given literally as the positional ``name`` (``attnlm lens --model M "To be, or
    not to be"``) or read from the file ``flag PATH`` (dest ``NAME_file``), as every command
    spells them: ``--text`` is a file everywhere. Read it with :func:`literal_or_file`."""
    p.add_argument(name, nargs="?", default=None, type=text_value, metavar=name.upper(), help=what)
    p.add_argument(
        flag,
        dest=f"{name}_file",
        default=None,
        metavar="PATH",
        type=text_file(_text_path),
        help=f"a UTF-8 file to read instead of the {name.upper()} argument",
    )


def literal_or_file(
    args: argparse.Namespace, name: str = "text", flag: str = "--text", required: bool = True
) -> str | None:
    """The text of :func:`add_literal_text_arguments`: the positional value, or the file's
    contents (trailing newlines dropped); one of the two (or neither, unless ``required``)."""
    literal, path = getattr(args, name), getattr(args, f"{name}_file")
    if literal is not None and path is not None:
        raise InputError(f"give {name.upper()} or {flag} PATH, not both")
    if path is not None:
        from attnlm.fileio import read_file_text

        return read_file_text(path, f"{flag} file", InputError).rstrip("\n")
    if literal is None and required:
        raise InputError(f"give the {name} as {name.upper()} (quoted) or {flag} PATH")
    return literal


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
    p.add_argument(
        "--top-k",
        type=arg(positive_int),
        default=None,
        metavar="K",
        help="sample from the K most likely tokens only (default: all)",
    )
    p.add_argument(
        "--top-p",
        type=arg(finite_float, lo=0.0, hi=1.0, lo_open=True),
        default=None,
        metavar="P",
        help="sample from the most likely tokens whose probabilities sum to P (default: all)",
    )
    add_seed_argument(p)


# ---------------------------------------------------------------- one name per meaning
# Each option below is spelt the same in every command that has it; the old spellings some
# commands had stay accepted as hidden aliases.


def add_top_k_argument(
    p: argparse.ArgumentParser, default: int, what: str, hi: int | None = None
) -> None:
    """``--top-k K``: how many of the best results a command lists (``what``: "predictions
    per mask"); formerly ``--top`` in ``word2vec similar``/``analogy`` and ``lens``."""
    add_option(
        p,
        "--top-k",
        aliases=("--top",),
        type=arg(int_in_range, lo=1, hi=hi),
        default=default,
        metavar="K",
        help=f"list the K best: {what} (default {default})",
    )


def add_num_samples_argument(
    p: argparse.ArgumentParser, default: int, what: str = "samples", hi: int = 10_000
) -> None:
    """``-n N, --num-samples N``: how many independent samples to draw (``what``: "sentences");
    formerly ``-n`` alone in ``ngram sample``."""
    p.add_argument(
        "-n",
        "--num-samples",
        type=arg(int_in_range, lo=1, hi=hi),
        default=default,
        metavar="N",
        help=f"how many {what} to draw, each from the start (default {default})",
    )


def add_prompt_argument(
    p: argparse.ArgumentParser, default: str | None, what: str, aliases: tuple[str, ...] = ()
) -> None:
    """``--prompt TEXT``: the text every sample continues (``what``: "a newline"); formerly
    ``--prefix`` in ``ngram sample``."""
    add_option(
        p,
        "--prompt",
        aliases=aliases,
        type=text_value,
        default=default,
        metavar="TEXT",
        help=f"the text each sample continues (default {what})",
    )


def add_time_budget_argument(
    p: argparse.ArgumentParser,
    default: str | None,
    what: str = "training",
    *,
    zero_ok: bool = False,
    aliases: tuple[str, ...] = (),
    name: str = "--time-budget",
) -> None:
    """``--time-budget T``: a wall-clock limit (``120s``, ``5m``, ``1h``; at most a year), the
    learning-rate schedule follows it; formerly ``--budget`` in ``compare``."""
    said = "none" if default is None else default
    skip = "; 0 skips it" if zero_ok else ""
    add_option(
        p,
        name,
        aliases=aliases,
        type=arg(duration, zero_ok=zero_ok),
        default=default,
        metavar="T",
        help=f"wall-clock limit of {what}, e.g. 120s, 5m, 1h (default {said}{skip})",
    )


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
    """A path (or name) left as given (the reader says what is wrong with it, e.g. "no such
    file"); only an empty one, which would mean the current folder, is refused here."""
    return name_or_path(value, name)


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
    spec = arg(name_or_path)
    if not checkpoint_synonym:
        p.add_argument("--model", metavar="SPEC", required=required, type=spec, help=what)
        return
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--model", metavar="SPEC", type=spec, help=what)
    g.add_argument("--checkpoint", metavar="SPEC", type=spec, help="the same as --model")
