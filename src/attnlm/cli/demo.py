"""``attnlm demo``: the main job end to end (:func:`attnlm.demo.run_demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlm.cli.common import (
    add_command,
    add_text_argument,
    add_threads_argument,
    add_time_budget_argument,
    arg,
    as_given,
    text_file,
)
from attnlm.demo import run_demo
from attnlm.validate import output_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "demo", _demo)
    p.add_argument(
        "--out", default="runs/demo", metavar="DIR", type=arg(output_dir),
        help="the demo's folder (default runs/demo)",
    )  # fmt: skip
    p.add_argument(
        "--preset", default="shakespeare-char", type=text_file(as_given),
        help="a built-in preset name or a TOML file (default shakespeare-char)",
    )  # fmt: skip
    add_time_budget_argument(p, "100s", "the language model")
    add_time_budget_argument(
        p, "40s", "the translation model", zero_ok=True, name="--translate-budget"
    )
    add_time_budget_argument(
        p, "10s", "each model of the compare table", zero_ok=True,
        name="--compare-budget",
    )  # fmt: skip
    p.add_argument(
        "--no-llm",
        dest="llm",
        action="store_false",
        help="skip the real-LLM coda (SmolLM2-135M-Instruct: one chat turn, the logit lens)",
    )
    add_text_argument(p, default="the built-in corpus")
    add_threads_argument(p)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over: replace the run in --out even if it is not a demo folder",
    )


def _demo(args: argparse.Namespace) -> int:
    """train, sample and plot on Shakespeare, then the other families and a real LLM (~5 min)"""
    run_demo(
        Path(args.out),
        args.preset,
        args.time_budget,
        args.text,
        args.threads,
        args.overwrite,
        translate_budget=args.translate_budget,
        compare_budget=args.compare_budget,
        llm=args.llm,
    )
    return 0
