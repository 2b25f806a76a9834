"""The explorer's experiments inside a causal decoder, each answering for one
:class:`~attnlm.web.service.model.ModelService` through :mod:`attnlm.inspect.experiments`
(the code of ``attnlm ablate``, ``attnlm patch`` and ``attnlm heads``):

- :func:`ablate`: the next-token distribution after a text with some heads zeroed or
  mean-ablated, beside the plain one, and their KL divergence;
- :func:`patch`: activation patching from a clean text into a corrupt one of the same length
  in tokens, the fraction of the logit difference recovered per layer x position (residual
  stream) and per layer x head;
- :func:`head_scores`: induction, previous-token or duplicate-token scores of every head on
  repeated random token sequences.

Each needs a model :func:`attnlm.inspect.trace.trace` reads (gpt, llama and the GGUF /
Hugging Face models built on them; the info says ``interpret: true``); any other model, and
every input the experiments refuse, answers the experiments' own one-line message (HTTP 400).
Answers are the experiments' dicts, with any non-finite number as ``null`` (JSON has none).

Shapes: ``L`` layers, ``H`` heads, ``T`` tokens, ``V`` vocabulary, ``B`` random sequences of
``n`` tokens (repeated once: ``2 n``). ``service`` is always a ``ModelService`` (not
imported: the service imports this module).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from attnlm.base.errors import InputError
from attnlm.web.service.limits import (
    MAX_LENS_LOGITS,
    MAX_PATCH_LOGITS,
    MAX_SCORE_BATCH,
    MAX_SCORE_LENGTH,
    MAX_SCORE_WEIGHTS,
    MAX_TOP_K,
    ServiceError,
    TooLongError,
)

KINDS = ("induction", "previous-token", "duplicate-token")


def supported(model: Any) -> bool:
    """Whether the experiments read ``model``: the tracer takes it (it lists its hook names)."""
    from attnlm.inspect.trace import hook_names

    try:
        hook_names(model)
    except InputError:
        return False
    return True


def _require(service: Any) -> None:
    """The tracer's own one line for a model it does not read (a BERT, an encoder-decoder)."""
    from attnlm.inspect.trace import hook_names

    try:
        hook_names(service.model)
    except InputError as e:
        raise ServiceError(str(e)) from None


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None (nested lists and dicts)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _run(service: Any, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``fn(*args, **kwargs)`` under the model's lock, its refusals as one-line 400s."""
    try:
        with service._lock:
            return _finite(fn(*args, **kwargs))
    except InputError as e:
        raise ServiceError(str(e)) from None


def _layers_heads(service: Any) -> tuple[int, int]:
    return len(service.model.blocks), service.model.blocks[0].attn.n_head


def ablate(
    service: Any, text: str, heads: Sequence[str], mean: bool = False, k: int = 10
) -> dict[str, Any]:
    """The top ``k`` next tokens after ``text`` with and without ``heads`` (``"LAYER.HEAD"``
    strings), zeroed or (``mean``) replaced by their mean over the positions
    (:func:`attnlm.inspect.experiments.ablation`): ``{"heads", "ablation": "zero" | "mean",
    "kl", "top": [k of {"token", "id", "p", "p_ablated"}] (the plain run's top), "top_ablated"
    (the ablated run's top), "k"}``."""
    from attnlm.inspect.experiments import ablation, parse_heads

    _require(service)
    if not 1 <= k <= MAX_TOP_K:
        raise ServiceError(f"k must be between 1 and {MAX_TOP_K}")
    service.encode(text)  # the character and window limits, tokenizer errors
    layers, n_head = _layers_heads(service)
    if len(heads) > layers * n_head:
        raise ServiceError(
            f"heads lists {len(heads)} heads; this model has {layers} layers x {n_head} heads"
        )
    try:
        pairs = parse_heads(list(heads), service.model)
    except InputError as e:
        raise ServiceError(str(e)) from None
    vocab = getattr(service.model.config, "vocab_size", None) or MAX_TOP_K
    k = min(k, vocab)
    out = _run(service, ablation, service.model, service.tokenizer, text, pairs, mean=mean, top=k)
    return {**out, "k": k}


def patch(service: Any, clean: str, corrupt: str, answer: str, wrong: str) -> dict[str, Any]:
    """Activation patching from ``clean`` into ``corrupt`` with the logit difference of
    ``answer`` over ``wrong`` (:func:`attnlm.inspect.experiments.patching`):
    ``{"clean_logit_diff", "corrupt_logit_diff", "answer_token", "wrong_token", "answer",
    "wrong", "tokens": [T], "resid": [L][T], "heads": [L][H]}``, each cell the fraction
    recovered (1 = the clean run's difference, 0 = the corrupt run's)."""
    from attnlm.inspect.experiments import patching

    _require(service)
    t = max(len(service.encode(clean, "clean text")), len(service.encode(corrupt, "corrupt text")))
    for value, what in ((answer, "answer"), (wrong, "wrong answer")):
        service._check_text(value, what)
    layers, n_head = _layers_heads(service)
    vocab = getattr(service.model.config, "vocab_size", None) or 0
    rows = layers * max(t, n_head)
    n = rows * t * vocab
    if n > MAX_PATCH_LOGITS:  # one batch holds every layer x position (or head) at once
        raise TooLongError(
            f"patching {t} tokens runs {layers} layers x {max(t, n_head)} rows of {t} tokens "
            f"through the LM head at once: {n:,} logits; the limit is {MAX_PATCH_LOGITS:,} "
            "(shorten the texts)"
        )
    out = _run(service, patching, service.model, service.tokenizer, clean, corrupt, answer, wrong)
    names = service.token_strings([out["answer_token"], out["wrong_token"]])
    return {**out, "answer": names[0], "wrong": names[1]}


def head_scores(
    service: Any, kind: str = "induction", length: int = 20, batch: int = 8, seed: int = 0
) -> dict[str, Any]:
    """Every head's ``kind`` score (:func:`attnlm.inspect.experiments.head_scores`) on
    ``batch`` random sequences of ``length`` tokens repeated once: ``{"kind", "length",
    "batch", "seed", "scores": [L][H]}``, each the mean attention to the token the kind names
    (induction: the token after the earlier occurrence), in [0, 1]."""
    from attnlm.inspect.experiments import head_scores as scores

    _require(service)
    if kind not in KINDS:
        raise ServiceError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not 1 <= length <= MAX_SCORE_LENGTH:
        raise ServiceError(f"length must be between 1 and {MAX_SCORE_LENGTH}")
    if not 1 <= batch <= MAX_SCORE_BATCH:
        raise ServiceError(f"batch must be between 1 and {MAX_SCORE_BATCH}")
    if not 0 <= seed < 2**63:
        raise ServiceError("seed must be between 0 and 2**63 - 1")
    window = service.window
    if window and 2 * length > window:
        raise TooLongError(
            f"the repeated sequences are {2 * length} tokens long; this model's window is "
            f"{window} (length at most {window // 2})"
        )
    layers, n_head = _layers_heads(service)
    weights = layers * batch * n_head * (2 * length) ** 2
    if weights > MAX_SCORE_WEIGHTS:
        raise TooLongError(
            f"scoring keeps {layers} layers x {batch} sequences x {n_head} heads x "
            f"{2 * length} x {2 * length} = {weights:,} attention weights; the limit is "
            f"{MAX_SCORE_WEIGHTS:,} (lower length or batch)"
        )
    logits = batch * 2 * length * (getattr(service.model.config, "vocab_size", None) or 0)
    if logits > MAX_LENS_LOGITS:
        raise TooLongError(
            f"scoring computes {batch} x {2 * length} positions x the vocabulary = {logits:,} "
            f"logits; the limit is {MAX_LENS_LOGITS:,} (lower length or batch)"
        )
    return _run(service, scores, service.model, kind, length=length, batch=batch, seed=seed)
