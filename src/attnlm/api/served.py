"""The one model a server serves: loaded once (any SPEC ``chat``/``generate``/``embed`` take),
with what the endpoints need — its tokenizer, chat template and end ids, the scheduler of a
generating model, the sentence embeddings of an encoder — and the limits it is served under.

A GGUF file the C engine runs (:func:`attnlm.runtime.engine_gguf.engine_for`, chosen as
``chat``/``generate`` choose it) is served on the engine's slots
(:class:`~attnlm.api.steppers.EngineStepper`); every other generating model on PyTorch
(:class:`~attnlm.api.steppers.TorchStepper`), a small quantized GGUF file in float32."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how many may wait (see ``docs/server.md``)."""

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None  # None: the model's window
    max_tokens: int = 4096
    max_n: int = 8
    max_queue: int = 64
    request_seconds: float = 600.0
    max_inputs: int = 256  # embeddings inputs per request
    slot_context: int = 4096  # positions one slot holds (prompt and reply), at most the window


def parameter_count(model: Any) -> int:
    """A PyTorch model's parameters, or an engine's counted from its config."""
    if hasattr(model, "parameters"):
        return sum(p.numel() for p in model.parameters())
    c = model.config
    q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    block = c.n_embd * (2 * q + 2 * kv) + 3 * c.n_embd * c.d_ff
    return c.n_layer * block + c.vocab_size * c.n_embd * (1 if c.tie_embeddings else 2)


def default_parallel(model: Any) -> int:
    """Slots by model size and cores: 8 under 1B parameters, 4 under 8B, else 2 (never more
    than 4 per core)."""
    n = parameter_count(model)
    slots = 8 if n < 1e9 else 4 if n < 8e9 else 2
    return max(1, min(slots, 4 * (os.cpu_count() or 1)))


# A GGUF file up to this size is served in float32 by default: its own 4/5-bit blocks run in
# PyTorch by dequantizing every matrix at every step, far slower than float32 products, which
# also batch best (for larger files, --weights says what to use).
F32_GGUF_BYTES = 1 << 30


def batched_weights(spec: str) -> str | None:
    """The weights format the server loads ``spec`` in when ``--weights`` is not given:
    ``f32`` for a small quantized GGUF file (see :data:`F32_GGUF_BYTES`), else None."""
    from attnlm.loading.sources import gguf_file

    try:
        path = gguf_file(spec, lookup=True)
    except Exception:  # noqa: BLE001 - the loader names a bad SPEC itself
        return None
    return "f32" if path is not None and path.stat().st_size <= F32_GGUF_BYTES else None


