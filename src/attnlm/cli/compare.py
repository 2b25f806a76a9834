"""``attnlm compare``: several model families on one corpus (:mod:`attnlm.apps.compare`)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from attnlm.apps.compare import MODELS, CompareConfig, run_compare
from attnlm.apps.compare_report import format_table
from attnlm.base.errors import ConfigError
from attnlm.base.validate import name_or_path, output_dir, positive_int
from attnlm.cli.common import (
    add_bpe_vocab_size_argument,
    add_command,
    add_device_argument,
    add_progress_argument,
    add_set_argument,
    add_text_argument,
    add_threads_argument,
    add_time_budget_argument,
    arg,
    option,
)

# the text, the models and their budget, where the comparison is kept, the machine
OPTIONS = (
    partial(add_text_argument, default="Shakespeare"),
    option("--tokenizer", default="char", choices=("char", "bpe"),
           help="the tokenizer: char or bpe (default char)"),
    partial(add_time_budget_argument, default="90s", what="each model", aliases=("--budget",)),
    option("--models", default=",".join(MODELS), type=arg(name_or_path),
           help="comma-separated subset; init-from:SPEC adds a pretrained model (what --model "
           "takes) fine-tuned on the text with its own tokenizer for the same budget"),
    option("--init-from", action="append", default=[], metavar="SPEC", type=arg(name_or_path),
           help="start from a pretrained model: add the row init-from:SPEC, the model "
           "fine-tuned on the text (repeatable)"),
    option("--out", default="runs/compare", metavar="DIR", type=arg(output_dir),
           help="the comparison's folder (default runs/compare)"),
    option("--val-chars", type=arg(positive_int), default=100_000, help="characters scored"),
    add_bpe_vocab_size_argument,
    option("--eval-interval", type=arg(positive_int), default=100,
           help="steps between evaluations (default 100)"),
    add_device_argument,
    partial(add_threads_argument, default=1),  # per model
    partial(add_set_argument, example="of one model, e.g. lstm:model.n_layer=1",
            metavar="MODEL:KEY=VALUE"),
    add_progress_argument,
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "compare", _compare, *OPTIONS)


def _parse_sets(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, rest = item.partition(":")
        if not sep or name not in MODELS or MODELS[name] is None:
            neural = ", ".join(m for m, p in MODELS.items() if p)
            raise ConfigError(f"--set {item!r}: expected MODEL:KEY=VALUE with MODEL in {neural}")
        out.setdefault(name, []).append(rest)
    return out


def _compare(args: argparse.Namespace) -> int:
    """train n-gram, feed-forward, RNN, LSTM, GRU and GPT on one text and compare

    Every family on one text, tokenizer and split, with the same wall-clock budget each; scored in
    bits per character on the same validation text (docs/compare.md). A pretrained model
    (--init-from SPEC) is fine-tuned for the same budget with its own tokenizer and scored on the
    same characters. Finished models in --out are not trained again."""
    from attnlm.apps.compare import INIT_FROM
    from attnlm.apps.compare import init_spec as row_spec
    from attnlm.cli.finetune import init_spec as absolute_spec

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    names += [INIT_FROM + spec for spec in args.init_from]
    # a pretrained model given by a path is named by its absolute path (runs are resumable)
    models = tuple(INIT_FROM + absolute_spec(s) if (s := row_spec(m)) else m for m in names)
    cfg = CompareConfig(
        text=str(args.text) if args.text is not None else None,
        tokenizer=args.tokenizer,
        budget=args.time_budget,
        models=models,
        out=str(args.out),
        val_chars=args.val_chars,
        bpe_vocab_size=args.bpe_vocab_size,
        eval_interval=args.eval_interval,
        device=args.device,
        threads=args.threads,
        progress=args.progress,
        overrides=_parse_sets(args.set),
    )
    results = run_compare(cfg)
    print(format_table(results))
    print(f"wrote {Path(cfg.out) / 'compare.json'} and {Path(cfg.out) / 'compare.png'}")
    return 0
