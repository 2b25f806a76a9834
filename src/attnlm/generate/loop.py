"""Autoregressive decoding: greedy or sampled, with or without the decoding state (KV cache,
recurrent state), for every family that implements the decoding-state protocol:

* ``model.new_state(batch)`` -> state (``batch``: what the decoder conditions on, e.g. the
  source sentences of a translation model; None for a language model);
* ``model.step(tokens (B, n), state)`` -> logits ``(B, n, V)``, feeding new tokens;
* ``state.reorder(indices)`` (beam search), ``state.length`` and ``state.trim(n)`` (sliding
  window) where the family has a window.

A model without ``new_state`` is decoded by recomputing ``model(ids=...)`` on the context.
How tokens are picked is one :class:`~attnlm.generate.sampling.SamplingConfig`.

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

The loop keeps tokens on the device: without a callback or an end-of-sequence id it never
waits for the device inside the loop; with them it copies the step's new tokens once per step
(not once per row). Token buffers grow in chunks, so a large ``max_new_tokens`` allocates
nothing up front.

Shapes: ``B`` rows, ``T`` tokens, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnlm.device import eval_mode, model_device
from attnlm.errors import InputError
from attnlm.generate.filters import apply_filters, sampling_filters
from attnlm.generate.sampling import SamplingConfig, sampling_from
from attnlm.nn.layout import decoding_layout

BUFFER_CHUNK = 1024  # token buffer growth step (positions)

# on_token(row, token_id) -> True to stop that row early (e.g. a stop string appeared).
TokenCallback = Callable[[int, int], bool]


def _window(model: torch.nn.Module) -> tuple[int | None, bool]:
    """The model's window (``config.block_size``, None when it has none or the model sets
    ``unbounded_context = True``, as recurrent models do: their state carries any length)
    and whether the state may slide past it (relative or no positions) instead of
    recomputing."""
    if getattr(model, "unbounded_context", False):
        return None, True
    cfg = getattr(model, "config", None)
    block = getattr(cfg, "block_size", None)
    if block is None:
        return None, True
    return int(block), bool(getattr(model, "slides_past_window", False))


class _Context:
    """Feeds the model the tokens it has not seen yet and returns next-token logits (B, V).

    ``total``: the positions the decode will reach; with ``static`` and a family whose
    ``new_state`` takes ``max_len`` (``static_state = True``), the state's buffers are
    allocated once for them (at most the window). ``compiled``: a
    :class:`~attnlm.generate.compiled.CompiledStep` that runs every one-token step after the
    prompt while the whole decode fits in the window."""

    def __init__(
        self,
        model: torch.nn.Module,
        use_cache: bool,
        state_batch: dict[str, Any] | None,
        total: int = 0,
        static: bool = False,
        compiled: Any = None,
    ) -> None:
        self.model = model
        self.block, self.sliding = _window(model)
        self.state_batch = state_batch
        self.use_cache = use_cache and hasattr(model, "new_state")
        if state_batch is not None and not self.use_cache:
            raise InputError("decoding with a source needs the model's decoding state")
        self.max_len = None
        if static and getattr(model, "static_state", False) and total > 0:
            self.max_len = total if self.block is None else min(total, self.block)
        self.compiled = None
        if compiled is not None and self.max_len is not None and compiled.fits(model, total):
            self.compiled = compiled
            self.max_len = compiled.buffer_length(model, total)
        self.state = self._new_state() if self.use_cache else None
        self.fed = 0  # positions already in the state (absolute count)

    def _new_state(self) -> Any:
        if self.compiled is not None:
            return self.compiled.state(self.state_batch, self.max_len)
        if self.max_len is not None:
            return self.model.new_state(self.state_batch, max_len=self.max_len)
        return self.model.new_state(self.state_batch)

    def logits(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits for position ``pos`` given ``tokens[:, :pos]`` (B, pos)."""
        block = self.block
        if self.state is None or (block is not None and pos > block and not self.sliding):
            start = 0 if block is None else max(0, pos - block)
            return self.model(ids=tokens[:, start:pos]).logits[:, -1]
        new = tokens[:, self.fed : pos]  # (B, n)
        n = new.size(1)
        if block is not None and n >= block:  # (re)start from the last window
            self.state = self._new_state()
            new = new[:, -block:]
        elif block is not None and self.state.length + n > block:
            self.state.trim(block - n)
        if self.compiled is not None and n == 1 and self.compiled.ready(self.state):
            logits = self.compiled(new, self.state)  # after the prompt: one graph per step
        else:
            if getattr(self.state, "fixed", False):
                self.state.unfix()  # an uncompiled call reads and writes the prefix
            logits = self.model.step(new, self.state)
        self.fed = pos
        return logits[:, -1]


