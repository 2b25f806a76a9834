"""``attnlm eval --model A --model B ... --text FILE``: several models scored on one text, side
by side in one table (a fine-tune against its base: ``--model BASE --model RUN``). Each row is
what ``attnlm eval --model SPEC --text FILE`` gives for that model alone (the same
evaluation, each model with its own tokenizer, so bits per character compare across
tokenizers); the last column is each model's change in bits per character from the first."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from attnlm.base.errors import InputError


def eval_side_by_side(
    args: argparse.Namespace, is_run: Callable[[str], bool], capped: int | None
) -> int:
    """Evaluate every ``args.model`` on ``args.text`` and print the table (or, with
    ``--json``, one object: ``{"text", "results": [{"model", ...one model's --json...}]}``).
    ``is_run``: whether a SPEC is an attnlm run folder; ``capped``: ``--max-tokens`` as the
    doc tests cap it."""
    from attnlm.loading.evaluation import evaluate_checkpoint

    if args.text is None:
        raise InputError("several --model are compared on one text: give --text FILE (or a "
                         "--task)")  # fmt: skip
    if args.pairs is not None:
        raise InputError("several --model are compared on --text or a --task, not --pairs")
    if args.split == "test":
        raise InputError("--split test applies to translation checkpoints; a text has all, val")
    rows: list[tuple[str, Any, str]] = []
    for spec in args.model:
        run = is_run(spec)
        result, what = evaluate_checkpoint(
            spec if run else None, args.text, args.split, args.batch_size, capped,
            args.device, model=None if run else spec, weights=args.weights,
        )  # fmt: skip
        rows.append((spec, result, what))
    if args.json:
        results = [{"model": s, **r.to_dict(), "data": w} for s, r, w in rows]
        print(json.dumps({"text": str(args.text), "results": results}))
        return 0
    for line in table(rows):
        print(line)
    return 0


def table(rows: list[tuple[str, Any, str]]) -> list[str]:
    """The side-by-side lines: the data (each model's when they differ: another tokenizer, a
    BOS), then one row per model."""
    whats = [what for _, _, what in rows]
    if len(set(whats)) == 1:
        out = [f"evaluated: {whats[0]}"]
    else:
        out = [f"evaluated ({i}): {what}" for i, what in enumerate(whats, start=1)]
    width = max(12, *(len(spec) for spec, _, _ in rows)) + 6
    out.append(f"{'model':<{width}} {'loss':>8} {'perplexity':>11} {'bits/char':>10} "
               f"{'bits/token':>11} {'tokens':>10} {'vs (1)':>8}")  # fmt: skip
    first = rows[0][1].bpc
    for i, (spec, r, _) in enumerate(rows, start=1):
        bpc = "-" if r.bpc is None else f"{r.bpc:.4f}"
        change = "" if i == 1 or r.bpc is None or not first else (
            f"{100.0 * (r.bpc - first) / first:+.2f}%")  # fmt: skip
        name = f"({i}) {spec}"
        out.append(f"{name:<{width}} {r.loss:>8.4f} {r.ppl:>11.3f} {bpc:>10} "
                   f"{r.bits_per_token:>11.4f} {r.tokens:>10,} {change:>8}")  # fmt: skip
    return out
