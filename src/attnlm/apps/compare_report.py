"""What ``attnlm compare`` writes and prints once every family is scored: ``compare.json``,
the learning-curve plot ``compare.png`` and the fixed-width table (:mod:`attnlm.apps.compare` runs
the families)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlm.base.fileio import atomic_write_text

# the settings and the per-family results are attnlm.apps.compare's CompareConfig and ModelResult
# (typed loosely here: compare imports this module, and the layering test forbids the circle)
CompareConfig = ModelResult = Any


def write_outputs(cfg: CompareConfig, results: list[ModelResult]) -> tuple[Path, Path]:
    """``compare.json`` and ``compare.png`` in ``cfg.out``."""
    out = Path(cfg.out)
    payload = {
        "rows": [r.row() for r in results],
        "settings": {**cfg.signature(), "models": list(cfg.models)},
        "details": {r.model: r.detail for r in results},
        "curves": {r.model: r.curve for r in results},
    }
    json_path = out / "compare.json"
    atomic_write_text(json_path, json.dumps(payload, indent=1))
    png = plot_curves(results, out / "compare.png", cfg)
    return json_path, png


def plot_curves(results: list[ModelResult], path: Path, cfg: CompareConfig) -> Path:
    """Validation bits per character against training seconds, one line per model."""
    from attnlm.inspect.heatmap import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, r in enumerate(results):
        color = f"C{i}"
        if r.curve:
            xs, ys = zip(*r.curve)
            style = {"marker": "o", "markersize": 3} if r.model == "ngram" else {}
            ax.plot(xs, ys, color=color, linewidth=1.2, label=r.model, **style)
        ax.plot([r.train_seconds], [r.val_bpc], marker="*", markersize=11, color=color,
                linestyle="none", label=None if r.curve else r.model)  # fmt: skip
    ax.set_xlabel("training seconds")
    ax.set_ylabel("validation bits per character")
    ax.set_title(f"{cfg.tokenizer} tokens, {cfg.budget_s:.0f}s per model (star: exact final score)")
    ax.grid(alpha=0.3)
    finals = [r.val_bpc for r in results]
    if finals:
        ax.set_ylim(min(finals) - 0.2, max(max(finals) + 1.0, min(finals) + 1.5))
    ax.legend()
    return _save(plt, fig, path)


def format_table(results: list[ModelResult]) -> str:
    """The comparison as a fixed-width text table."""
    width = max([7, *(len(r.model) + 1 for r in results)])
    head = f"{'model':<{width}}{'params':>12}{'train s':>10}{'tokens/s':>12}{'val bits/char':>15}"
    head += f"{'ppl/token':>11}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.model:<{width}}{r.params:>12,}{r.train_seconds:>10.1f}{r.tokens_per_second:>12,.0f}"
            f"{r.val_bpc:>15.4f}{r.ppl:>11.3f}"
        )
    return "\n".join(lines)
