"""``attnlm demo``: the main job end to end (:func:`attnlm.apps.demo.run_demo`)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from attnlm.apps.demo import run_demo
from attnlm.base.validate import output_dir
from attnlm.cli.common import (
    add_command,
    add_overwrite_argument,
    add_preset_argument,
    add_text_argument,
    add_threads_argument,
    add_time_budget_argument,
    arg,
    option,
)

# the demo's folder and preset, the budget of each part, the text, the machine
OPTIONS = (
    option("--out", default="runs/demo", metavar="DIR", type=arg(output_dir),
           help="the demo's folder (default runs/demo)"),
    partial(add_preset_argument, default="shakespeare-char", note="default shakespeare-char"),
    partial(add_time_budget_argument, default="100s", what="the language model"),
    partial(add_time_budget_argument, default="40s", what="the translation model", zero_ok=True,
            name="--translate-budget"),
    partial(add_time_budget_argument, default="10s", what="each model of the compare table",
            zero_ok=True, name="--compare-budget"),
    option("--no-llm", dest="llm", action="store_false",
           help="skip the real-LLM coda (SmolLM2-135M-Instruct: one chat turn, the logit lens)"),
    add_text_argument,
    add_threads_argument,
    partial(add_overwrite_argument,
            what="replace the run in --out even if it is not a demo folder"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "demo", _demo, *OPTIONS)


def _demo(args: argparse.Namespace) -> int:
    """train, sample and plot on Shakespeare, then the other families and a real LLM (~5 min)"""
    run_demo(Path(args.out), args.preset, args.time_budget, args.text, args.threads,
             args.overwrite, translate_budget=args.translate_budget,
             compare_budget=args.compare_budget, llm=args.llm)  # fmt: skip
    return 0
