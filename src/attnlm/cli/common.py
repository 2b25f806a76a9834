"""What every command shares: the options whose name and meaning are the same in every command
(``--text``, ``--pairs``, ``--model``, ``--device``, ``--threads``, ``--seed``, the sampling
options, ``--top-k``, ``-n/--num-samples``, ``--prompt``, ``--time-budget``), each defined once
here, and (re-exported from :mod:`attnlm.cli.arguments`) the argument layer they are built on:
:func:`arg`, :func:`add_option`, :func:`text_value`, :func:`text_file`,
:class:`OneLineArgumentParser`, and the option tables (:func:`add_options`, :func:`option`,
:func:`flag`, :func:`one_of`, :func:`section`, :func:`defaults`). Each ``add_..._argument``
here is a builder: it sits in a command's table as it is, or with its settings bound
(``partial(add_runtime_arguments, device="cpu")``).
"""

from __future__ import annotations

import argparse
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.validate import (
    DEVICE_FORMS,
    MAX_THREADS,
    WEIGHT_FORMATS,
    device,
    duration,
    existing_dir,
    existing_file,
    finite_float,
    int_in_range,
    name_or_path,
    non_empty,
    positive_int,
    seed,
    threads,
)
from attnlm.cli.arguments import (  # re-exported: commands import them from here
    OneLineArgumentParser,
    add_command,
    add_command_group,
    add_option,
    add_options,
    arg,
    as_given,
    check_arguments,
    defaults,
    flag,
    one_of,
    option,
    section,
    text_file,
    text_value,
)

CORPUS_FORMATS = (
    "a UTF-8 text file, .jsonl/.jsonl.gz/.jsonl.zst, .parquet, a folder of these, or a "
    "datasets.save_to_disk folder"
)


def add_text_argument(p: argparse.ArgumentParser, default: str = "the built-in corpus") -> None:
    """The shared ``--text PATH`` option: a corpus in any format :mod:`attnlm.data.sources`
    reads; ``default`` says what is read without it."""
    help = f"the text to read: {CORPUS_FORMATS} (default: {default})"
    p.add_argument("--text", metavar="PATH", default=None, type=text_file(), help=help)


def add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    """How a corpus is read and encoded (``attnlm train`` and ``attnlm data prepare``):
    ``--text-field``, ``--skip-bad``, ``--workers``, ``--tokenizer-sample``."""
    add_options(
        p,
        option("--text-field", default=None, type=arg(non_empty), metavar="NAME",
               help="the document field of .jsonl records / column of .parquet and Arrow (text)"),
        flag("--skip-bad", "skip bad records (not JSON, no field, not a string) and count them, "
             "instead of stopping at the first", default=None),
        option("--workers", type=arg(positive_int), default=None, metavar="N",
               help="parallel workers: processes encoding the corpus (default: the machine's "
               "cores for corpora over 32 MiB, else 1); the token files are the same for any N"),
        option("--tokenizer-sample", type=arg(positive_int), default=None, metavar="CHARS",
               help="characters of the training split a trained tokenizer learns on (64000000; "
               "whole chunks spread evenly over a larger split)"),
    )  # fmt: skip


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
        help=f"the text to read: a UTF-8 file, instead of the {name.upper()} argument",
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
        from attnlm.base.fileio import read_file_text

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
    said = "every core" if default is None else f"{default}; 0: torch's choice"
    check = arg(threads) if default is None else arg(int_in_range, lo=0, hi=MAX_THREADS)
    p.add_argument("--threads", type=check, default=default, metavar="N",
                   help=f"torch threads, 1..{MAX_THREADS} (default: {said})")  # fmt: skip


def add_weights_argument(p: argparse.ArgumentParser) -> None:
    """``--weights f32|bf16|q8|q4``: the decode-time weight format (:mod:`attnlm.quant.layers`),
    passed to :func:`attnlm.loading.sources.resolve`; unset: a GGUF file's own precision, else f32.
    """
    p.add_argument("--weights", choices=WEIGHT_FORMATS, default=None,
                   help="weights kept in this format while decoding, gpt and llama models "
                   "(default: a GGUF file's own precision class, else f32)")  # fmt: skip


def add_lookahead_argument(p: argparse.ArgumentParser) -> None:
    """``--lookahead N``: greedy decoding checks up to N drafts from the context per pass
    (:mod:`attnlm.generate.lookahead`)."""
    p.add_argument("--lookahead", type=arg(int_in_range, lo=0, hi=64), default=8, metavar="N",
                   help="greedy decoding of one prompt checks up to N draft tokens copied from "
                   "the context per forward pass (the same tokens, fewer passes when text "
                   "repeats); 0: one token per pass (default 8)")  # fmt: skip