def pick(
    logits: torch.Tensor, specs: list, greedy: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """Next token per row from logits ``(B, V)``: argmax, or a sample after the filters."""
    if greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(apply_filters(logits.float(), specs), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _grow(t: torch.Tensor, need: int, total: int) -> torch.Tensor:
    """``t`` (B, cap) widened to at least ``need`` positions (by chunks, at most ``total``)."""
    if t.size(1) >= need:
        return t
    cap = min(total, max(need, t.size(1) + BUFFER_CHUNK))
    pad = torch.zeros(t.size(0), cap - t.size(1), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=1)


@torch.inference_mode()
def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_token: TokenCallback | None = None,
    lookahead: int = 8,
    *,
    sampling: SamplingConfig | None = None,
    eos_id: int | None = None,
    state_batch: dict[str, Any] | None = None,
    process: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None,
    static: bool = True,
    compile: bool | Any = False,
) -> list[list[int]]:
    """Continue each prompt (a list of ids, lengths may differ) by up to ``max_new_tokens``.

    Returns the new ids of each row (without its prompt). ``sampling`` says how tokens are
    picked; ``max_new_tokens``, ``temperature``, ``top_k`` and ``top_p`` override its fields
    (``temperature == 0`` is greedy). ``on_token(row, id)`` is called for every new token in
    order; returning True ends that row. ``eos_id`` ends a row after that token (which is
    returned). ``state_batch`` is what the decoder conditions on (``model.new_state``).
    ``process(logits (B, V), length, max_length) -> logits`` edits each step's logits before
    the pick (``DecodingSetup.process``: a family's logits processors).
    ``lookahead``: greedy decoding of a single prompt that fits the window checks up to this
    many draft tokens per forward pass (:mod:`attnlm.generate.lookahead`; same tokens, fewer
    passes); 0 turns it off.
    ``static``: families with a static decoding state (``gpt``, ``transformer``) decode into
    key/value buffers allocated once and written in place (:mod:`attnlm.nn.static_cache`;
    the same tokens as the growing cache, tested); False uses the growing cache.
    ``compile``: run every one-token step after the prompt through one
    ``torch.compile(fullgraph=True)`` graph (:mod:`attnlm.generate.compiled`; on CUDA, CUDA
    graphs), compiled once per model, batch size and buffer length (and, decoding from a
    ``state_batch``, source length bucket) and reused by later calls; a
    :class:`~attnlm.generate.compiled.CompiledStep` may be passed instead of True. It applies
    to greedy and sampled decoding without drafts (``lookahead`` is not used) while prompt +
    new tokens fit in the window; other decodes run uncompiled. Families: ``gpt``,
    ``transformer`` (:func:`~attnlm.generate.compiled.has_compiled_step`).
    """
    sampling = sampling_from(
        sampling, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p
    )
    n_new = sampling.max_new_tokens
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt needs at least one token")
    greedy = sampling.greedy
    specs = [] if greedy else sampling_filters(sampling.temperature, sampling.top_k, sampling.top_p)
    if generator is None and sampling.seed is not None and not greedy:
        generator = torch.Generator(device=model_device(model)).manual_seed(sampling.seed)
    decoding_layout(model)  # one-row products stream column-major weights faster (CPU)
    compiled = _compiled_step(model, compile) if compile else None
    if (
        compiled is None
        and state_batch is None
        and eos_id is None
        and process is None
        and _can_look_ahead(model, prompts, n_new, greedy, use_cache, lookahead)
    ):
        return [_lookahead(model, prompts[0], n_new, lookahead, on_token)]
    device = model_device(model)
    B = len(prompts)
    lens = [len(p) for p in prompts]
    total = max(lens) + n_new
    cap = min(total, max(lens) + BUFFER_CHUNK)
    tokens = torch.zeros(B, cap, dtype=torch.long, device=device)  # (B, cap)
    known = torch.zeros(B, cap, dtype=torch.bool, device=device)
    for r, p in enumerate(prompts):
        tokens[r, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        known[r, : len(p)] = True
    lens_t = torch.tensor(lens, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)  # ended by eos
    ends = lens_t + n_new  # (B,) position after each row's last new token
    stopped = [False] * B  # ended by the callback
    seen = [0] * B  # new tokens the callback has seen per row (kept when it stops the row)
    watch = on_token is not None or eos_id is not None
    with eval_mode(model):
        ctx = _Context(model, use_cache, state_batch, total, static, compiled)
        pos = min(lens)
        while pos < total and n_new > 0:
            if pos >= tokens.size(1):
                tokens, known = _grow(tokens, pos + 1, total), _grow(known, pos + 1, total)
            logits = ctx.logits(tokens[:, :pos], pos)  # (B, V)
            if process is not None:
                logits = process(logits, pos, total)
            nxt = pick(logits, specs, greedy, generator)  # (B,)
            tokens[:, pos] = torch.where(known[:, pos], tokens[:, pos], nxt)
            if watch:
                generating = (pos >= lens_t) & (pos < ends) & ~finished
                row_tokens, row_active = nxt.tolist(), generating.tolist()  # one copy a step
                for r in range(B):
                    if not row_active[r] or stopped[r]:
                        continue
                    seen[r] += 1
                    if on_token is not None and on_token(r, row_tokens[r]):
                        stopped[r] = True
                if eos_id is not None:
                    finished |= generating & (nxt == eos_id)
                done = [finished_r or stopped_r for finished_r, stopped_r in
                        zip(finished.tolist(), stopped)]  # fmt: skip
                if all(done[r] or pos + 1 >= ends_r for r, ends_r in enumerate(ends.tolist())):
                    pos += 1
                    break
            pos += 1
    out = []
    for r, row in enumerate(tokens[:, :pos].tolist()):
        new = row[lens[r] : lens[r] + n_new]
        if stopped[r]:  # up to and including the token on which the callback stopped it
            new = new[: seen[r]]
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
        out.append(new)
    return out


def _compiled_step(model: torch.nn.Module, compile: Any) -> Any:
    from attnlm.generate.compiled import CompiledStep, compiled_step

    return compile if isinstance(compile, CompiledStep) else compiled_step(model)


def _can_look_ahead(model, prompts, max_new_tokens, greedy, use_cache, lookahead) -> bool:
    block, _ = _window(model)
    return (
        greedy
        and use_cache
        and lookahead > 0
        and max_new_tokens > 0
        and len(prompts) == 1
        and block is not None
        and hasattr(model, "new_cache")
        and len(prompts[0]) + max_new_tokens <= block
    )


def _lookahead(model, prompt, max_new_tokens, lookahead, on_token) -> list[int]:
    from attnlm.generate.lookahead import greedy_lookahead

    with eval_mode(model):
        callback = (lambda tok: on_token(0, tok)) if on_token else None
        return greedy_lookahead(model, prompt, max_new_tokens, lookahead, callback)


def generate(
    model: torch.nn.Module,
    ids: torch.Tensor,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    lookahead: int = 8,
    *,
    sampling: SamplingConfig | None = None,
    static: bool = True,
    compile: bool | Any = False,
) -> torch.Tensor:
    """Extend a batch of equal-length prompts ``ids`` (B, T) to (B, T + max_new_tokens).

    ``temperature=0`` is greedy; ``top_k``/``top_p`` filter the sampling distribution (or
    pass a whole ``sampling`` config). Pass a seeded ``generator`` (on the model's device) for
    reproducible samples; otherwise ``sampling.seed`` or torch's global RNG is used.
    ``static`` and ``compile``: see :func:`decode`.
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
        sampling=sampling,
        static=static,
        compile=compile,
    )
    tail = torch.tensor(new, dtype=torch.long, device=ids.device).view(ids.size(0), -1)
    return torch.cat([ids, tail], dim=1)
