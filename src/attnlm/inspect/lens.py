"""The logit lens (nostalgebraist, 2020): what a decoder would predict if it stopped after
layer ``l``. Each layer's hidden state is read through the model's own final norm and LM
head, ``softmax(lm_head(ln_f(h_l)))``, as if it were the last layer; the rows show a
prediction forming across depth. Row 0 reads the embeddings (plus positions), the last row is
exactly the model's output.

Shapes: ``L`` layers (``L + 1`` rows, the embedding output first), ``T`` positions, ``k``
predictions kept per cell, ``V`` vocabulary, ``C`` width.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.tokenizers import encode_text, token_label


@dataclass
class Lens:
    """The lens of one text. ``tokens``: the ``T`` input token labels (the prediction at
    position ``t`` is for the token after ``tokens[t]``); ``layers``: the ``L + 1`` row names;
    ``top_ids`` / ``top_probs``: ``(L + 1, T, k)`` tensors, most likely first;
    ``top_tokens``: their labels as nested lists."""

    tokens: list[str]
    ids: list[int]
    layers: list[str]
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    top_tokens: list[list[list[str]]]

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "ids": self.ids,
            "layers": [
                {
                    "layer": name,
                    "positions": [
                        [
                            {"id": int(i), "token": s, "prob": round(float(p), 6)}
                            for i, s, p in zip(ids, toks, probs)
                        ]
                        for ids, toks, probs in zip(
                            self.top_ids[r].tolist(), self.top_tokens[r], self.top_probs[r]
                        )
                    ],
                }
                for r, name in enumerate(self.layers)
            ],
        }

    def grid(
        self, rows: Sequence[int] | None = None
    ) -> tuple[list[str], list[list[str]], list[list[float]]]:
        """What the table and the picture show: the row names, last layer first, and for each
        row the top token's label and probability at each position (``rows``: only these
        row indices, 0 = the embeddings)."""
        rows = sorted(range(len(self.layers)) if rows is None else rows, reverse=True)
        names = [self.layers[r] for r in rows]
        labels = [[cell[0] for cell in self.top_tokens[r]] for r in rows]
        probs = [self.top_probs[r, :, 0].tolist() for r in rows]
        return names, labels, probs

    def table(self, width: int = 12, rows: Sequence[int] | None = None) -> str:
        """A text table: one row per layer (last layer first, as the model stacks them; only
        ``rows`` if given), one column per position, the top prediction and its probability
        in each cell."""
        from attnlm.inspect.heatmap import token_labels

        def cut(s: str, n: int) -> str:
            return s if len(s) <= n else s[: n - 1] + "\u2026"

        names, labels, probs = self.grid(rows)
        name_w = max(len(n) for n in names)
        head = [cut(t, width).ljust(width) for t in token_labels(self.tokens)]
        lines = [" " * name_w + "  " + " ".join(head)]
        for name, top, row in zip(names, labels, probs):
            cells = [f"{cut(t, width - 5)} {p:.2f}".ljust(width)
                     for t, p in zip(token_labels(top), row)]  # fmt: skip
            lines.append(name.ljust(name_w) + "  " + " ".join(cells))
        return "\n".join(line.rstrip() for line in lines)


def supports_lens(model: Any) -> bool:
    """Whether the lens reads ``model``: a decoder with blocks, a final norm and an LM head."""
    return all(getattr(model, a, None) is not None for a in ("blocks", "ln_f", "lm_head"))


def _readout(model: Any) -> tuple[Any, Any]:
    """The final norm and the LM head the lens reads through, or a one-line InputError."""
    if not supports_lens(model):
        from attnlm.models.registry import family_of

        kind = family_of(model).type
        raise InputError(
            f"the logit lens reads a decoder's layers through its final norm and LM head; "
            f"a {kind} model has none"
        )
    return model.ln_f, model.lm_head


@torch.inference_mode()
def logit_lens_ids(model: Any, ids: list[int], k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(top_probs, top_ids)``, each ``(L + 1, T, k)``, for the token ids ``ids``."""
    norm, head = _readout(model)
    if not ids:
        raise InputError("the text is empty after tokenization")
    block = getattr(getattr(model, "config", None), "block_size", None)
    if block is not None and len(ids) > block:
        raise InputError(f"the text is {len(ids):,} tokens; this model's window is {block:,}")
    x = torch.tensor([ids], device=model_device(model))  # (1, T)
    with eval_mode(model):
        out = model(ids=x, return_hidden=True)
        hidden = torch.stack(out.hidden_states)[:, 0]  # (L + 1, T, C)
        logits = head(norm(hidden)).float()  # (L + 1, T, V)
        # Gemma 2's cap and Granite's divisor, as the model's own logits
        logits = getattr(model, "_cap", lambda v: v)(logits)
    probs = torch.softmax(logits, dim=-1)
    k = min(k, probs.size(-1))
    top_probs, top_ids = probs.topk(k, dim=-1)  # (L + 1, T, k)
    return top_probs.cpu(), top_ids.cpu()


def logit_lens(model: Any, tokenizer: Any, text: str, k: int = 5) -> Lens:
    """The logit lens of ``text`` (see the module docstring): the top ``k`` next-token
    predictions of every layer at every position. A tokenizer that adds a BOS (Gemma's; as
    ``generate`` and TransformerLens' ``prepend_bos``) gets it first: it is a row of its own."""
    from attnlm.inspect.record import with_bos

    ids = with_bos(tokenizer, text, encode_text(tokenizer, text, "the text"))
    top_probs, top_ids = logit_lens_ids(model, ids, k)
    n = top_ids.size(0) - 1
    layers = ["embed"] + [f"layer {i}" for i in range(1, n + 1)]
    labels = [[[token_label(tokenizer, i) for i in cell] for cell in row]
              for row in top_ids.tolist()]  # fmt: skip
    return Lens(
        tokens=[token_label(tokenizer, i) for i in ids],
        ids=ids,
        layers=layers,
        top_ids=top_ids,
        top_probs=top_probs,
        top_tokens=labels,
    )


def plot_lens(lens: Lens, path: str | os.PathLike[str], title: str = "") -> Path:
    """A layer x position grid (last layer on top): each cell names the top prediction and is
    coloured by its probability. Written atomically."""
    from attnlm.inspect.heatmap import _pyplot, _save, token_labels

    plt = _pyplot()
    row_names, names, grid = lens.grid()
    probs = np.asarray(grid)  # (L + 1, T), last layer first
    rows, cols = probs.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.9 * cols, 40), min(1.5 + 0.4 * rows, 40)))
    im = ax.imshow(probs, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for r in range(rows):
        for c, label in enumerate(token_labels(names[r])):
            colour = "white" if probs[r, c] > 0.6 else "black"
            ax.text(c, r, label[:10], ha="center", va="center", fontsize=7, color=colour)
    ax.set_xticks(range(cols))
    ax.set_xticklabels(token_labels(lens.tokens), rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(row_names, fontsize=7)
    ax.set_xlabel("input token (the cell predicts the token after it)", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="probability of the top token")
    ax.set_title(title or "logit lens", fontsize=10)
    return _save(plt, fig, path)