class Served:
    """The model behind the server; ``id`` is its name in ``/v1/models`` and requests."""

    def __init__(self, spec: str, *, device: str = "cpu", weights: str | None = None,
                 parallel: int | None = None, prefill_chunk: int = 256,
                 limits: Limits | None = None, name: str | None = None,
                 threads: int | None = None) -> None:  # fmt: skip
        from attnlm.loading.sources import resolve

        self.limits = limits or Limits()
        found = _on_engine(spec, device, weights, threads)
        model, tok, info = found or resolve(spec, device, weights or batched_weights(spec))
        self.model, self.tokenizer, self.info = model, tok, info
        self.backend = info.details.get("backend", "pytorch")
        self.id = name or info.name or Path(str(spec)).name.removesuffix(".gguf") or str(spec)
        self.created = int(time.time())
        caps = set(getattr(info.family, "capabilities", ()))
        if found is not None:
            caps = {"generate"}
        self.generates = "generate" in caps and (found is not None or hasattr(model, "new_state"))
        self.embeds = "embed" in caps
        self.template = info.chat_template
        self.stop_ids = frozenset(info.stop_ids)
        self.window = getattr(getattr(model, "config", None), "block_size", None)
        if self.generates:  # what one slot holds
            ctx = self.limits.slot_context
            self.window = ctx if self.window is None else min(self.window, ctx)
        self.scheduler = None
        self.embed_lock = threading.Lock()
        self._grammars = None
        if self.generates:
            self._start(parallel, prefill_chunk)

    def _start(self, parallel: int | None, prefill_chunk: int) -> None:
        from attnlm.api.job import Context
        from attnlm.api.scheduler import Scheduler
        from attnlm.api.steppers import EngineStepper, TorchStepper
        from attnlm.generate.sampling import token_limit

        self.parallel = parallel or default_parallel(self.model)
        if self.backend == "c-engine":
            stepper: Any = EngineStepper(self.model, self.parallel, self.window)
        else:
            from attnlm.nn.layout import decoding_layout
            from attnlm.runtime.eager import EagerRunner

            self.model.eval()
            decoding_layout(self.model)
            runner = EagerRunner(self.model, "the server's batched step")
            stepper = TorchStepper(self.model, runner, self.parallel)
        limit = token_limit(self.model, self.tokenizer)
        self.context = Context(self.tokenizer, self.stop_ids, limit)
        self.context.grammars = self.grammars  # built now (a second for a large vocabulary)
        self.scheduler = Scheduler(stepper, self.parallel, prefill_chunk, self.limits.max_queue)

    @property
    def grammars(self) -> Any:
        """The llguidance compiler for this tokenizer (built on first use: about a second for
        a large vocabulary)."""
        if self._grammars is None:
            from attnlm.api.grammar import Grammars

            n_vocab = int(self.model.config.vocab_size)
            self._grammars = Grammars(self.tokenizer, n_vocab, sorted(self.stop_ids))
            self.context.grammars = self._grammars
        return self._grammars

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()

    # -- text ----------------------------------------------------------------------------------

    def encode(self, text: str, specials: bool = False) -> list[int]:
        """Token ids of ``text``; ``specials``: a plain prompt, with the BOS its tokenizer adds
        (as ``attnlm generate`` and llama-server's completions encode it; a rendered chat
        template writes its own)."""
        from attnlm.generate.text import encode_prompt

        return encode_prompt(self.tokenizer, text, specials=specials)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        size = int(self.tokenizer.vocab_size)
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise InputError(f"{param}: token id {bad[0]} is not in the vocabulary (0..{size - 1})")
        return ids

    def render(self, messages: list[dict], tools: list[dict] | None) -> str:
        if self.template is None:
            raise InputError(f"{self.id} has no chat template: use /v1/completions")
        return self.template.render(messages, add_generation_prompt=True, tools=tools)

    def room(self, prompt: list[int], max_tokens: int | None) -> int:
        """How many new tokens a prompt may get (``max_tokens``, the model's window), or an
        InputError when the prompt alone is too long."""
        limit = self.limits.max_prompt_tokens
        if self.window is not None:
            limit = self.window - 1 if limit is None else min(limit, self.window - 1)
        if limit is not None and len(prompt) > limit:
            raise InputError(f"the prompt is {len(prompt):,} tokens; at most {limit:,} are taken")
        room = self.limits.max_tokens if max_tokens is None else max_tokens
        return room if self.window is None else min(room, self.window - len(prompt))

    def embed(self, texts: list[str]) -> Any:
        """Sentence embeddings ``(N, C)`` as ``attnlm embed`` computes them."""
        from attnlm.inspect.embeddings import sentence_embeddings, sentence_max_length

        limit = sentence_max_length(self.info.path, self.model)
        with self.embed_lock:
            return sentence_embeddings(self.model, self.tokenizer, texts, limit)

    def embed_counted(self, texts: list[str]) -> tuple[Any, int]:
        """:meth:`embed` and how many tokens the inputs were (special tokens included)."""
        from attnlm.inspect.embeddings import sentence_max_length

        limit = sentence_max_length(self.info.path, self.model)
        enc = self.tokenizer.encode_batch_for_model(texts, None, limit)
        tokens = int(sum(sum(m) for m in enc["attention_mask"]))
        return self.embed(texts).cpu().numpy(), tokens

    def prompt_logits(self, prompt: list[int]) -> Any:
        """Logits ``(T, V)`` after each prompt token, computed on the scheduler's thread
        (the stepper's own): a future."""
        import torch

        stepper = self.scheduler.stepper

        def run() -> Any:
            with torch.inference_mode():
                return stepper.prompt_logits(prompt)

        return self.scheduler.call(run)

    def prompt_logprobs(self, prompt: list[int], k: int, logits: Any) -> list[dict]:
        """Each prompt token's log probability given the ones before it (the first: None),
        with the ``k`` most likely, for ``echo`` with ``logprobs`` (``logits``: what
        :meth:`prompt_logits` gave)."""
        import torch

        logits = logits.clone()
        if self.context.vocab_limit is not None:
            logits[:, self.context.vocab_limit :] = float("-inf")
        lp = torch.log_softmax(logits, dim=-1)
        out = [{"id": prompt[0], "logprob": None, "top": None}]
        for t in range(1, len(prompt)):
            row = lp[t - 1]
            vals, idx = torch.topk(row, min(k, row.numel())) if k else (torch.empty(0), [])
            tops = [(int(i), float(v)) for v, i in zip(vals.tolist(), list(idx))]
            out.append({"id": prompt[t], "logprob": float(row[prompt[t]]), "top": tops})
        return out


def _on_engine(spec: str, device: str, weights: str | None, threads: int | None) -> Any:
    """``resolve``'s answer where SPEC is a GGUF file the C engine runs with the per-slot
    calls the server steps (as ``chat`` and ``generate`` choose it), else None."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.loading.sources import gguf_file, resolve
    from attnlm.runtime.engine_gguf import engine_format
    from attnlm.runtime.planner import engine_reason

    try:
        path = gguf_file(spec, lookup=True)
    except Exception:  # noqa: BLE001 - the loader names a bad SPEC itself
        return None
    if path is None or not engine_reason(engine_format(GGUFFile(path), weights), device)[0]:
        return None
    from attnlm.api.steppers import engine_rows
    from attnlm.runtime.engine import Engine

    if not engine_rows(Engine):
        return None
    found = resolve(spec, device, weights, engine_ok=True, threads=threads)
    return found if found.info.details.get("backend") == "c-engine" else None