def add_draft_argument(p: argparse.ArgumentParser) -> None:
    """``--draft q8|q4``: speculative decoding with a quantized copy of the model
    (:mod:`attnlm.generate.speculative`); :func:`draft_from_args` builds it."""
    p.add_argument("--draft", choices=["q8", "q4"], default=None,
                   help="greedy decoding of float32 weights checks drafts made by a q8 or q4 copy "
                   "of the model (speculative decoding; --lookahead N drafts per pass): the same "
                   "tokens, fewer float32 passes")  # fmt: skip


def draft_from_args(args: argparse.Namespace, model: Any, sampling: Any) -> Any:
    """The draft model ``--draft`` asks for (None without it), after checking that drafts
    apply: greedy, with the cache, uncompiled, lookahead above 0, float32 weights."""
    if args.draft is None:
        return None
    if not sampling.greedy:
        raise InputError("--draft checks drafts of greedy decoding: give --temperature 0")
    for off, given in ((args.lookahead == 0, "--lookahead 0"), (not args.use_cache, "--no-cache"),
                       (getattr(args, "compile", False), "--compile")):  # fmt: skip
        if off:
            raise InputError(f"--draft does not combine with {given}")
    from attnlm.runtime.engine import Engine

    if isinstance(model, Engine):
        raise InputError(
            "--draft speeds up float32 weights; this model decodes with the GGUF file's own "
            "8- or 4-bit weights (give --weights f32)"
        )
    from attnlm.generate.speculative import draft_model

    return draft_model(model, args.draft)


def add_seed_argument(
    p: argparse.ArgumentParser, default: int | None = None, help: str = ""
) -> None:
    """``--seed``: an integer 0 <= seed < 2**63; ``help`` says what it draws."""
    what = f": {help}" if help else ""
    p.add_argument("--seed", type=arg(seed), default=default, help=f"random seed, 0..2**63-1{what}")


def add_runtime_arguments(p: argparse.ArgumentParser, device: str | None = "auto") -> None:
    """``--device`` and ``--threads``, as every command that runs a model takes them."""
    add_device_argument(p, device)
    add_threads_argument(p)


