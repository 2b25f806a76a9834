"""``SamplingConfig``: the one description of how to pick tokens, shared by every decoder, the
``generate``/``translate`` commands and the web API.

``temperature == 0`` means greedy (argmax). ``top_k`` keeps the k most likely tokens and
``top_p`` the smallest set whose probability reaches p (nucleus sampling, Holtzman et al.,
2020); both apply after the temperature. ``stop`` strings end a row of text output (the text
layer handles them); ``seed`` makes sampling reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from attnlm.base.errors import ConfigError, InputError

# Above this, a request for new tokens is refused rather than allocated (buffers grow in chunks
# anyway; this bounds a typo such as 10**12).
MAX_NEW_TOKENS_LIMIT = 1_000_000


@dataclass(frozen=True)
class SamplingConfig:
    """How to choose new tokens (see the module docstring). Invalid values raise
    :class:`~attnlm.base.errors.ConfigError` naming the field."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 200
    stop: tuple[str, ...] = field(default=())
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"temperature must be a finite number >= 0, got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 1):
            raise ConfigError(f"top_k must be >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"max_new_tokens must be an integer >= 0, got {n!r}")
        if n > MAX_NEW_TOKENS_LIMIT:
            raise ConfigError(
                f"max_new_tokens {n:,} is more than {MAX_NEW_TOKENS_LIMIT:,}; "
                "generate in several calls"
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not 0 <= self.seed < 2**63):
            raise ConfigError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_(self, **changes: Any) -> SamplingConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


def check_sampling(sampling: SamplingConfig | None) -> SamplingConfig:
    """``sampling``, or the default :class:`SamplingConfig` for None; anything else is a
    one-line InputError (the decoders take one config, not loose fields)."""
    if sampling is None:
        return SamplingConfig()
    if not isinstance(sampling, SamplingConfig):
        raise InputError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    return sampling


def token_limit(model: Any, tokenizer: Any) -> int | None:
    """The tokenizer's id count where the model's output rows outnumber it (an embedding padded
    to a round size, Qwen's 151,936 rows for 151,665 tokens), else None: ids from there on name
    no text, so decoding never picks them (their logits are set to -inf)."""
    config = getattr(model, "config", None)
    rows = getattr(config, "vocab_size", None)
    try:
        ids = int(tokenizer.vocab_size)
    except (AttributeError, TypeError, ValueError):
        return None
    return ids if isinstance(rows, int) and 0 < ids < rows else None


def mask_from(logits: Any, limit: int) -> Any:
    """``logits`` ``(..., V)`` (a tensor or a numpy array) with ids ``>= limit`` at -inf."""
    logits = logits.clone() if hasattr(logits, "clone") else logits.copy()
    logits[..., limit:] = float("-inf")
    return logits


def masking(process: Any, limit: int | None) -> Any:
    """A logits processor ``(logits, length, max_length) -> logits`` that sets ids ``>= limit``
    to -inf, then runs ``process`` (None: nothing more); ``process`` itself where ``limit``
    is None."""
    if limit is None:
        return process

    def masked(logits: Any, length: int, max_length: int) -> Any:
        logits = mask_from(logits, limit)
        return logits if process is None else process(logits, length, max_length)

    return masked
