"""Chat with an instruction-tuned model: the conversation rendered by the model's chat
template, replies decoded token by token until the end-of-turn token, the KV cache kept from
one turn to the next.

Each turn renders the *whole* conversation with the template (so the prompt is exactly what
``transformers``' ``apply_chat_template`` would produce), encodes it, and compares the ids
with those already in the decoding state: only the suffix beyond the longest common prefix is
prefilled. Usually that is the end of the last reply and the new user turn; when the
re-encoded text differs from what the model generated (a reply that a tokenizer would split
differently, a template that trims whitespace or rewrites earlier turns), the state is cut
back to the common prefix first. A state that cannot be cut (after a sliding window dropped
its oldest entries, or a recurrent state) is rebuilt from the start. Either way the logits
equal those of decoding the rendered prompt from scratch (tested).

Shapes: ``T`` tokens, ``V`` vocabulary; one row (batch of 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnlm.base.errors import InputError
from attnlm.generate.lookahead import common_prefix as _common_prefix
from attnlm.generate.lookahead import drop_newest
from attnlm.generate.sampling import SamplingConfig, mask_from, token_limit
from attnlm.generate.stats import peak_rss_mb
from attnlm.generate.text import _RowText, encode_prompt
from attnlm.tokenizers import token_label
from attnlm.tokenizers.harmony import HarmonyStream, is_harmony, special_tokens_of, split_harmony


@dataclass
class ChatReply:
    """One assistant turn. ``finish``: ``"end of turn"`` (an EOS or end-of-turn id, not part of
    ``ids``), ``"stop string"``, ``"length"`` (``max_new_tokens``) or ``"window"`` (the model's
    context is full). ``prompt_tokens``: the rendered conversation's length; ``reused``: how
    many of them came from the cache, ``prefilled``: how many were fed this turn."""

    text: str
    ids: list[int]
    finish: str
    prompt_tokens: int
    reused: int
    prefilled: int
    prefill_s: float
    decode_s: float
    token_texts: list[str] = field(default_factory=list)  # each token's label (its bytes)
    backend: str | None = None  # the runtime backend that decoded it, and why
    backend_reason: str | None = None
    reasoning: str = ""  # a harmony reply's analysis channel (gpt-oss); text: its answer

    def to_json(self) -> dict[str, Any]:
        """The reply, its tokens and what it cost: the keys of ``generate --json``
        (``new_tokens``, ``prefill_seconds``, ``decode_tokens_per_second``, ``peak_rss_mb``)
        and ``timings`` (the same in the first form)."""
        n = len(self.ids)
        rate = round(n / self.decode_s, 3) if self.decode_s > 0 and n else None
        return {
            "reply": self.text,
            "reasoning": self.reasoning,
            "tokens": self.ids,
            "token_texts": self.token_texts,
            "finish": self.finish,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused,
            "prefilled_tokens": self.prefilled,
            "new_tokens": n,
            "prefill_seconds": round(self.prefill_s, 6),
            "decode_seconds": round(self.decode_s, 6),
            "decode_tokens_per_second": rate,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "timings": {
                "prefill_s": round(self.prefill_s, 6),
                "decode_s": round(self.decode_s, 6),
                "tokens_per_s": rate,
            },
        }


def _droppable(state: Any) -> bool:
    """Whether ``state`` is a plain KV cache, whose newest positions can be dropped."""
    from attnlm.nn.cache import KVCache

    return type(state) is KVCache and not getattr(state, "fixed", False)


def _cut(state: Any, n: int) -> bool:
    """Cut a KV cache back to its first ``n`` positions; False when it cannot be (a trimmed
    sliding window, or another kind of state)."""
    if not _droppable(state) or state.position != state.length:
        return False
    drop_newest(state, state.length - n)
    return True


class ChatSession:
    """A conversation with ``model``: ``template`` (a
    :class:`~attnlm.tokenizers.chat_template.ChatTemplate`) renders it, ``stop_ids`` end a
    reply, ``sampling`` picks tokens (greedy when ``temperature == 0``; ``stop`` strings and
    ``max_new_tokens`` apply to each reply). ``lookahead``: a greedy reply checks up to this many
    draft tokens copied from the conversation per forward pass (:mod:`attnlm.generate.lookahead`:
    the same reply, fewer passes); 0: one token per pass. ``draft``: a cheaper model whose
    greedy tokens are the drafts (:mod:`attnlm.generate.speculative`; its cache follows the
    conversation too). ``messages`` is the conversation so far."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: Any,
        stop_ids: Sequence[int] = (),
        *,
        sampling: SamplingConfig | None = None,
        system: str | None = None,
        use_cache: bool = True,
        lookahead: int = 8,
        draft: Any = None,
    ) -> None:
        if template is None:
            raise InputError("this model has no chat template; give one with --template FILE")
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.stop_ids = set(stop_ids)
        self.sampling = sampling or SamplingConfig(temperature=0.0)
        self.use_cache = use_cache and hasattr(model, "new_state")
        self.lookahead = lookahead
        self.propose = None  # drafts copied from the conversation
        if draft is not None:
            from attnlm.generate.speculative import ModelDrafter

            self.propose = ModelDrafter(draft)
        cfg = getattr(model, "config", None)
        self.window = getattr(cfg, "block_size", None)
        self.limit = token_limit(model, tokenizer)  # ids past the tokenizer's are never picked
        self.harmony = is_harmony(special_tokens_of(tokenizer))  # (gpt-oss's chat format)
        self._setup()
        self.messages: list[dict[str, str]] = []
        self.reset(system)

    # -- what depends on the model (PyTorch here; EngineChatSession: the C step alone) ---------

    def _setup(self) -> None:
        import torch

        from attnlm.base.device import model_device
        from attnlm.runtime.planner import runner_for

        self.runner = runner_for(self.model)  # the backend, chosen once for the conversation
        self.backend = (self.runner.name, self.runner.reason)
        self.generator = None
        if self.sampling.seed is not None:
            self.generator = torch.Generator(device=model_device(self.model))
            self.generator.manual_seed(self.sampling.seed)

    def _running(self) -> Any:
        """The context a reply is decoded in."""
        import contextlib

        import torch

        from attnlm.base.device import eval_mode

        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(eval_mode(self.model))
        return stack

    def _drafts_apply(self) -> bool:
        """Whether a greedy reply may check drafts: the state can drop its newest positions."""
        return _droppable(self.state)

    def _logits_every(self, ids: list[int]) -> Any:
        """Feed ``ids`` after what the state holds; the logits after each of them ``(T, V)``."""
        import torch

        from attnlm.base.device import model_device

        x = torch.tensor([ids], device=model_device(self.model))  # (1, T)
        return self.runner.step(x, self.state)[0]

    def _drop_state(self, n: int) -> None:
        """Forget the ``n`` newest positions of the state."""
        drop_newest(self.state, n)

    def _pick(self, logits: Any) -> int:
        """The next token from the last logits ``(V,)``."""
        from attnlm.generate.filters import sampling_filters
        from attnlm.generate.loop import pick

        s = self.sampling
        specs = [] if s.greedy else sampling_filters(s.temperature, s.top_k, s.top_p)
        return int(pick(logits[None], specs, s.greedy, self.generator)[0])

    # -- the conversation ----------------------------------------------------------------------

    def reset(self, system: str | None = None) -> None:
        """Forget the conversation (and the cache); keep ``system`` as its first message."""
        self.messages = [{"role": "system", "content": system}] if system else []
        self.state = None
        self.cached: list[int] = []  # ids whose keys/values the state holds

    def set_system(self, text: str) -> None:
        """Replace (or add) the system message; the cache keeps what still matches."""
        rest = [m for m in self.messages if m["role"] != "system"]
        self.messages = ([{"role": "system", "content": text}] if text else []) + rest

    def prompt_ids(self) -> list[int]:
        """The conversation rendered with the generation prompt and encoded."""
        text = self.template.render(self.messages, add_generation_prompt=True)
        return encode_prompt(self.tokenizer, text)

    # -- decoding ------------------------------------------------------------------------------

    def _feed(self, ids: list[int]) -> Any:
        """Feed ``ids`` after what the state holds; next-token logits (V,)."""
        import torch

        from attnlm.base.device import model_device

        device = model_device(self.model)
        if not self.use_cache:
            self.cached = self.cached + ids
            x = torch.tensor([self.cached], device=device)
            return self.model(ids=x).logits[0, -1]
        x = torch.tensor([ids], device=device)  # (1, T)
        logits = self.runner.last_logits(x, self.state)  # (1, V)
        self.cached = self.cached + ids
        return logits[0]

    def _prefill(self, ids: list[int]) -> tuple[Any, int]:
        """Bring the state to ``ids`` (the rendered prompt); returns the last logits and how
        many ids came from the cache."""
        keep = _common_prefix(self.cached, ids)
        if keep == len(ids):  # nothing new to feed: recompute the last position
            keep -= 1
        if self.use_cache and self.state is not None and keep < len(self.cached):
            if not _cut(self.state, keep):
                self.state, keep = None, 0
        if self.state is None and self.use_cache:
            self.state, keep = self.runner.new_state(None), 0
        self.cached = self.cached[:keep]
        return self._feed(ids[keep:]), keep

    def reply(self, user: str | None, on_text: Callable[[str], None] | None = None,
              on_reasoning: Callable[[str], None] | None = None) -> ChatReply:  # fmt: skip
        """Add the user's message (None: the conversation already ends with it), decode the
        assistant's reply (``on_text(piece)`` streams it) and add it to the conversation. A
        harmony model's reply (gpt-oss: :mod:`attnlm.tokenizers.harmony`) is its answer, its
        reasoning streamed to ``on_reasoning`` and kept in :attr:`ChatReply.reasoning`."""
        if user is not None:
            self.messages.append({"role": "user", "content": user})
        try:
            return self._reply(self._channels(on_text, on_reasoning))
        except BaseException:
            if user is not None:
                self.messages.pop()
            raise

    def _feed_every(self, ids: list[int]) -> list[int]:
        """Feed ``ids`` after what the state holds; the greedy token after each of them."""
        logits = self._logits_every(ids)  # (T, V)
        self.cached = self.cached + ids
        if self.limit is not None:
            logits = logits[:, : self.limit]
        return logits.argmax(-1).tolist()

    def _drop(self, n: int) -> None:
        """Forget the ``n`` newest positions (rejected drafts)."""
        self._drop_state(n)
        self.cached = self.cached[: len(self.cached) - n]

    def _allowed(self, logits: Any) -> Any:
        """``logits`` without the ids past the tokenizer's (never picked)."""
        return logits if self.limit is None else mask_from(logits, self.limit)

    def _channels(self, on_text: Any, on_reasoning: Any) -> Any:
        """``on_text`` as the reply's pieces arrive: through a :class:`HarmonyStream` for a
        harmony vocabulary (its answer to ``on_text``, its reasoning to ``on_reasoning``)."""
        if not self.harmony:
            return on_text
        split = HarmonyStream()
        sinks = {"content": on_text, "reasoning": on_reasoning}

        def route(piece: str) -> None:
            for kind, text in split.feed(piece) if piece else split.flush():
                if kind == "call":  # (no tools in a chat: the call's arguments as text)
                    kind, text = "content", text["arguments"]
                if sinks[kind] is not None:
                    sinks[kind](text)

        return route

    def _reply(self, on_text: Callable[[str], None] | None) -> ChatReply:
        ids = self.prompt_ids()
        room = self.sampling.max_new_tokens
        if self.window is not None:
            if len(ids) >= self.window:
                raise InputError(
                    f"the conversation is {len(ids):,} tokens, the model's window "
                    f"{self.window:,}; start again (/reset) or shorten it"
                )
            room = min(room, self.window - len(ids))
        row = _RowText(self.tokenizer, self.sampling.stop, context=ids)
        new: list[int] = []
        finish = "length" if room == self.sampling.max_new_tokens else "window"

        def take(tok: int) -> bool:
            """Add ``tok`` to the reply; True when the reply ends here."""
            nonlocal finish
            if tok in self.stop_ids:
                finish = "end of turn"
                return True
            new.append(tok)
            piece, stopped = row.push(tok)
            if piece and on_text:
                on_text(piece)
            if stopped:
                finish = "stop string"
            return stopped or len(new) >= room

        with self._running():
            t0 = time.perf_counter()
            logits, reused = self._prefill(ids)
            t1 = time.perf_counter()
            tok = self._pick(self._allowed(logits))
            if self.sampling.greedy and self.lookahead > 0 and self._drafts_apply():
                from attnlm.generate.lookahead import lookahead_loop

                lookahead_loop(lambda fed, _: self._feed_every(fed), self._drop, ids, room,
                               self.lookahead, take, first=tok, propose=self.propose)  # fmt: skip
            else:
                while not take(tok):
                    tok = self._pick(self._allowed(self._feed([tok])))
            t2 = time.perf_counter()
        rest = row.flush()
        if rest and on_text:
            on_text(rest)
        if self.harmony and on_text:
            on_text("")  # the end: what the stream held back
        text, reasoning = split_harmony(row.text()) if self.harmony else (row.text(), "")
        self.messages.append({"role": "assistant", "content": text})
        return ChatReply(
            reasoning=reasoning,
            text=text,
            ids=new,
            finish=finish,
            prompt_tokens=len(ids),
            reused=reused,
            prefilled=len(ids) - reused,
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
            token_texts=[token_label(self.tokenizer, i) for i in new],
            backend=self.backend[0],
            backend_reason=self.backend[1],
        )