def use_threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` before any model runs; without it, every core the process may use
    (:func:`attnlm.base.device.default_threads`)."""
    import torch

    from attnlm.base.device import default_threads

    torch.set_num_threads(getattr(args, "threads", None) or default_threads())


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

    said = max_new_tokens_help or str(max_new_tokens)
    lo = 0 if max_new_tokens is not None else 1
    add_options(
        p,
        option("--max-new-tokens", type=arg(int_in_range, lo=lo, hi=MAX_NEW_TOKENS_LIMIT),
               default=max_new_tokens, metavar="N",
               help=f"the most tokens to generate (default {said}; at most "
               f"{MAX_NEW_TOKENS_LIMIT:,})"),
        option("--temperature", type=arg(finite_float, lo=0.0), default=temperature,
               help=f"sampling temperature: 0 means greedy (default {temperature:g})"),
        option("--top-k", type=arg(positive_int), default=None, metavar="K",
               help="sample from the K most likely tokens only (default: all)"),
        option("--top-p", type=arg(finite_float, lo=0.0, hi=1.0, lo_open=True), default=None,
               metavar="P",
               help="sample from the most likely tokens whose probabilities sum to P (default: "
               "all)"),
    )  # fmt: skip
    add_seed_argument(p)


# ---------------------------------------------------------------- one name per meaning
# Each option below is spelt the same in every command that has it; the old spellings some
# commands had stay accepted as hidden aliases.


def add_top_k_argument(
    p: argparse.ArgumentParser, default: int, what: str, hi: int | None = None
) -> None:
    """``--top-k K``: how many of the best results a command lists (``what``: "predictions
    per mask"); formerly ``--top`` in ``word2vec similar``/``analogy`` and ``lens``."""
    add_option(p, "--top-k", aliases=("--top",), type=arg(int_in_range, lo=1, hi=hi),
               default=default, metavar="K",
               help=f"list the K best: {what} (default {default})")  # fmt: skip


def add_num_samples_argument(
    p: argparse.ArgumentParser, default: int, what: str = "", hi: int = 10_000
) -> None:
    """``-n N, --num-samples N``: how many independent samples to draw (``what``: "sentences");
    formerly ``-n`` alone in ``ngram sample``."""
    what = f"{what}, " if what else ""
    help = f"how many samples to draw ({what}each from the start; default {default})"
    p.add_argument("-n", "--num-samples", type=arg(int_in_range, lo=1, hi=hi), default=default,
                   metavar="N", help=help)  # fmt: skip


def add_prompt_argument(
    p: argparse.ArgumentParser, default: str | None, what: str, aliases: tuple[str, ...] = ()
) -> None:
    """``--prompt TEXT``: the text every sample continues (``what``: "a newline"); formerly
    ``--prefix`` in ``ngram sample``."""
    add_option(p, "--prompt", aliases=aliases, type=text_value, default=default, metavar="TEXT",
               help=f"the text each sample continues (default {what})")  # fmt: skip


def add_time_budget_argument(
    p: argparse.ArgumentParser,
    default: str | None,
    what: str = "",
    *,
    zero_ok: bool = False,
    aliases: tuple[str, ...] = (),
    name: str = "--time-budget",
) -> None:
    """``--time-budget T``: a wall-clock limit (``120s``, ``5m``, ``1h``; at most a year), the
    learning-rate schedule follows it; formerly ``--budget`` in ``compare``."""
    said = "none" if default is None else default
    what = f"{what}; " if what else ""
    skip = "; 0 skips it" if zero_ok else ""
    help = f"wall-clock limit of training, e.g. 120s, 5m, 1h ({what}default {said}{skip})"
    add_option(p, name, aliases=aliases, type=arg(duration, zero_ok=zero_ok), default=default,
               metavar="T", help=help)  # fmt: skip


def add_progress_argument(p: argparse.ArgumentParser, default: bool | None = True) -> None:
    """``--progress`` / ``--no-progress``: progress bars on stderr, both spellings in every
    command that draws bars (on by default; ``ngram train``'s are off unless asked for;
    None: as the preset says)."""
    where = {True: "on", False: "off", None: "as the preset says"}[default]
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=default,
                   help=f"progress bars on stderr ({where} by default)")  # fmt: skip


def add_stop_argument(p: argparse.ArgumentParser) -> None:
    """``--stop STR`` (repeatable): stop strings of :class:`SamplingConfig`."""
    p.add_argument("--stop", action="append", default=[], metavar="STR", type=arg(non_empty),
                   help="stop string (repeatable)")  # fmt: skip


def add_json_argument(p: argparse.ArgumentParser) -> None:
    """``--json``: the command's report as one JSON object instead of lines of text."""
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_preset_argument(
    p: argparse.ArgumentParser, default: str | None = None, note: str = ""
) -> None:
    """``--preset``: a built-in preset name or a TOML file (:func:`attnlm.base.config.load_preset`);
    ``note`` says what is used without it."""
    note = f" ({note})" if note else ""
    p.add_argument("--preset", default=default, type=text_file(as_given),
                   help=f"a built-in preset name or a TOML file{note}")  # fmt: skip


def add_set_argument(p: argparse.ArgumentParser, example: str, metavar: str = "KEY=VALUE") -> None:
    """``--set KEY=VALUE`` (repeatable): a preset value overridden (``example`` shows one)."""
    p.add_argument("--set", action="append", default=[], metavar=metavar, type=arg(non_empty),
                   help=f"override a preset value: {example} (repeatable)")  # fmt: skip


def add_bpe_vocab_size_argument(p: argparse.ArgumentParser) -> None:
    """``--bpe-vocab-size N``: the vocabulary of a bpe tokenizer trained on the corpus."""
    p.add_argument("--bpe-vocab-size", type=arg(positive_int), default=512,
                   help="vocabulary size of the trained bpe tokenizer (default 512)")  # fmt: skip


def add_overwrite_argument(p: argparse.ArgumentParser, what: str) -> None:
    """``--overwrite``: replace what the command would otherwise refuse to (``what``)."""
    p.add_argument("--overwrite", action="store_true", help=f"start over: {what}")


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


def add_model_spec_argument(
    p: argparse.ArgumentParser,
    *,
    checkpoint_synonym: bool = False,
    required: bool = True,
    repeatable: bool = False,
) -> None:
    """``--model SPEC``: any model :func:`attnlm.loading.sources.resolve` reads (an attnlm run or
    checkpoint folder, a Hugging Face folder, a ``.gguf`` file, a registered name, a Hub id
    ``org/name`` or ``org/name:QUANT``), stored as ``args.model``. With
    ``checkpoint_synonym``, ``--checkpoint`` is kept as another spelling (one of the two; an
    error names the one given): the handler
    resolves ``args.model or args.checkpoint``. ``repeatable``: ``--model`` may be given
    several times (``args.model`` is then a list; ``--checkpoint`` stays one)."""
    what = (
        "run or checkpoint folder, Hugging Face folder, .gguf file, registered name "
        "(attnlm models --available), Hub id org/name, or org/name:QUANT for a GGUF file of a "
        "Hub repository"
    )
    spec = arg(name_or_path)
    if not checkpoint_synonym:
        p.add_argument("--model", metavar="SPEC", required=required, type=spec, help=what)
        return
    g = p.add_mutually_exclusive_group(required=required)
    many = {"action": "append"} if repeatable else {}
    if repeatable:
        what += ": repeat it to compare models on a --task, or side by side on a --text"
    g.add_argument("--model", metavar="SPEC", type=spec, help=what, **many)
    g.add_argument("--checkpoint", metavar="SPEC", type=spec, help="the same as --model")


__all__ = [
    "OneLineArgumentParser",
    "add_command",
    "add_command_group",
    "add_option",
    "add_options",
    "arg",
    "as_given",
    "check_arguments",
    "defaults",
    "flag",
    "one_of",
    "option",
    "section",
    "text_file",
    "text_value",
]
