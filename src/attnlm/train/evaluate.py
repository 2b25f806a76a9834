"""Evaluation: loss (nats/token), perplexity and bits per character.

Bits per character = total nats / characters / ln 2, which puts character-level, word-level and
BPE models (and the n-gram baselines) on one scale. :func:`evaluate` walks a token array in
non-overlapping windows so every id after the first is predicted exactly once;
:func:`estimate` averages a fixed set of random validation batches (the quick check run during
training) and converts to bits per character with the split's characters per token.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attnlm.data.windows import Windows
from attnlm.errors import InputError


@dataclass(frozen=True)
class EvalResult:
    """Loss in nats per token, perplexity, bits per character, and what was counted."""

    loss: float
    ppl: float
    bpc: float
    tokens: int
    chars: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def format(self) -> str:
        return (
            f"loss {self.loss:.4f} nats/token | perplexity {self.ppl:.3f} | "
            f"{self.bpc:.4f} bits/char ({self.tokens:,} tokens, {self.chars:,} chars)"
        )


def _result(total_nats: float, tokens: int, chars: int) -> EvalResult:
    loss = total_nats / max(tokens, 1)
    return EvalResult(
        loss=loss,
        ppl=math.exp(min(loss, 700.0)),
        bpc=total_nats / max(chars, 1) / math.log(2),
        tokens=tokens,
        chars=chars,
    )


def _autocast(device: torch.device, dtype: str):
    if dtype == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def _batch_nats(model, x, y, device, dtype) -> float:
    with _autocast(device, dtype):
        logits = model(x.to(device)).logits  # (B, T, V)
    nats = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="sum")
    return float(nats)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    ids: np.ndarray,
    n_chars: int,
    block_size: int,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    progress=None,
) -> EvalResult:
    """Exact loss, perplexity and bits/char over every target of ``ids``.

    ``n_chars`` is the number of characters ``ids`` encodes; the characters counted for bits per
    character are those of the predicted tokens, i.e. ``n_chars`` scaled by
    ``(len(ids) - 1) / len(ids)`` (exact for character tokenizers).
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    windows = Windows(ids, block_size)
    total, count = 0.0, 0
    try:
        for x, y in windows.sequential(batch_size):
            total += _batch_nats(model, x, y, device, dtype)
            count += y.numel()
            if progress is not None:
                progress.update(1)
    finally:
        model.train(was_training)
    chars = round(n_chars * count / len(ids))
    return _result(total, count, chars)


@torch.no_grad()
def estimate(
    model: torch.nn.Module,
    windows: Windows,
    chars_per_token: float,
    batches: int,
    batch_size: int,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
) -> EvalResult:
    """Loss over ``batches`` random batches, the same batches on every call (fixed seed)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for _ in range(batches):
            x, y = windows.sample(batch_size, gen)
            total += _batch_nats(model, x, y, device, dtype)
            count += y.numel()
    finally:
        model.train(was_training)
    return _result(total, count, round(count * chars_per_token))


def evaluate_checkpoint(
    checkpoint: str,
    text_path: str | None = None,
    split: str | None = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    device: str = "auto",
) -> tuple[EvalResult, str]:
    """Evaluate a checkpoint; returns the result and a description of the data.

    With ``text_path``: the whole text (``split="all"``, default) or its validation split.
    Without: the run's validation split (``val.bin`` beside the checkpoint when present,
    otherwise the training text named in the checkpoint's config, split again).
    """
    from attnlm.data.corpus import load_text, split_text
    from attnlm.data.windows import read_token_file
    from attnlm.train.checkpoint import load_checkpoint
    from attnlm.train.data import encode
    from attnlm.train.run import resolve_device

    dev = resolve_device(device)
    ck = load_checkpoint(checkpoint, dev)
    block = int(ck.model_config.block_size)
    val_fraction = float(ck.train_config.get("val_fraction", 0.1))
    ids: np.ndarray | None = None
    if text_path is None:
        val_bin = ck.path.parent / "val.bin"
        if ck.path.name.startswith("checkpoint") and val_bin.is_file():
            tf = read_token_file(val_bin)
            ids, n_chars = np.asarray(tf.open(), dtype=np.int64), tf.n_chars
            what = f"validation split of the training text ({val_bin})"
        else:
            source = ck.train_config.get("text")
            _, text = split_text(load_text(source), val_fraction)
            what = f"validation split of {source or 'the default corpus'}"
    else:
        text = load_text(text_path)
        what = str(text_path)
        if split == "val":
            _, text = split_text(text, val_fraction)
            what = f"validation split of {text_path}"
    if ids is None:
        ids = np.asarray(encode(ck.tokenizer, text, what), dtype=np.int64)
        n_chars = len(text)
    if max_tokens is not None and 0 < max_tokens < len(ids):
        n_chars = round(n_chars * max_tokens / len(ids))
        ids = ids[:max_tokens]
        what += f" (first {max_tokens:,} tokens)"
    if len(ids) < 2:
        raise InputError(f"{what}: too short to evaluate (need at least 2 tokens)")
    return evaluate(ck.model, ids, n_chars, block, batch_size, dev), what
