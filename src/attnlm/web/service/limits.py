"""What one explorer request may ask for: the limits every endpoint enforces, the errors a
request can get (each with its HTTP status), and the sampling settings of a generation or
translation request checked against those limits.

:mod:`attnlm.web.server` turns a :class:`ServiceError` into ``{"error": "one line"}`` with
its ``status``; any other :class:`~attnlm.base.errors.AttnlmError` answers 400.
"""

from __future__ import annotations

import math

from attnlm.base.errors import ConfigError, InputError
from attnlm.generate.sampling import SamplingConfig

DEFAULT_MAX_CHARS = 2000  # longest text accepted by any endpoint
MAX_NEW_TOKENS = 500  # most tokens one generation request may ask for
MAX_BEAMS = 16  # most beams one translation request may ask for
MAX_TOP_K = 50  # most next-token candidates per position
DECIMALS = 6  # attention and probabilities are rounded to this many decimals in JSON
# Most attention weights one answer may hold (layers x heads x queries x keys): about 9 bytes
# each in JSON, so 2M is an answer of about 15 MB and a few seconds on one core (GPT-2 small,
# 12 layers x 12 heads: up to 117 tokens).
MAX_ATTENTION_VALUES = 2_000_000
# Most logits one logit-lens request computes: every row (L + 1) at every position (T) is read
# through the LM head at once, (L + 1) x T x V float32 values (256 MB at the limit; SmolLM2,
# 31 rows x 49,152 tokens: up to 42 tokens).
MAX_LENS_LOGITS = 64_000_000
MAX_CHAT_MESSAGES = 64  # most messages one chat request may carry
MAX_CHAT_CHARS = 16_000  # most characters of all its messages together
# Activation patching (POST /api/patch) runs one batch per sweep, a row per layer and position
# (or per layer and head), each row the whole text: most logits such a batch may hold, rows x
# tokens x vocabulary float32 (512 MB at the limit; GPT-2 small, 12 layers x 50,257 tokens:
# up to 14 tokens; SmolLM2, 30 layers x 49,152 tokens: up to 9).
MAX_PATCH_LOGITS = 128_000_000
# Head scores (POST /api/heads): repeated random sequences of at most MAX_SCORE_LENGTH tokens,
# repeated once, at most MAX_SCORE_BATCH of them; the attention patterns of every layer are
# kept, layers x batch x heads x (2 length)^2 weights, at most MAX_SCORE_WEIGHTS (128 MB).
MAX_SCORE_LENGTH = 128
MAX_SCORE_BATCH = 16
MAX_SCORE_WEIGHTS = 32_000_000


class ServiceError(InputError):
    """A request the service cannot answer; ``status`` is the HTTP status to send."""

    status = 400


class TooLongError(ServiceError):
    """The text is longer than the character limit or the model's window (HTTP 413)."""

    status = 413


class NotSupportedError(ServiceError):
    """The model lacks the capability the request needs (HTTP 400)."""


class UnknownModelError(ServiceError):
    """No served model has the requested name (HTTP 404)."""

    status = 404


def sampling_config(
    max_new_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> SamplingConfig:
    """The shared :class:`~attnlm.generate.sampling.SamplingConfig` of one web request, with the
    explorer's tighter limits (at most :data:`MAX_NEW_TOKENS` new tokens, temperature <= 10);
    bad values raise :class:`ServiceError` (HTTP 400)."""
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or not (1 <= max_new_tokens <= MAX_NEW_TOKENS)
    ):
        raise ServiceError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}")
    if isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 10:
        raise ServiceError("temperature must be between 0 and 10 (0 means greedy)")
    try:
        return SamplingConfig(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            seed=seed,
        )
    except ConfigError as e:
        raise ServiceError(str(e)) from None
