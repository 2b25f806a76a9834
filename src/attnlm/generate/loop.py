"""Autoregressive decoding: greedy or sampled, with or without the KV cache.

One loop serves every case. Prompts of different lengths share a batch the way Meta's LLaMA
reference decoder does it: all rows advance one position per step from the shortest prompt
on; while a row is still inside its prompt, the prompt's token replaces the sampled one. Each
row's computation is causal and independent of the others, so a batch gives the same tokens as
decoding the prompts one at a time (tested), with no padding mask.

With the KV cache (``use_cache=True``) the model sees only the new token(s) each step and
reuses the keys and values of earlier positions; without it, the whole (cropped) context is
recomputed. Both give identical tokens (tested).

Contexts longer than the model's window (``config.block_size``):

- learned positions (and any absolute scheme the model cannot extend): the context is cropped
  to the last ``block_size`` tokens and recomputed each step, exactly as without the cache;
- relative schemes (``rope``, ``alibi``) and ``none``/``sinusoidal``: a sliding window; the
  cache drops its oldest entries (``KVCache.trim``) so it never holds more than ``block_size``.

Shapes: ``B`` rows, ``T`` tokens, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnlm.errors import ConfigError, InputError
from attnlm.generate.filters import apply_filters, sampling_filters

SLIDING_POSITIONS = {"rope", "alibi", "none", "sinusoidal"}

# on_token(row, token_id) -> True to stop that row early (e.g. a stop string appeared).
TokenCallback = Callable[[int, int], bool]


def _model_config(model: torch.nn.Module) -> Any:
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "block_size"):
        raise ConfigError("generate() needs a model with a .config that has block_size")
    return cfg


class _Context:
    """Feeds the model the tokens it has not seen yet and returns next-token logits (B, V)."""

    def __init__(self, model: torch.nn.Module, use_cache: bool) -> None:
        cfg = _model_config(model)
        self.model = model
        self.block = int(cfg.block_size)
        self.sliding = getattr(cfg, "positions", "learned") in SLIDING_POSITIONS
        self.use_cache = use_cache and hasattr(model, "new_cache")
        self.cache = model.new_cache() if self.use_cache else None
        self.fed = 0  # positions already in the cache (absolute count)

    def logits(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits for position ``pos`` given ``tokens[:, :pos]`` (B, pos)."""
        block = self.block
        if self.cache is None or (pos > block and not self.sliding):
            return self.model(tokens[:, max(0, pos - block) : pos]).logits[:, -1]
        new = tokens[:, self.fed : pos]  # (B, n)
        n = new.size(1)
        if n >= block:  # (re)start from the last window
            self.cache = self.model.new_cache()
            new = new[:, -block:]
        elif self.cache.length + n > block:
            self.cache.trim(block - n)
        out = self.model(new, cache=self.cache)
        self.fed = pos
        return out.logits[:, -1]


def _pick(logits: torch.Tensor, specs: list, greedy: bool, generator: torch.Generator | None):
    if greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(apply_filters(logits.float(), specs), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_token: TokenCallback | None = None,
    lookahead: int = 8,
) -> list[list[int]]:
    """Continue each prompt (a list of ids, lengths may differ) by up to ``max_new_tokens``.

    Returns the new ids of each row (without its prompt). ``temperature == 0`` is greedy.
    ``on_token(row, id)`` is called for every new token in order; returning True ends that row.
    ``lookahead``: greedy decoding of a single prompt that fits the window checks up to this
    many draft tokens per forward pass (:mod:`attnlm.generate.lookahead`; same tokens, fewer
    passes); 0 turns it off.
    """
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt needs at least one token")
    greedy = temperature == 0
    specs = [] if greedy else sampling_filters(temperature, top_k, top_p)
    if _can_look_ahead(model, prompts, max_new_tokens, greedy, use_cache, lookahead):
        return [_lookahead(model, prompts[0], max_new_tokens, lookahead, on_token)]
    device = next(model.parameters()).device
    lens = [len(p) for p in prompts]
    total = max(lens) + max_new_tokens
    tokens = torch.zeros(len(prompts), total, dtype=torch.long, device=device)  # (B, total)
    known = torch.zeros(len(prompts), total, dtype=torch.bool, device=device)
    for r, p in enumerate(prompts):
        tokens[r, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        known[r, : len(p)] = True
    out: list[list[int]] = [[] for _ in prompts]
    active = [max_new_tokens > 0 for _ in prompts]
    was_training = model.training
    model.eval()
    try:
        ctx = _Context(model, use_cache)
        pos = min(lens)
        while any(active) and pos < total:
            nxt = _pick(ctx.logits(tokens, pos), specs, greedy, generator)  # (B,)
            tokens[:, pos] = torch.where(known[:, pos], tokens[:, pos], nxt)
            for r in range(len(prompts)):
                if not active[r] or pos < lens[r]:
                    continue
                tok = int(nxt[r])
                out[r].append(tok)
                stop = on_token(r, tok) if on_token else False
                if stop or len(out[r]) >= max_new_tokens:
                    active[r] = False
            pos += 1
    finally:
        model.train(was_training)
    return out


def _can_look_ahead(model, prompts, max_new_tokens, greedy, use_cache, lookahead) -> bool:
    block = _model_config(model).block_size
    return (
        greedy
        and use_cache
        and lookahead > 0
        and max_new_tokens > 0
        and len(prompts) == 1
        and hasattr(model, "new_cache")
        and len(prompts[0]) + max_new_tokens <= block
    )


def _lookahead(model, prompt, max_new_tokens, lookahead, on_token) -> list[int]:
    from attnlm.generate.lookahead import greedy_lookahead

    was_training = model.training
    model.eval()
    try:
        callback = (lambda tok: on_token(0, tok)) if on_token else None
        return greedy_lookahead(model, prompt, max_new_tokens, lookahead, callback)
    finally:
        model.train(was_training)


def generate(
    model: torch.nn.Module,
    ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    lookahead: int = 8,
) -> torch.Tensor:
    """Extend a batch of equal-length prompts ``ids`` (B, T) to (B, T + max_new_tokens).

    This is what ``GPT.generate`` calls. ``temperature=0`` is greedy; ``top_k``/``top_p`` filter
    the sampling distribution. Pass a seeded ``generator`` (on the model's device) for
    reproducible samples; otherwise torch's global RNG is used.
    """
    if ids.dim() != 2:
        raise InputError(f"ids must have shape (B, T), got {tuple(ids.shape)}")
    new = decode(
        model,
        ids.tolist(),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        use_cache=use_cache,
        generator=generator,
        lookahead=lookahead,
    )
    tail = torch.tensor(new, dtype=torch.long, device=ids.device).view(ids.size(0), -1)
    return torch.cat([ids, tail], dim=1)
