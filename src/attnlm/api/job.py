"""One sequence the server decodes (one choice of a request): how its tokens are picked
(:class:`Params`: greedy or sampled, logit bias, presence and frequency penalties, a grammar's
mask), where it ends (an end-of-turn id, a stop string, ``max_tokens``, the grammar's end, the
window, the request's deadline) and what it reports as it goes (text pieces, log
probabilities) to the request that owns it (:class:`Request`, read by the HTTP side).

The scheduler thread calls :meth:`Job.take` with each next-token logits row; the HTTP side
reads :class:`Request`'s event queue on its own event loop (events are handed over with
``loop.call_soon_threadsafe``)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from attnlm.generate.filters import apply_filters, sampling_filters
from attnlm.generate.text import _RowText


@dataclass(frozen=True)
class Params:
    """How one choice is decoded. ``temperature == 0``: greedy. ``logprobs``: None (off) or
    how many alternatives to report per token (0: the chosen token's alone). ``grammar``: an
    llguidance grammar (:mod:`attnlm.api.grammar`) the text must follow, or None."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    grammar: Any = None


class Request:
    """What one HTTP request asked for: its choices (:class:`Job`), its deadline, whether
    the client went away (``cancelled``), and the events of its choices in an asyncio queue:
    ``("token", index, piece, logprob)`` and ``("end", index, finish_reason, n_tokens)``."""

    def __init__(self, prompt: list[int], params: list[Params], context: Any, deadline: float):
        self.prompt = prompt
        self.deadline = deadline
        self.cancelled = False
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.jobs = [Job(self, i, p, context) for i, p in enumerate(params)]
        self.lock = threading.Lock()

    def emit(self, event: tuple) -> None:
        """Hand an event to the HTTP side (any thread)."""
        if not self.cancelled:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Context:
    """What every job of a model shares: its tokenizer, end ids, the ids past the tokenizer's
    (never picked) and the grammar compiler."""

    tokenizer: Any
    stop_ids: frozenset[int]
    vocab_limit: int | None = None
    grammars: Any = None


@dataclass
class Job:
    request: Request
    index: int
    params: Params
    context: Context
    ids: list[int] = field(default_factory=list)
    finish: str | None = None
    reused: int = 0  # prompt ids its slot's cache already held (set when it is placed)

    def __post_init__(self) -> None:
        p = self.params
        self.row = _RowText(self.context.tokenizer, p.stop, context=self.request.prompt)
        self.counts: dict[int, int] = {}
        self.generator = None
        if p.temperature > 0 and p.seed is not None:
            self.generator = torch.Generator().manual_seed(p.seed + self.index)
        self.specs = [] if p.temperature == 0 else sampling_filters(p.temperature, None, p.top_p)
        self.matcher = None if p.grammar is None else self.context.grammars.matcher(p.grammar)

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt

    def _processed(self, logits: torch.Tensor) -> torch.Tensor:
        """The row's logits ``(V,)`` in float32 after the vocabulary limit, the bias, the
        penalties and the grammar's mask."""
        x = logits.float().clone()
        ctx, p = self.context, self.params
        if ctx.vocab_limit is not None:
            x[ctx.vocab_limit :] = float("-inf")
        for tok, bias in p.logit_bias:
            if tok < x.numel():
                x[tok] += bias
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = torch.tensor(list(self.counts))
            n = torch.tensor([self.counts[i] for i in self.counts], dtype=torch.float32)
            x[ids] -= p.presence_penalty + p.frequency_penalty * n
        if self.matcher is not None:
            x = self.context.grammars.mask(self.matcher, x)
        return x

    def _logprob(self, logprobs: torch.Tensor, tok: int) -> dict[str, Any]:
        tops = []
        k = self.params.logprobs or 0
        if k > 0:
            vals, idx = torch.topk(logprobs, min(k, logprobs.numel()))
            tops = [(int(i), float(v)) for v, i in zip(vals.tolist(), idx.tolist())]
        return {"id": tok, "logprob": float(logprobs[tok]), "top": tops}

    def take(self, logits: torch.Tensor, now: float | None = None) -> bool:
        """Pick the next token from ``logits`` ``(V,)``, report it; True when the job ended
        (``finish`` says why)."""
        p = self.params
        if p.max_tokens <= 0:  # max_tokens 0: the prompt alone (its usage)
            return self.end("length")
        x = self._processed(logits)
        if p.temperature == 0:
            tok = int(torch.argmax(x))
        else:
            probs = torch.softmax(apply_filters(x[None], self.specs), dim=-1)
            tok = int(torch.multinomial(probs, 1, generator=self.generator)[0, 0])
        lp = None
        if p.logprobs is not None:
            lp = self._logprob(torch.log_softmax(x, dim=-1), tok)
        if self.matcher is not None:
            self.context.grammars.consume(self.matcher, tok)
        if tok in self.context.stop_ids:
            return self.end("stop")
        self.ids.append(tok)
        self.counts[tok] = self.counts.get(tok, 0) + 1
        piece, stopped = self.row.push(tok)
        self.request.emit(("token", self.index, piece, lp))
        if stopped:
            return self.end("stop")
        if self.matcher is not None and self.matcher.is_stopped():
            return self.end("stop")
        if len(self.ids) >= p.max_tokens:
            return self.end("length")
        if (now or time.monotonic()) > self.request.deadline:
            return self.end("length")
        return False

    def end(self, finish: str) -> bool:
        """End the job (``finish``: ``stop`` or ``length``), sending the held text."""
        self.finish = finish
        rest = self.row.flush()
        if rest:
            self.request.emit(("token", self.index, rest, None))
        self.request.emit(("end", self.index, finish, len(self.ids)))
        return True

    def text(self) -> str:
        return self.row.text()
