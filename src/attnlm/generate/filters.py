"""Logits filters: pure functions ``logits -> logits`` kept in a registry.

Each filter takes logits of shape (..., V) and returns new logits of the same shape; removed
tokens get ``-inf``. Filters compose left to right (``apply_filters``), so the decoding loop only
calls one function and stays short. Greedy decoding is ``temperature == 0`` and is handled by
the loop (argmax), not by a filter.

- ``temperature(logits, t)``: divide by ``t`` (``t > 0``).
- ``top_k(logits, k)``: keep the ``k`` largest logits per row (ties at the k-th value are kept).
- ``top_p(logits, p)``: nucleus sampling (Holtzman et al., 2020): keep the smallest set of tokens
  whose probabilities sum to at least ``p``; the most likely token is always kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from attnlm.base.errors import ConfigError

Filter = Callable[[torch.Tensor, Any], torch.Tensor]


def temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    """Scale logits by ``1 / t``; higher ``t`` flattens the distribution. The row's largest
    logit is subtracted first (softmax and the filters after this one do not change), so a
    tiny ``t`` (``1e-320``) gives greedy's distribution, never ``inf - inf`` or ``0 / 0``."""
    if not t > 0:
        raise ConfigError(f"temperature must be > 0 for sampling, got {t}")
    info = torch.finfo(logits.dtype)
    top = logits.amax(dim=-1, keepdim=True).clamp(min=info.min)
    return (logits - top) / max(t, info.tiny)  # a t the dtype cannot hold would be 0


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row, set the rest to ``-inf``."""
    if k < 1:
        raise ConfigError(f"top_k must be >= 1, got {k}")
    k = min(k, logits.size(-1))
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the most likely tokens whose total probability reaches ``p``."""
    if not 0.0 < p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = before >= p  # the first token always has before == 0 < p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


FILTERS: dict[str, Filter] = {
    "temperature": temperature,
    "top_k": top_k,
    "top_p": top_p,
}


def apply_filters(logits: torch.Tensor, specs: Iterable[tuple[str, Any]]) -> torch.Tensor:
    """Apply ``(name, argument)`` filters from :data:`FILTERS` in order."""
    for name, arg in specs:
        try:
            fn = FILTERS[name]
        except KeyError:
            raise ConfigError(
                f"unknown logits filter {name!r} (known: {sorted(FILTERS)})"
            ) from None
        logits = fn(logits, arg)
    return logits


def sampling_filters(
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> list[tuple[str, Any]]:
    """The filter chain for the usual sampling options (temperature first, then top-k, top-p)."""
    specs: list[tuple[str, Any]] = []
    if temperature != 1.0:
        specs.append(("temperature", temperature))
    if top_k is not None:
        specs.append(("top_k", top_k))
    if top_p is not None and top_p != 1.0:
        specs.append(("top_p", top_p))
    return specs
