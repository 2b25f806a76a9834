"""Decoding with an :class:`~attnlm.runtime.engine.Engine` (the C decode step without PyTorch):
:func:`decode` keeps :func:`attnlm.generate.decode`'s contract (new token ids per prompt,
``on_token(row, id) -> True`` ends a row, greedy with lookahead drafts for one prompt), with
the logits filters and the draw in numpy.

Greedy decoding gives the PyTorch path's tokens (tested). Sampling follows the same filters
(:mod:`attnlm.generate.filters`: temperature, then top-k, then top-p) and draws each token by
inverting the distribution's cumulative sum at a uniform number from numpy's generator seeded
with ``seed``: a seed gives the same text every time on this path, not the PyTorch path's text
(whose draws come from PyTorch's generator).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from attnlm.generate.lookahead import lookahead_loop
from attnlm.generate.sampling import SamplingConfig, mask_from
from attnlm.runtime.engine import MAX_TOKENS, Engine

TokenCallback = Callable[[int, int], bool]


def applies(engine: Engine, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> bool:
    """Whether :func:`decode` takes these prompts: one length (the engine's rows advance
    together) and room for every new token in the model's window (no sliding here)."""
    lengths = {len(p) for p in prompts}
    total = max(lengths) + sampling.max_new_tokens
    return len(lengths) == 1 and min(lengths) > 0 and total <= engine.config.block_size


def decode(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    on_token: TokenCallback | None = None,
    lookahead: int = 8,
    vocab_limit: int | None = None,
) -> list[list[int]]:
    """New token ids for each prompt (see the module docstring and :func:`applies`);
    ``vocab_limit``: ids from there on are never picked (no drafts then, as the PyTorch loop
    with a logits processor)."""
    n_new, rows = sampling.max_new_tokens, len(prompts)
    if n_new == 0:
        return [[] for _ in prompts]
    engine.reset(rows, room=len(prompts[0]) + n_new + (lookahead if rows == 1 else 0))
    if sampling.greedy and rows == 1 and lookahead > 0 and vocab_limit is None:
        callback = (lambda tok: on_token(0, tok)) if on_token else None

        def feed(tokens: list[int], every: bool) -> list[int]:
            return _argmax(_feed(engine, np.array([tokens]), last_only=not every)[0]).tolist()

        return [lookahead_loop(feed, engine.drop_newest, prompts[0], n_new, lookahead,
                               callback)]  # fmt: skip
    rng = np.random.default_rng(sampling.seed)
    logits = _feed(engine, np.array(prompts), last_only=True)[:, -1]  # (B, V)
    out: list[list[int]] = [[] for _ in range(rows)]
    ended = [False] * rows
    while True:
        if vocab_limit is not None:
            logits = mask_from(logits, vocab_limit)
        nxt = pick(logits, sampling, rng)
        for r, token in enumerate(nxt.tolist()):
            if not ended[r]:
                out[r].append(token)
                ended[r] = bool(on_token and on_token(r, token)) or len(out[r]) >= n_new
        if all(ended):
            return out
        logits = engine.feed(nxt[:, None])[:, -1]


def _feed(engine: Engine, tokens: np.ndarray, last_only: bool) -> np.ndarray:
    """``engine.feed`` over any number of tokens, :data:`MAX_TOKENS` per call (a prompt):
    logits ``(B, T, V)``, or ``(B, 1, V)`` of the last with ``last_only``."""
    pieces = [tokens[:, i : i + MAX_TOKENS] for i in range(0, tokens.shape[1], MAX_TOKENS)]
    # a prompt's pieces before its last fill the caches alone (no LM head: a pass over V C)
    # (the whole prompt's reach: LongRoPE's set is the one a forward over all of it takes)
    reach = engine.length + tokens.shape[1]
    out = [engine.feed(p, last_only, logits=not last_only or i == len(pieces) - 1, reach=reach)
           for i, p in enumerate(pieces)]  # fmt: skip
    return out[-1] if last_only else np.concatenate(out, axis=1)


def _argmax(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1)


def pick(logits: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row of ``logits`` ``(B, V)``: argmax, or a draw after the filters."""
    return _argmax(logits) if sampling.greedy else _sample(logits, sampling, rng)


def _sample(logits: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``logits`` ``(B, V)`` after the filters."""
    x = logits.astype(np.float32)
    t = sampling.temperature
    if t != 1.0:  # the largest first, as filters.temperature: a tiny t never makes inf - inf
        x = (x - x.max(axis=-1, keepdims=True)) / max(t, np.finfo(np.float32).tiny)
    if sampling.top_k is not None:
        k = min(sampling.top_k, x.shape[-1])
        kth = -np.partition(-x, k - 1, axis=-1)[:, k - 1 : k]  # the k-th largest (ties kept)
        x = np.where(x < kth, -np.inf, x)
    if sampling.top_p is not None and sampling.top_p != 1.0:
        order = np.argsort(-x, axis=-1, kind="stable")
        ranked = np.take_along_axis(x, order, axis=-1)
        probs = _softmax(ranked)
        before = np.cumsum(probs, axis=-1) - probs  # mass of the strictly more likely tokens
        drop = np.zeros_like(before, dtype=bool)
        np.put_along_axis(drop, order, before >= sampling.top_p, axis=-1)
        x = np.where(drop, -np.inf, x)
    cdf = np.cumsum(_softmax(x).astype(np.float64), axis=-1)  # (B, V)
    u = rng.random(len(x))[:, None] * cdf[:, -1:]
    picked = (cdf <= u).sum(axis=-1)  # the first index whose cumulative sum passes u
    return np.minimum(picked, x.shape[-1] - 1)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
