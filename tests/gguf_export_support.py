"""Tiny deterministic llama and gpt runs for the GGUF export tests and for
``tests/fixtures/gguf/make_export_fixtures.py`` (which records llama.cpp's greedy continuation
of :data:`PROMPT` on their exported files).

Deterministic across machines and torch versions: the tokenizer is trained on a fixed text,
and every weight comes from numpy's PCG64 generator (stable across numpy versions) with a
fixed seed, not from torch's initialisers. The weights are scaled up from a typical
initialisation so that random models give a varied continuation with clear argmax margins
(the fixture script records the smallest margin).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from attnlm.loading.checkpoint import save_checkpoint
from attnlm.models.registry import build, config_table
from attnlm.tokenizers.bpe import BPETokenizer

PROMPT = "the quick brown fox"
NEW_TOKENS = 24
TEXT = (
    "the quick brown fox jumps over the lazy dog. a small model learns to count: one, two, "
    "three, 123, 456. hello world! the lazy dog sleeps while the quick fox runs away. "
) * 8
TABLES = {
    "llama": {"type": "llama", "block_size": 64, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
              "n_embd": 64, "d_ff": 96, "rope_theta": 10000.0, "rms_norm_eps": 1e-5},
    "gpt": {"type": "gpt", "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64,
            "d_ff": 160, "tie_embeddings": False},
}  # fmt: skip
SEEDS = {"llama": 1234, "gpt": 4321}


def tiny_tokenizer() -> BPETokenizer:
    return BPETokenizer.train(TEXT, 300, "gpt2", special_tokens=["<|endoftext|>"])


def tiny_model(family: str, tok: BPETokenizer | None = None):
    """``(model, tokenizer)``: the tiny ``family`` model (eval mode) with numpy-drawn weights
    (normal, std 0.3 for matrices; norm weights around 1; biases std 0.05); the vocabulary is
    the tokenizer's plus 4 unused rows (so the export pads the token list)."""
    tok = tok or tiny_tokenizer()
    model, _, _ = build({**TABLES[family], "vocab_size": tok.vocab_size + 4})
    rng = np.random.default_rng(SEEDS[family])
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if p.dim() > 1:
                values = rng.normal(0.0, 0.3, size=shape)
            elif "ln" in name and name.endswith("weight"):
                values = 1.0 + rng.normal(0.0, 0.1, size=shape)
            else:
                values = rng.normal(0.0, 0.05, size=shape)
            p.copy_(torch.from_numpy(values.astype(np.float32)))
    return model.eval(), tok


def tiny_run(path: Path, family: str) -> Path:
    """An attnlm run folder at ``path`` holding :func:`tiny_model`."""
    model, tok = tiny_model(family)
    table = config_table(_family(model), model.config)
    config = {"model_type": family, "step": 0, "model": table, "train": {}}
    save_checkpoint(path / "checkpoint", model, config, tok, {"step": 0})
    return path


def _family(model):
    from attnlm.models.registry import family_of

    return family_of(model)


def greedy(model, ids: list[int], n: int = NEW_TOKENS) -> tuple[list[int], list[float]]:
    """attnlm's greedy continuation (full forward each step) and the top-1 minus top-2 logit
    margin at each step."""
    seq, out, margins = list(ids), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(logits, 2).values
            margins.append(float(top[0] - top[1]))
            t = int(logits.argmax())
            out.append(t)
            seq.append(t)
    return out, margins


def asdict_config(model) -> dict:
    return dataclasses.asdict(model.config)
