"""The rotary scalings' numbers that need no PyTorch: YaRN's (Peng et al., 2023) attention
scale, the ramp's ends, and the ramp as per-pair factors of the angles for the C engine;
LongRoPE's (Ding et al., 2024; Phi-3's 128k models) attention scale. The GGUF reader and writer
and the engine, which runs without PyTorch, use these; :mod:`attnlm.nn.positional` computes
the frequencies from the same numbers, in PyTorch's float32 as ``transformers`` does."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def yarn_mscale(factor: float) -> float:
    """YaRN's default attention scaling ``0.1 ln(factor) + 1`` (1 for ``factor <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_scale(factor: float, attention_factor: float | None = None) -> float:
    """The scale of cos and sin: ``attention_factor`` where given, else :func:`yarn_mscale`."""
    return yarn_mscale(factor) if attention_factor is None else float(attention_factor)


def yarn_range(
    d: int,
    base: float,
    n: int,
    fast: float | None = None,
    slow: float | None = None,
    truncate: bool | None = None,
) -> tuple[float, float]:
    """The ramp's ends ``(low, high)``: the pair dimensions that turn ``fast`` (default 32)
    and ``slow`` (default 1) times over ``n`` positions, rounded down and up (unless
    ``truncate`` is False: gpt-oss's ramp in ``transformers``; llama.cpp always rounds), within
    ``[0, D - 1]`` (and apart by at least 0.001)."""

    def dim(turns: float) -> float:
        return d * math.log(n / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim(fast or 32.0), dim(slow or 1.0)
    if truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    return low, high + 0.001 if low == high else high


def yarn_angle_factors(theta: float, d: int, scaling: dict[str, Any]) -> np.ndarray:
    """``(D/2,)`` float32: YaRN as per-pair divisors of the angles, as the C engine takes
    them (llama.cpp's ``rope_yarn`` turns pair ``i`` by ``θ_i (s (1 - r_i) + r_i)``, ``s = 1 /
    factor``, ``r`` the ramp that keeps the fast pairs: the divisor ``1 / (s (1 - r_i) +
    r_i)``)."""
    n = scaling["original_max_position_embeddings"]
    low, high = yarn_range(d, theta, n, scaling.get("beta_fast"), scaling.get("beta_slow"),
                           scaling.get("truncate"))  # fmt: skip
    one = np.float32(1)
    keep = one - np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    s = np.float32(1.0 / scaling["factor"])
    return (one / (s * (one - keep) + keep)).astype(np.float32)


#: LongRoPE's keys (Hugging Face's names): the two lists of per-pair factors, the original
#: context and the context factor needed, the attention factor optional
LONGROPE_KEYS = ("short_factor", "long_factor", "original_max_position_embeddings", "factor",
                 "attention_factor")  # fmt: skip


def longrope_scale(factor: float, n: int, attention_factor: float | None = None) -> float:
    """LongRoPE's scale of cos and sin: ``attention_factor`` where given, else ``sqrt(1 +
    ln(factor) / ln(n))`` for an original context of ``n`` (1 for ``factor <= 1``)."""
    if attention_factor is not None:
        return float(attention_factor)
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(n))
