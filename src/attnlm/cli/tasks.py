"""``attnlm eval --task``: a model (or several) scored on a task file or a built-in task, at one
or more numbers of few-shot examples, with lm-evaluation-harness's metrics; ``--out`` draws the
few-shot curve. Registered as options of ``attnlm eval`` (:mod:`attnlm.cli.train`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.validate import non_empty, non_negative_int, output_file, seed
from attnlm.cli.common import add_progress_argument, arg, as_given, flag, option

TASK_DEFAULTS = {"num_fewshot": None, "fewshot_delimiter": None, "seed": None, "chat": False,
                 "out": None}  # fmt: skip


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``eval --task``."""
    for build in (
        option(
            "--task",
            default=None,
            metavar="FILE|NAME",
            type=arg(as_given),
            help="score the model on a task: a JSON Lines file, a folder (test.jsonl, "
            "train.jsonl), or a built-in task (tatoeba-mc, shakespeare-cloze); "
            "docs/evaluation.md",
        ),
        option(
            "--num-fewshot",
            nargs="+",
            type=arg(non_negative_int),
            default=None,
            metavar="K",
            help="examples in the prompt (several: a few-shot curve; default 0)",
        ),
        option(
            "--fewshot-delimiter",
            default=None,
            metavar="STR",
            type=arg(non_empty),
            help="text between few-shot examples (default: the task's, a blank line); "
            r"\n and \t are read as newline and tab",
        ),
        option(
            "--seed",
            type=arg(seed),
            default=None,
            help="random seed, 0..2**63-1: the few-shot draws (default 1234, "
            "lm-evaluation-harness's)",
        ),
        flag("--chat", "wrap each prompt in the model's chat template (one user message)"),
        option(
            "--out",
            default=None,
            metavar="PNG",
            type=arg(output_file),
            help="--task: draw the metric against the number of shots, a line per model",
        ),
    ):
        build(p)
    add_progress_argument(p, default=True)


def refuse_task_options(args: argparse.Namespace) -> None:
    """An option of ``--task`` given without it: one line naming it."""
    for name, default in TASK_DEFAULTS.items():
        if getattr(args, name) != default:
            raise InputError(f"--{name.replace('_', '-')} applies to eval --task")


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t")


def _task(args: argparse.Namespace) -> Any:
    from attnlm.tasks.builtin import load_task
    from attnlm.tasks.prompts import check_shots

    for name, given in (("--text", args.text), ("--pairs", args.pairs), ("--split", args.split),
                        ("--max-tokens", args.max_tokens)):  # fmt: skip
        if given is not None:
            raise InputError(f"{name} does not apply to --task (a task brings its examples)")
    if args.beam != 1:
        raise InputError("--beam does not apply to --task")
    task = load_task(args.task)
    if args.fewshot_delimiter is not None:
        task = replace(task, fewshot_delimiter=_unescape(args.fewshot_delimiter))
    task = task.limited(args.limit)
    for k in args.num_fewshot or [0]:
        check_shots(task, k)
    return task


def eval_task(args: argparse.Namespace) -> int:
    """``attnlm eval --task``: see the module docstring."""
    from attnlm.base.device import resolve_device
    from attnlm.loading.sources import resolve
    from attnlm.ngram.progress import progress_bar
    from attnlm.tasks.prompts import DEFAULT_SEED
    from attnlm.tasks.run import chat_wrapper, evaluate_task

    task = _task(args)
    shots = args.num_fewshot or [0]
    specs = args.model if args.model is not None else [args.checkpoint]
    if not args.json:
        print(_task_line(task))
    results = []
    for spec in specs:
        # float32 unless --weights says otherwise: scoring runs many tokens per pass, where
        # float32 products are the fastest on a CPU (a GGUF file's blocks dequantize exactly)
        model, tok, info = resolve(spec, resolve_device(args.device), args.weights or "f32")
        chat = chat_wrapper(info) if args.chat else None
        for k in shots:
            with progress_bar(len(task.test), f"{spec} {k}-shot", args.progress,
                              unit="example") as bar:  # fmt: skip
                result = evaluate_task(
                    model, tok, task, k, seed=DEFAULT_SEED if args.seed is None else args.seed,
                    chat=chat, batch_size=args.batch_size, on_done=bar.update,
                    stop_ids=info.stop_ids,
                )  # fmt: skip
            results.append({"model": spec, **result})
            if not args.json:
                print(_result_line(spec, result))
        del model
    if args.out is not None:
        path = _plot(task, results, args.out)
        if not args.json:
            print(f"few-shot curve: {path}")
    if args.json:
        print(json.dumps({"task": task.name, "kind": task.kind, "source": task.source,
                          "examples": len(task.test), "results": results}))  # fmt: skip
    return 0


def _task_line(task: Any) -> str:
    inferred = "; kind inferred from the keys" if task.kind_inferred else ""
    return (f"task: {task.name} ({task.kind}, {len(task.test):,} examples, "
            f"{len(task.train):,} for few-shot{inferred})")  # fmt: skip


def _result_line(spec: str, result: dict[str, Any]) -> str:
    m = result["metrics"]
    shown = []
    for name, value in m.items():
        if name.endswith("_stderr") or value is None:
            continue
        err = m.get(f"{name}_stderr")
        shown.append(f"{name} {value:.4f}" + (f" ± {err:.4f}" if err is not None else ""))
    rate = result["examples_per_second"]
    speed = f"  ({rate:.1f} examples/s)" if rate else ""
    return f"{spec}  {result['num_fewshot']}-shot  " + "  ".join(shown) + speed


def headline(kind: str) -> str:
    """The metric a task's curve shows."""
    return "exact_match" if kind == "generation" else "acc"


def _plot(task: Any, results: list[dict[str, Any]], out: Any) -> Any:
    from attnlm.inspect.heatmap import plot_fewshot_curve

    metric = headline(task.kind)
    curves: dict[str, list[tuple[int, float, float | None]]] = {}
    for r in results:
        point = (r["num_fewshot"], r["metrics"][metric], r["metrics"].get(f"{metric}_stderr"))
        curves.setdefault(r["model"], []).append(point)
    chance = None
    if task.kind == "multiple_choice":
        chance = sum(1 / len(e.choices) for e in task.test) / len(task.test)
    title = f"{task.name}: {metric} against shots ({len(task.test):,} examples)"
    return plot_fewshot_curve(curves, out, metric=metric, title=title, chance=chance)
