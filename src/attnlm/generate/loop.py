"""Autoregressive decoding: greedy or sampled, with or without the decoding state (KV cache,
recurrent state), for every family that implements the decoding-state protocol:

* ``model.new_state(batch)`` -> state (``batch``: what the decoder conditions on, e.g. the
  source sentences of a translation model; None for a language model);
* ``model.step(tokens (B, n), state)`` -> logits ``(B, n, V)``, feeding new tokens;
* ``state.reorder(indices)`` (beam search), ``state.length`` and ``state.trim(n)`` (sliding
  window) where the family has a window.

A model without ``new_state`` is decoded by recomputing ``model(ids=...)`` on the context.
How tokens are picked is one :class:`~attnlm.generate.sampling.SamplingConfig`.

What backend, state, window and drafts a decode uses is decided once, before the first step
(:func:`~attnlm.generate.plan.plan_decode`, from the family's
:class:`~attnlm.models.base.Decoding` record and :func:`attnlm.runtime.planner.runner_for`);
then one loop serves every case, every step through the backend's ``step``. Prompts of
different lengths share a batch the way Meta's LLaMA reference decoder does it: all rows
advance one position per step from the shortest prompt on; while a row is still inside its
prompt, the prompt's token replaces the sampled one. Each row's computation is causal and
independent of the others, so a batch gives the same tokens as decoding the prompts one at a
time (tested), with no padding mask.

With the KV cache (``use_cache=True``) the model sees only the new token(s) each step and
reuses the keys and values of earlier positions; without it, the whole (cropped) context is
recomputed. Both give identical tokens (tested).

Contexts longer than the model's window (``config.block_size``):

- learned positions: the context is cropped to the last ``block_size`` tokens and recomputed
  each step, exactly as without the cache;
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
from contextlib import nullcontext
from typing import Any

import torch

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.generate.filters import apply_filters, sampling_filters
from attnlm.generate.plan import NO_STATE, STATIC, DecodeOptions, Plan, plan_decode
from attnlm.generate.sampling import SamplingConfig, check_sampling

BUFFER_CHUNK = 1024  # token buffer growth step (positions)

# on_token(row, token_id) -> True to stop that row early (e.g. a stop string appeared).
TokenCallback = Callable[[int, int], bool]


class _Context:
    """Feeds the model the tokens it has not seen yet, as the :class:`Plan` says, and returns
    next-token logits (B, V)."""

    def __init__(self, model: torch.nn.Module, plan: Plan, state_batch: Any) -> None:
        self.model, self.plan, self.state_batch = model, plan, state_batch
        self.runner = plan.runner
        self.state = None if plan.state == NO_STATE else self._new_state()
        self.fed = 0  # positions already in the state (absolute count)

    def _new_state(self) -> Any:
        plan = self.plan
        if plan.step is not None:
            return plan.step.state(self.state_batch, plan.max_len)
        if plan.state == STATIC:
            return self.runner.new_state(self.state_batch, max_len=plan.max_len)
        return self.runner.new_state(self.state_batch)

    def logits(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits for position ``pos`` given ``tokens[:, :pos]`` (B, pos)."""
        window, step = self.plan.window, self.plan.step
        if self.state is None or (window is not None and pos > window and not self.plan.slide):
            start = 0 if window is None else max(0, pos - window)
            return self.model(ids=tokens[:, start:pos]).logits[:, -1]
        new = tokens[:, self.fed : pos]  # (B, n)
        n = new.size(1)
        if window is not None and n >= window:  # (re)start from the last window
            self.state = self._new_state()
            new = new[:, -window:]
        elif window is not None and self.state.length + n > window:
            self.state.trim(window - n)
        if step is not None and n == 1 and step.ready(self.state):
            logits = step(new, self.state)[:, -1]  # after the prompt: one graph per step
        else:
            if step is not None and self.state.fixed:
                self.state.unfix()  # an uncompiled call reads and writes the prefix
            logits = self.runner.last_logits(new, self.state)
        self.fed = pos
        return logits


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


