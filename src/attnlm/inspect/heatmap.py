"""Plots: the attention heatmap grid (layers x heads) and the training loss curve (PNG).

Attention grid: one panel per (layer, head); in each panel rows are queries and columns are
keys, both labelled with the prompt's tokens; darker means more attention. Causal models show
a lower-triangular pattern.
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
) -> Path:
    """Save a layer x head grid of attention maps to ``path``.

    ``attentions``: one array per layer of shape ``(H, T, T)`` (or ``(1, H, T, T)``), rows are
    queries and columns keys; ``tokens``: the ``T`` token strings.
    """
    plt = _pyplot()
    maps = [np.asarray(a.detach().float().cpu() if hasattr(a, "detach") else a) for a in attentions]
    maps = [m[0] if m.ndim == 4 else m for m in maps]  # (H, T, T) each
    n_layer, n_head, t = len(maps), maps[0].shape[0], maps[0].shape[-1]
    labels = token_labels(tokens)
    if len(labels) != t:
        raise ValueError(f"{len(labels)} token labels for {t} positions")
    cell = max(1.6, 0.16 * t + 0.8)
    fig, axes = plt.subplots(
        n_layer, n_head, figsize=(cell * n_head, cell * n_layer), squeeze=False
    )
    fontsize = max(4, min(9, int(150 / max(t, 1))))
    for l_idx in range(n_layer):
        for h in range(n_head):
            ax = axes[l_idx][h]
            ax.imshow(maps[l_idx][h], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks(range(t))
            ax.set_yticks(range(t))
            ax.set_xticklabels(labels, rotation=90, fontsize=fontsize, family="monospace")
            ax.set_yticklabels(labels, fontsize=fontsize, family="monospace")
            ax.tick_params(length=0, pad=1)
            ax.set_title(f"layer {l_idx} head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel("query", fontsize=7)
            if l_idx == n_layer - 1:
                ax.set_xlabel("key", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: str | os.PathLike[str]) -> Path:
    """Lay out, write ``fig`` at ``path`` (creating folders) and close it: PNG, or the format
    the suffix names when matplotlib knows it. Atomic (:mod:`attnlm.fileio`)."""
    from attnlm.fileio import atomic_path

    fig.tight_layout()
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
