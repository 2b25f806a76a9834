"""Log-likelihoods of continuations, computed the way lm-evaluation-harness's Hugging Face backend
computes them, and fast.

**Tokens.** A context and a continuation are tokenized as lm-evaluation-harness does
(``_encode_pair``): spaces ending the context move to the start of the continuation; the
context is ``encode(context)`` and the continuation is what ``encode(context + continuation)``
holds after as many tokens (so a merge across the boundary is scored as the whole text
tokenizes). An empty context is the BOS token (else EOS). Encoding adds what the tokenizer adds
by default (BOS where its file says so), as ``transformers`` does.

**Scores.** The log-likelihood of a continuation is the sum of its tokens' log-probabilities
(float32 log-softmax) after the context; it is *greedy* when every token is the argmax.

**Speed** (:func:`loglikelihoods`): the context runs once and all continuations go on from its
KV cache: a batch of examples is left-padded into one prefill (the attention mask keeps each
row's positions its own), the cache's rows are repeated once per continuation, and the
continuations run as one more forward. Examples are taken longest first (memory problems show at
once), in batches of ``batch_size``. A model without that cache protocol (an RNN) is scored by
:func:`loglikelihoods_full`, one forward of context + continuation per row; that is also the
reference the fast path is tested against.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnlm.base.device import model_device
from attnlm.base.errors import InputError
from attnlm.tokenizers.base import special_encoder

#: logits held at once by the continuation forward: rows x positions x vocabulary (floats)
LOGIT_BUDGET = 48 * 1024 * 1024


@dataclass(frozen=True)
class Request:
    """Token ids of one context and of the continuations scored after it."""

    context: tuple[int, ...]
    continuations: tuple[tuple[int, ...], ...]


def encoder(tok: Any) -> Callable[[str], list[int]]:
    """``text -> ids`` with the tokenizer's default special tokens (BOS where it adds one)."""
    return special_encoder(tok)


