"""AdamW with weight decay on matrices only, and the warmup + cosine learning-rate schedule.

Weight decay applies to parameters with two or more dimensions (linear weights, embeddings);
biases and norm gains are not decayed (the GPT-2 / nanoGPT convention).

Schedule: linear warmup from ``lr / (warmup + 1)`` to ``lr`` over ``warmup_iters`` steps, then a
cosine from ``lr`` down to ``min_lr``. The cosine follows the *progress* of the run: the larger
of the step fraction and, with a wall-clock budget, the time fraction, so a run stopped by its
budget still ends its schedule at ``min_lr``.
"""

from __future__ import annotations

import math

import torch

from attnlm.train.config import TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices with ``weight_decay``, everything else without."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, with the fused kernel on CPU and CUDA (one kernel for
    all parameters instead of a Python loop)."""
    groups = param_groups(model, cfg.weight_decay)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.fused and device_type in ("cpu", "cuda"):
        try:
            return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, fused=True)
        except (RuntimeError, TypeError):  # an older torch without this fused kernel
            pass
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas)


def lr_at(step: int, cfg: TrainConfig, time_fraction: float = 0.0) -> float:
    """Learning rate for optimizer step ``step`` (0-based) and elapsed fraction of the budget."""
    if step < cfg.warmup_iters:
        return cfg.lr * (step + 1) / (cfg.warmup_iters + 1)
    span = max(cfg.max_iters - cfg.warmup_iters, 1)
    ratio = min(max((step - cfg.warmup_iters) / span, time_fraction, 0.0), 1.0)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)
