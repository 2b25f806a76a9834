"""Plots: the attention heatmap grid (layers x heads) and the training loss curve (PNG).

Attention grid: one panel per (layer, head); in each panel rows are queries and columns are
keys, labelled with the tokens (target and source tokens for cross-attention); darker means
more attention. Causal models show a lower-triangular pattern.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def token_labels(tokens: Sequence[str]) -> list[str]:
    """Printable labels: whitespace shown as visible symbols."""
    table = {"\n": "\\n", "\t": "\\t", " ": "\u2423"}
    return ["".join(table.get(c, c) for c in t) or "\u2205" for t in tokens]


def plot_attention_grid(
    attentions: Sequence[Any],
    tokens: Sequence[str],
    path: str | os.PathLike[str],
    title: str = "",
    key_tokens: Sequence[str] | None = None,
) -> Path:
    """Save a layer x head grid of attention maps to ``path``.

    ``attentions``: one array per layer of shape ``(H, T, S)`` (or ``(1, H, T, S)``), rows are
    queries and columns keys; ``tokens``: the ``T`` query labels; ``key_tokens``: the ``S`` key
    labels (default: the query labels, for self-attention).
    """
    maps = [_array(a) for a in attentions]
    maps = [m[0] if m.ndim == 4 else m for m in maps]  # (H, T, S) each
    panels = [[(f"layer {l} head {h}", m[h]) for h in range(m.shape[0])]
              for l, m in enumerate(maps)]  # fmt: skip
    return plot_attention_panels(panels, tokens, key_tokens or tokens, path, title)


def _array(a: Any) -> np.ndarray:
    return np.asarray(a.detach().float().cpu() if hasattr(a, "detach") else a)


#: grids of up to this many panels name the tokens on every panel
_LABEL_EVERY_PANEL = 4


def plot_attention_panels(
    panels: Sequence[Sequence[tuple[str, Any]]],
    queries: Sequence[str],
    keys: Sequence[str],
    path: str | os.PathLike[str],
    title: str = "",
    annotate: bool = False,
) -> Path:
    """Save a grid of attention maps: ``panels[row][col] = (panel title, (T, S) weights)``,
    rows of the maps are the ``queries``, columns the ``keys``. ``annotate`` writes each
    weight in its cell (for one head or a few). A grid of more than four panels names the
    keys under its bottom panels and the queries left of its first column only."""
    plt = _pyplot()
    q_labels, k_labels = token_labels(queries), token_labels(keys)
    n_rows, n_cols = len(panels), max(len(r) for r in panels)
    t, s = len(q_labels), len(k_labels)
    for row in panels:
        for _, m in row:
            if _array(m).shape != (t, s):
                raise ValueError(f"a map of shape {_array(m).shape} for {t} x {s} labels")
    cell_w = max(1.6, 0.16 * s + 0.8) * (2.2 if annotate else 1.0)
    cell_h = max(1.6, 0.16 * t + 0.8) * (2.2 if annotate else 1.0)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(cell_w * n_cols, cell_h * n_rows), squeeze=False
    )
    fontsize = max(4, min(9, int(150 / max(t, s, 1))))
    for r, row in enumerate(panels):
        for c in range(n_cols):
            ax = axes[r][c]
            if c >= len(row):
                ax.axis("off")
                continue
            name, m = row[c]
            m = _array(m)
            ax.imshow(m, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
            # every panel has the same tokens: in a large grid only the outer panels name
            # them (the bottom row its keys, the first column its queries), which also
            # spares matplotlib the layout of thousands of tick labels (a 6 x 12 grid)
            outer = n_rows * n_cols <= _LABEL_EVERY_PANEL
            if outer or r == n_rows - 1 or r + 1 < n_rows and c >= len(panels[r + 1]):
                ax.set_xticks(range(s))
                ax.set_xticklabels(k_labels, rotation=90, fontsize=fontsize, family="monospace")
            else:
                ax.set_xticks([])
            if outer or c == 0:
                ax.set_yticks(range(t))
                ax.set_yticklabels(q_labels, fontsize=fontsize, family="monospace")
            else:
                ax.set_yticks([])
            ax.tick_params(length=0, pad=1)
            ax.set_title(name, fontsize=8)
            if annotate:
                for i in range(t):
                    for j in range(s):
                        color = "white" if m[i, j] > 0.6 else "black"
                        ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center",
                                fontsize=max(4, fontsize - 1), color=color)  # fmt: skip
            if c == 0:
                ax.set_ylabel("query", fontsize=7)
            if r == n_rows - 1:
                ax.set_xlabel("key", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    # the layout leaves the title its own strip above the panels' titles
    return _save(plt, fig, path, top=1.0 - 0.35 / fig.get_figheight() if title else 1.0)


def _save(plt: Any, fig: Any, path: str | os.PathLike[str], top: float = 1.0) -> Path:
    """Lay out (the axes below ``top``, a fraction of the height), write ``fig`` at ``path``
    (creating folders) and close it: PNG, or the format the suffix names when matplotlib knows
    it. Atomic (:mod:`attnlm.base.fileio`)."""
    from attnlm.base.fileio import atomic_path

    fig.tight_layout(rect=(0.0, 0.0, 1.0, top))
    path = Path(path)
    fmt = path.suffix[1:].lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        fmt = "png"
    try:
        with atomic_path(path) as tmp:  # a kill mid-write leaves the old picture
            fig.savefig(tmp, dpi=110, format=fmt)
    finally:
        plt.close(fig)
    return path


def plot_loss_curve(
    records: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = "loss"
) -> Path:
    """Training loss (per logged step) and validation loss (per evaluation) against steps."""
    plt = _pyplot()
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if train:
        ax.plot(*zip(*train), label="train", color="tab:blue", linewidth=1.0, alpha=0.8)
    if val:
        ax.plot(*zip(*val), label="validation", color="tab:orange", marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def plot_fewshot_curve(
    curves: dict[str, Sequence[tuple[int, float, float | None]]],
    path: str | os.PathLike[str],
    metric: str = "acc",
    title: str = "few-shot curve",
    chance: float | None = None,
) -> Path:
    """A metric against the number of examples in the prompt: one line per model (``curves``:
    model -> ``(shots, value, stderr or None)`` points), error bars of one standard error, and
    the chance level as a dashed line when given."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, points in curves.items():
        shots = [p[0] for p in points]
        values = [p[1] for p in points]
        errors = [p[2] or 0.0 for p in points]
        ax.errorbar(shots, values, yerr=errors, marker="o", markersize=4, capsize=3, label=name)
    if chance is not None:
        ax.axhline(chance, color="gray", linestyle="--", linewidth=1, label="chance")
    all_shots = sorted({p[0] for points in curves.values() for p in points})
    ax.set_xticks(all_shots)
    ax.set_xlabel("examples in the prompt (shots)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_grid(
    values: Sequence[Sequence[float]],
    path: str | os.PathLike[str],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xticks: Sequence[str] | None = None,
    diverging: bool = False,
    annotate: bool | None = None,
) -> Path:
    """A matrix as a colour grid (rows from the top: row 0 first), with a colour bar:
    ``diverging`` centres a red-blue map on 0 (patching, attribution), else a sequential one
    (scores in [0, 1]); values are written in the cells when the grid is small."""
    plt = _pyplot()
    m = np.asarray(values, dtype=float)
    rows, cols = m.shape
    fig, ax = plt.subplots(figsize=(min(14, 2.5 + 0.45 * cols), min(12, 1.5 + 0.32 * rows)))
    if diverging:
        bound = float(np.nanmax(np.abs(m))) or 1.0
        image = ax.imshow(m, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    else:
        image = ax.imshow(m, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_yticks(range(rows))
    ax.set_xticks(range(cols))
    if xticks is not None:
        ax.set_xticklabels(token_labels(list(xticks)), rotation=60, ha="right", fontsize=7)
    ax.tick_params(labelsize=7)
    if annotate if annotate is not None else rows * cols <= 200:
        for i in range(rows):
            for j in range(cols):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return _save(plt, fig, path)