def prefix_id(tok: Any) -> int | None:
    """The token an empty context stands for: BOS, else EOS (lm-evaluation-harness's rule)."""
    for name in ("bos_id", "eos_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int):
            return value
    return None


def encode_request(
    encode: Callable[[str], list[int]], context: str, continuations: Sequence[str],
    prefix: int | None,
) -> Request:  # fmt: skip
    """The :class:`Request` of one prompt (see the module docstring)."""
    if context == "":
        if prefix is None:
            raise InputError("an empty context needs a BOS or EOS token; this tokenizer has none")
        conts = []
        for c in continuations:
            ids = encode(c)
            conts.append(ids[1:] if ids and ids[0] == prefix else ids)
        return Request((prefix,), tuple(tuple(c) for c in conts))
    spaces = len(context) - len(context.rstrip())
    head, moved = (context[:-spaces], context[-spaces:]) if spaces else (context, "")
    ctx = encode(head) if head else []
    if not ctx:  # a context of spaces only
        return encode_request(encode, "", [moved + c for c in continuations], prefix)
    conts = tuple(tuple(encode(head + moved + c)[len(ctx) :]) for c in continuations)
    return Request(tuple(ctx), conts)


def check_requests(requests: Sequence[Request], max_len: int | None) -> list[Request]:
    """Refuse an empty continuation; keep the last tokens of a context too long for the model
    (lm-evaluation-harness truncates on the left too)."""
    out = []
    for i, r in enumerate(requests):
        if any(not c for c in r.continuations):
            raise InputError(f"example {i + 1}: a continuation tokenizes to nothing")
        longest = max(len(c) for c in r.continuations)
        if max_len is not None and len(r.context) + longest - 1 > max_len:
            keep = max_len + 1 - longest
            if keep < 1:
                raise InputError(f"example {i + 1}: a continuation of {longest} tokens is longer "
                                 f"than the model's {max_len} positions")  # fmt: skip
            r = Request(r.context[-keep:], r.continuations)
        out.append(r)
    return out


Scores = list[list[tuple[float, bool]]]  # per request, per continuation: (log-likelihood, greedy)


def takes_cache(model: Any) -> bool:
    """Whether the model's forward continues a KV cache under an attention mask (a decoder)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "cache" in params and "attention_mask" in params and hasattr(model, "new_state")


def loglikelihoods(
    model: Any,
    requests: Sequence[Request],
    batch_size: int = 16,
    on_done: Callable[[int], None] | None = None,
    max_len: int | None = None,
) -> Scores:
    """``(log-likelihood, greedy)`` of every continuation of every request (see the module
    docstring); ``on_done(n)`` after each batch of ``n`` requests. ``max_len``: the model's
    positions (each request fits already, :func:`check_requests`; batches are cut to fit)."""
    if not takes_cache(model):
        return loglikelihoods_full(model, requests, batch_size, on_done)
    out: Scores = [[] for _ in requests]
    with torch.inference_mode():
        for batch in _batches(requests, batch_size, max_len):
            for i, scores in zip(batch, _cached_batch(model, [requests[i] for i in batch])):
                out[i] = scores
            if on_done is not None:
                on_done(len(batch))
    return out


def _batches(requests: Sequence[Request], size: int, max_len: int | None) -> list[list[int]]:
    """Request indices in batches of at most ``size``, longest context first; a batch's padded
    length (its longest context and its longest continuation) stays within ``max_len``."""
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].context))
    batches: list[list[int]] = []
    width = longest = 0
    for i in order:
        r = requests[i]
        cont = max(len(c) for c in r.continuations)
        fits = max_len is None or width + max(longest, cont) - 1 <= max_len
        if batches and len(batches[-1]) < size and fits:
            batches[-1].append(i)
            longest = max(longest, cont)
        else:
            batches.append([i])
            width, longest = len(r.context), cont
    return batches


def _cached_batch(model: Any, reqs: Sequence[Request]) -> Scores:
    """One batch of the fast path: a left-padded prefill, then every continuation from it."""
    device = model_device(model)
    width = max(len(r.context) for r in reqs)
    ids = torch.zeros(len(reqs), width, dtype=torch.long)
    keep = torch.zeros(len(reqs), width, dtype=torch.bool)
    for b, r in enumerate(reqs):
        ids[b, width - len(r.context) :] = torch.tensor(r.context)
        keep[b, width - len(r.context) :] = True
    ids, keep = ids.to(device), keep.to(device)
    state = model.new_state()
    first = model(ids, cache=state, attention_mask=keep, last_only=True).logits[:, -1]
    first = first.float().log_softmax(-1)  # (B, V): the first token of every continuation
    rows = [(b, c) for b, r in enumerate(reqs) for c in r.continuations]
    done = {i: _score_row(first[b], None, c) for i, (b, c) in enumerate(rows) if len(c) == 1}
    # the longer ones by length, so that a chunk pads little; the last token is never an input
    longer = sorted((i for i, (_, c) in enumerate(rows) if len(c) > 1),
                    key=lambda i: -len(rows[i][1]))  # fmt: skip
    start = 0
    while start < len(longer):
        length = len(rows[longer[start]][1]) - 1  # the chunk's longest (the first)
        per_chunk = max(1, LOGIT_BUDGET // (length * first.shape[-1]))
        chunk = longer[start : start + per_chunk]
        scored = _continue(model, state, keep, first, [rows[i] for i in chunk], length, device)
        done.update(zip(chunk, scored, strict=True))
        start += len(chunk)
    result: Scores = [[] for _ in reqs]
    for i, (b, _) in enumerate(rows):
        result[b].append(done[i])
    return result


def _continue(model, state, keep, first, chunk, length, device) -> list[tuple[float, bool]]:
    """Continuations longer than one token, after their rows' contexts in ``state``."""
    index = torch.tensor([b for b, _ in chunk], device=device)
    rows_state = copy.copy(state)  # reorder assigns new lists: ``state`` is left as it was
    rows_state.reorder(index)
    inputs = torch.zeros(len(chunk), length, dtype=torch.long)
    for r, (_, c) in enumerate(chunk):
        inputs[r, : len(c) - 1] = torch.tensor(c[:-1])
    mask = torch.cat([keep.index_select(0, index), torch.ones(len(chunk), length,
                      dtype=torch.bool, device=device)], dim=1)  # fmt: skip
    logits = model(inputs.to(device), cache=rows_state, attention_mask=mask).logits
    logp = logits.float().log_softmax(-1)  # (R, length, V)
    return [_score_row(first[b], logp[r], c) for r, (b, c) in enumerate(chunk)]


def _score_row(first: torch.Tensor, rest: torch.Tensor | None, cont: Sequence[int]):
    """``(sum of log-probabilities, greedy)`` of ``cont``: its first token from ``first``
    ``(V,)``, the others from ``rest`` ``(>= len - 1, V)``."""
    dists = first[None] if rest is None else torch.cat([first[None], rest[: len(cont) - 1]])
    target = torch.tensor(cont, device=dists.device)
    picked = dists.gather(1, target[:, None])[:, 0]
    greedy = bool((dists.argmax(-1) == target).all())
    return float(picked.double().sum()), greedy


def loglikelihoods_full(
    model: Any,
    requests: Sequence[Request],
    batch_size: int = 16,
    on_done: Callable[[int], None] | None = None,
) -> Scores:
    """The same scores without a cache: one forward of ``context + continuation[:-1]`` per
    row, right-padded in batches (what lm-evaluation-harness runs)."""
    device = model_device(model)
    out: Scores = []
    with torch.inference_mode():
        for start in range(0, len(requests), batch_size):
            batch = requests[start : start + batch_size]
            rows = [(r.context, c) for r in batch for c in r.continuations]
            width = max(len(ctx) + len(c) - 1 for ctx, c in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            for i, (ctx, c) in enumerate(rows):
                seq = (ctx + c)[:-1]
                ids[i, : len(seq)] = torch.tensor(seq)
            logp = model(ids.to(device)).logits.float().log_softmax(-1)
            flat = [
                _score_row(logp[i, len(ctx) - 1], logp[i, len(ctx) :], c)
                for i, (ctx, c) in enumerate(rows)
            ]
            it = iter(flat)
            out += [[next(it) for _ in r.continuations] for r in batch]
            if on_done is not None:
                on_done(len(batch))
    return out
