"""Greedy decoding with lookahead drafts from the context (prompt-lookup decoding).

Single-token decoding on a CPU is memory-bound: every step reads all weights to produce one
token. Prompt-lookup decoding (Saxena, 2023; a form of speculative decoding, Leviathan et al.,
2023) guesses the next few tokens by finding the most recent earlier occurrence of the last
n-gram in the context and copying what followed it; one forward pass over
``[next token] + draft`` then checks every guess at once (a small matrix product reads the
weights once for all of them). Draft tokens are kept while they equal the model's own argmax;
the KV cache entries of rejected ones are dropped. The output is the greedy output: the same
tokens as decoding one token at a time (tested), only fewer forward passes when text repeats.

Used by :func:`attnlm.generate.decode` for greedy decoding of one prompt with the KV cache while
prompt + new tokens fit in the model's window.

Shapes: ``T`` tokens fed in one call, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

MIN_NGRAM, MAX_NGRAM = 2, 4


def lookup_draft(seq: Sequence[int], k: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed an earlier occurrence of ``seq``'s last n-gram (the
    longest n first, ``MIN_NGRAM <= n <= max_ngram``): the latest occurrence followed by ``k``
    tokens, else the one followed by the most; empty when the n-gram never occurred before."""
    if k <= 0:
        return []
    n_seq = len(seq)
    for n in range(min(max_ngram, n_seq - 1), MIN_NGRAM - 1, -1):
        tail = list(seq[n_seq - n :])
        best: list[int] = []
        for start in range(n_seq - n - 1, -1, -1):
            if list(seq[start : start + n]) == tail:
                follow = list(seq[start + n : start + n + k])
                if len(follow) > len(best):
                    best = follow
                if len(best) == k:
                    break
        if best:
            return best
    return []


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids ``a`` and ``b`` share from the start."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def drop_newest(cache, n: int) -> None:
    """Remove the ``n`` most recent entries of a KV cache (undo rejected draft tokens)."""
    if n <= 0:
        return
    for i, (k, v) in enumerate(zip(cache.keys, cache.values)):
        if k is not None:
            cache.keys[i] = k[..., : k.shape[-2] - n, :]
            cache.values[i] = v[..., : v.shape[-2] - n, :]
    cache.position -= n


def greedy_lookahead(
    runner: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    lookahead: int,
    on_token: Callable[[int], bool] | None = None,
    propose: Callable[[list[int], int], list[int]] | None = None,
) -> list[int]:
    """Greedy continuation of one prompt by ``runner`` (a backend of :mod:`attnlm.runtime`
    over a causal decoder); ``on_token(id) -> True`` stops early; ``propose``: where the
    drafts come from (default: the context, :func:`lookup_draft`)."""
    import torch

    from attnlm.base.device import model_device

    device = model_device(runner.model)
    cache = runner.new_state()

    def feed(tokens: list[int], every: bool) -> list[int]:
        with torch.inference_mode():
            x = torch.tensor([tokens], device=device)
            logits = runner.step(x, cache, last_only=not every)[0]  # (T or 1, V)
        return torch.argmax(logits if every else logits[-1:], dim=-1).tolist()

    return lookahead_loop(feed, lambda n: drop_newest(cache, n), prompt, max_new_tokens,
                          lookahead, on_token, propose=propose)  # fmt: skip


def lookahead_loop(
    feed: Callable[[list[int], bool], list[int]],
    drop: Callable[[int], None],
    prompt: Sequence[int],
    max_new_tokens: int,
    lookahead: int,
    on_token: Callable[[int], bool] | None = None,
    first: int | None = None,
    propose: Callable[[list[int], int], list[int]] | None = None,
) -> list[int]:
    """The greedy loop with drafts over any model: ``feed(tokens, every)`` feeds tokens after
    what the model holds and returns the argmax after each of them (``every``) or after the
    last alone; ``drop(n)`` forgets the ``n`` newest positions. ``first``: the model already
    holds ``prompt`` and this is its argmax (a chat turn's prefill); otherwise the prompt is
    fed first. The model may hold a few positions past the last token returned (accepted
    drafts after the one that ended the loop). ``propose(seq, k)``: up to ``k`` guesses of the
    tokens after ``seq`` (default: :func:`lookup_draft`, copies from the context)."""
    propose = propose or lookup_draft
    seq = list(prompt)
    nxt = feed(seq, False)[-1] if first is None else first
    out: list[int] = []
    while True:
        out.append(nxt)
        if (on_token and on_token(nxt)) or len(out) >= max_new_tokens:
            return out
        draft = propose(seq + [nxt], min(lookahead, max_new_tokens - len(out)))
        fed = [nxt, *draft]
        preds = feed(fed, True)  # preds[j]: the token after fed[j]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == preds[accepted]:
            accepted += 1
        seq += fed[: 1 + accepted]
        for tok in draft[:accepted]:
            out.append(tok)
            if (on_token and on_token(tok)) or len(out) >= max_new_tokens:
                return out
        drop(len(draft) - accepted)
        nxt = preds[accepted]
