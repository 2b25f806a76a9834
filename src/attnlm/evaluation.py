"""Evaluation for every objective: nats and bits per target token, perplexity, accuracy, and
bits per character where characters are defined.

Everything is computed from summed losses: each batch's ``loss_sum`` and ``n_targets`` (from
the model's output) are added up, so batches with different numbers of targets (masked LM,
sentence pairs) weigh every target equally. Bits per character = total nats / characters /
ln 2, which puts character-level, word-level and BPE models (and the n-gram baselines) on one
scale; for a causal LM the characters counted are those of the predicted tokens.

:func:`evaluate` walks a split so every target is predicted exactly once; :func:`estimate`
averages a fixed set of random batches (the quick check during training).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from attnlm.data.corpus import DEFAULT_VAL_FRACTION
from attnlm.data.windows import bits_per_char
from attnlm.device import autocast, eval_mode
from attnlm.errors import InputError
from attnlm.models.base import IGNORE_INDEX
from attnlm.objectives import BatchSource, make_objective


@dataclass(frozen=True)
class EvalResult:
    """Loss in nats per target, perplexity, bits per character (None where characters are
    not defined), bits per target token, accuracy of the argmax, and what was counted."""

    loss: float
    ppl: float
    bpc: float | None
    tokens: int
    chars: int
    bits_per_token: float = 0.0
    accuracy: float | None = None

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    def format(self) -> str:
        bpc = f"{self.bpc:.4f} bits/char" if self.bpc is not None else "bits/char n/a"
        acc = f" | accuracy {self.accuracy:.2%}" if self.accuracy is not None else ""
        return (
            f"loss {self.loss:.4f} nats/token | perplexity {self.ppl:.3f} | "
            f"{bpc}{acc} ({self.tokens:,} tokens, {self.chars:,} chars)"
        )


def result_from_sums(
    total_nats: float, targets: int, chars: int | None, correct: int | None = None
) -> EvalResult:
    """An :class:`EvalResult` from summed nats over ``targets`` targets and ``chars``
    characters (None: bits per character undefined)."""
    loss = total_nats / max(targets, 1)
    return EvalResult(
        loss=loss,
        ppl=math.exp(min(loss, 700.0)),
        bpc=None if chars is None else bits_per_char(total_nats, chars),
        tokens=targets,
        chars=chars or 0,
        bits_per_token=loss / math.log(2),
        accuracy=None if correct is None else correct / max(targets, 1),
    )


class Sums:
    """Running sums of one evaluation: nats, targets and correct argmax predictions."""

    def __init__(self) -> None:
        self.nats, self.targets, self.correct = 0.0, 0, 0
        self.has_accuracy = True

    def add(self, model: torch.nn.Module, batch: dict, device: torch.device, dtype: str) -> None:
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, dtype):
            out = model(**batch)
        self.nats += float(out.loss_sum.float())
        self.targets += int(out.n_targets)
        targets = batch["targets"]
        keep = targets != IGNORE_INDEX
        if out.logits is not None and out.logits.shape[:-1] == targets.shape:
            self.correct += int((out.logits.argmax(-1).eq(targets) & keep).sum())
        elif out.logits is not None and out.logits.dim() == 2 and len(out.logits) == out.n_targets:
            # logits only at the counted targets (N, V), in order (e.g. BERT's masked LM)
            self.correct += int(out.logits.argmax(-1).eq(targets[keep]).sum())
        else:
            self.has_accuracy = False

    def result(self, chars_per_target: float | None) -> EvalResult:
        chars = None if chars_per_target is None else round(self.targets * chars_per_target)
        return result_from_sums(
            self.nats, self.targets, chars, self.correct if self.has_accuracy else None
        )


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    source: BatchSource,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    progress: Any = None,
) -> EvalResult:
    """Exact loss over every target of ``source`` (each predicted once)."""
    device = torch.device(device)
    sums = Sums()
    with eval_mode(model):
        for batch in source.sequential(batch_size):
            sums.add(model, batch, device, dtype)
            if progress is not None:
                progress.update(1)
    return sums.result(source.chars_per_target)


@torch.no_grad()
def estimate(
    model: torch.nn.Module,
    source: BatchSource,
    batches: int,
    batch_size: int,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
) -> EvalResult:
    """Loss over ``batches`` random batches, the same batches on every call (fixed seed)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    sums = Sums()
    with eval_mode(model):
        for _ in range(batches):
            sums.add(model, source.sample(batch_size, gen), device, dtype)
    return sums.result(source.chars_per_target)


def evaluate_ids(
    model: torch.nn.Module,
    ids: np.ndarray,
    n_chars: int | None,
    block_size: int,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    objective: Any = None,
    progress: Any = None,
) -> EvalResult:
    """Exact evaluation of a model on a token array (``n_chars`` characters of text) under
    its family's objective (causal by default)."""
    if objective is None:
        from attnlm.models.registry import family_of

        try:
            name = family_of(model).objective
        except Exception:  # noqa: BLE001 - an unregistered module: a plain causal LM
            name = "causal"
        objective = make_objective(name, None, getattr(model, "config", None))
    cpt = None if n_chars is None else n_chars / max(len(ids), 1)
    source = objective.source(np.asarray(ids), cpt, block_size)
    return evaluate(model, source, batch_size, device, dtype, progress)


def evaluate_checkpoint(
    checkpoint: str,
    text_path: str | None = None,
    split: str | None = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    device: str = "auto",
    model: str | None = None,
) -> tuple[EvalResult, str]:
    """Evaluate a checkpoint on text; returns the result and a description of the data.

    With ``text_path``: the whole text (``split="all"``, default) or its validation split.
    Without: the run's validation split (``val.bin`` beside the checkpoint when present,
    otherwise the training text named in the checkpoint's config, split again).
    ``model``: a pretrained name or Hugging Face folder instead of ``checkpoint``
    (:func:`attnlm.checkpoint.load_model_ref`).
    """
    from attnlm.checkpoint import load_model_ref
    from attnlm.data.corpus import load_text, split_text
    from attnlm.data.windows import read_token_file
    from attnlm.device import resolve_device
    from attnlm.tokenizers import encode_text

    if max_tokens is not None and max_tokens < 2:
        raise InputError(f"--max-tokens must be at least 2, got {max_tokens}")
    dev = resolve_device(device)
    ck = load_model_ref(checkpoint, model, dev)
    objective = make_objective(ck.family.objective, ck.tokenizer, ck.model_config)
    if getattr(objective, "data", "text") != "text":
        raise InputError(
            f"{ck.path}: a {ck.family.type} model is evaluated on sentence pairs, not text"
        )
    block = int(ck.model_config.block_size)
    val_fraction = float(ck.train_config.get("val_fraction", DEFAULT_VAL_FRACTION))
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
        ids = np.asarray(encode_text(ck.tokenizer, text, what), dtype=np.int64)
        n_chars = len(text)
    if max_tokens is not None and max_tokens < len(ids):
        n_chars = round(n_chars * max_tokens / len(ids))
        ids = ids[:max_tokens]
        what += f" (first {max_tokens:,} tokens)"
    if len(ids) < 2:
        raise InputError(f"{what}: too short to evaluate (need at least 2 tokens)")
    result = evaluate_ids(ck.model, ids, n_chars, block, batch_size, dev, objective=objective)
    return result, what