class _Rows:
    """The tokens of a batch of prompts (B, cap), kept on the device and grown in chunks, and
    where each row ends: after ``n_new`` tokens, after ``eos_id``, or when ``on_token`` says.

    Without ``on_token`` and ``eos_id`` nothing is copied from the device inside the loop; with
    them each step's new tokens are copied once (not once per row)."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        n_new: int,
        device: torch.device,
        on_token: TokenCallback | None,
        eos_id: int | None,
    ) -> None:
        self.lens = [len(p) for p in prompts]
        self.n_new, self.on_token, self.eos_id = n_new, on_token, eos_id
        self.total = max(self.lens) + n_new  # positions the decode reaches
        B, cap = len(prompts), min(self.total, max(self.lens) + BUFFER_CHUNK)
        self.tokens = torch.zeros(B, cap, dtype=torch.long, device=device)  # (B, cap)
        self.known = torch.zeros(B, cap, dtype=torch.bool, device=device)  # prompt positions
        for r, p in enumerate(prompts):
            self.tokens[r, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
            self.known[r, : len(p)] = True
        self.lens_t = torch.tensor(self.lens, device=device)
        self.ends = self.lens_t + n_new  # (B,) position after each row's last new token
        self.finished = torch.zeros(B, dtype=torch.bool, device=device)  # ended by eos
        self.stopped = [False] * B  # ended by the callback
        self.seen = [0] * B  # new tokens the callback has seen per row

    def context(self, pos: int) -> torch.Tensor:
        """``tokens[:, :pos]`` (B, pos), the buffer grown first to hold position ``pos``."""
        if pos >= self.tokens.size(1):
            self.tokens = _grow(self.tokens, pos + 1, self.total)
            self.known = _grow(self.known, pos + 1, self.total)
        return self.tokens[:, :pos]

    def put(self, pos: int, nxt: torch.Tensor) -> bool:
        """Write the step's tokens ``nxt`` (B,) at ``pos`` (a row still inside its prompt keeps
        the prompt's token); True when every row has ended."""
        self.tokens[:, pos] = torch.where(self.known[:, pos], self.tokens[:, pos], nxt)
        if self.on_token is None and self.eos_id is None:
            return False
        generating = (pos >= self.lens_t) & (pos < self.ends) & ~self.finished
        row_tokens, row_active = nxt.tolist(), generating.tolist()  # one copy a step
        for r, token in enumerate(row_tokens):
            if not row_active[r] or self.stopped[r]:
                continue
            self.seen[r] += 1
            if self.on_token is not None and self.on_token(r, token):
                self.stopped[r] = True
        if self.eos_id is not None:
            self.finished |= generating & (nxt == self.eos_id)
        ended = [f or s for f, s in zip(self.finished.tolist(), self.stopped)]
        return all(e or pos + 1 >= end for e, end in zip(ended, self.ends.tolist()))

    def new_tokens(self, pos: int) -> list[list[int]]:
        """Each row's new tokens once the decode stopped at ``pos``: up to its end token (kept)
        or the token on which the callback stopped it (kept)."""
        out = []
        for r, row in enumerate(self.tokens[:, :pos].tolist()):
            new = row[self.lens[r] : self.lens[r] + self.n_new]
            if self.stopped[r]:
                new = new[: self.seen[r]]
            if self.eos_id is not None and self.eos_id in new:
                new = new[: new.index(self.eos_id) + 1]
            out.append(new)
        return out


@torch.inference_mode()
def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    generator: torch.Generator | None = None,
    on_token: TokenCallback | None = None,
    eos_id: int | None = None,
    state_batch: dict[str, Any] | None = None,
    process: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None,
) -> list[list[int]]:
    """Continue each prompt (a list of ids, lengths may differ); return the new ids of each row
    (without its prompt).

    ``sampling``: how tokens are picked and how many (``SamplingConfig()`` when None;
    ``temperature == 0`` is greedy); ``options``: how the decode runs
    (:class:`~attnlm.generate.plan.DecodeOptions`: cache, static state, compiled step,
    lookahead drafts, a draft model, the backend; the same tokens whatever they say).
    ``generator``: the random numbers of sampling (else one seeded by ``sampling.seed``, else
    torch's global one). ``on_token(row, id)`` is called for every new token in order;
    returning True ends that row. ``eos_id`` ends a row after that token (which is returned).
    ``state_batch`` is what the decoder conditions on (``model.new_state``).
    ``process(logits (B, V), length, max_length) -> logits`` edits each step's logits before
    the pick (``DecodingSetup.process``: a family's logits processors).
    """
    sampling = check_sampling(sampling)
    options = options or DecodeOptions()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt needs at least one token")
    n_new, greedy = sampling.max_new_tokens, sampling.greedy
    watched = eos_id is not None or process is not None
    plan = plan_decode(model, prompts, n_new, greedy, options,
                       conditioned=state_batch is not None, watched=watched)  # fmt: skip
    if plan.lookahead:
        return [_lookahead(plan.runner, prompts[0], n_new, plan.lookahead, on_token,
                           options.draft)]  # fmt: skip
    device = model_device(model)
    if generator is None and sampling.seed is not None and not greedy:
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
    rows = _Rows(prompts, n_new, device, on_token, eos_id)
    with eval_mode(model):
        pos = _loop(_Context(model, plan, state_batch), rows, sampling, generator, process)
    return rows.new_tokens(pos)


def _loop(ctx: _Context, rows: _Rows, sampling: SamplingConfig, generator, process) -> int:
    """One token per row and step until every row has ended; the position it stopped at."""
    greedy = sampling.greedy
    specs = [] if greedy else sampling_filters(sampling.temperature, sampling.top_k, sampling.top_p)
    pos = min(rows.lens)  # every row advances from the shortest prompt on
    while pos < rows.total and sampling.max_new_tokens > 0:
        logits = ctx.logits(rows.context(pos), pos)  # (B, V)
        if process is not None:
            logits = process(logits, pos, rows.total)
        nxt = pick(logits, specs, greedy, generator)  # (B,)
        ended = rows.put(pos, nxt)
        pos += 1
        if ended:
            break
    return pos


def _lookahead(runner, prompt, max_new_tokens, lookahead, on_token, draft) -> list[int]:
    from attnlm.generate.lookahead import greedy_lookahead
    from attnlm.generate.speculative import ModelDrafter

    propose = None if draft is None else ModelDrafter(draft)
    with eval_mode(runner.model), eval_mode(draft) if draft is not None else nullcontext():
        callback = (lambda tok: on_token(0, tok)) if on_token else None
        return greedy_lookahead(runner, prompt, max_new_tokens, lookahead, callback, propose)


def generate(
    model: torch.nn.Module,
    ids: torch.Tensor,
    sampling: SamplingConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend a batch of equal-length prompts ``ids`` (B, T) to (B, T + max_new_tokens):
    :func:`decode` on tensors (``sampling``, ``options`` and ``generator`` as there)."""
    if ids.dim() != 2:
        raise InputError(f"ids must have shape (B, T), got {tuple(ids.shape)}")
    new = decode(model, ids.tolist(), sampling, options, generator=generator)
    tail = torch.tensor(new, dtype=torch.long, device=ids.device).view(ids.size(0), -1)
    return torch.cat([ids, tail], dim=1)
