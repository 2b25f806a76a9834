"""``attnlm demo``: the main job end to end (:func:`attnlm.demo.run_demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlm.cli.common import (
    add_command,
    add_text_argument,
    add_threads_argument,
    as_given,
    text_file,
)
from attnlm.demo import run_demo


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "demo", _demo)
    p.add_argument("--out", default="runs/demo", metavar="DIR")
    p.add_argument("--preset", default="shakespeare-char", type=text_file(as_given))
    p.add_argument("--time-budget", default="100s", help="training wall-clock budget")
    p.add_argument(
        "--translate-budget",
        default="40s",
        help="training budget of the translation model (0 skips that part)",
    )
    p.add_argument(
        "--compare-budget",
        default="10s",
        help="training budget per model of the compare table (0 skips that part)",
    )
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
        help="replace the run in --out even if it is not a demo folder",
    )


def _demo(args: argparse.Namespace) -> int:
    """train, sample and plot on Shakespeare, then the other families and a real LLM (~5 min)"""
    from attnlm.fileio import output_lock

    with output_lock(args.out):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
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
