"""One served model answering the explorer's JSON API: :class:`ModelService`.

Its methods are the endpoints (``info``, ``tokens``, ``attention``, ``next_tokens``,
``generate``, ``embeddings``, ``fill_mask``, ``translate``, ``lens``, ``chat``, ``ablate``,
``patch``, ``head_scores``; the package docstring of
:mod:`attnlm.web.service` lists what each answers). Every endpoint that needs the model's
internals goes through one forward pass, :meth:`ModelService._inspect`, which reads the shared
inspection record (:func:`attnlm.inspect.record.inspect`), so every family the registry knows
is served; family differences (BERT's ``[CLS] ... [SEP]``, a translation model's source and
target sides) are decided by the model's capabilities and tokenizer.

Shape legend (one text per call: tensors carry no batch dimension)
    L  attention layers (a translation model's decoder layers; 1 for the RNN encoder-decoder)
    H  heads
    T  tokens of the text (the target tokens for a translation model)
    S  source tokens (translation models)
    C  model width (hidden states)
    V  vocabulary (logits)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnlm.base.errors import AttnlmError, InputError
from attnlm.generate.sampling import SamplingConfig
from attnlm.models.base import count_params
from attnlm.web.service.limits import (
    DECIMALS,
    DEFAULT_MAX_CHARS,
    MAX_ATTENTION_VALUES,
    MAX_BEAMS,
    MAX_NEW_TOKENS,
    MAX_TOP_K,
    NotSupportedError,
    ServiceError,
    TooLongError,
)

# The sentence the page opens on (the lectures' "bank" example), trimmed per model to fit.
SAMPLE_TEXT = "the central bank raised interest rates"


@dataclass
class Inspection:
    """One forward pass over a text: what the views need.

    ``ids`` / ``tokens``: ``T`` token ids and their display strings; ``attentions``: ``L``
    tensors ``(H, T, T)``; ``hidden``: ``L + 1`` tensors ``(T, C)`` (index 0 = embeddings);
    ``logits``: ``(T, V)`` or None; translation models fill ``source_tokens`` and
    ``cross_attentions`` (``L`` tensors ``(H, T, S)``).
    """

    ids: list[int]
    tokens: list[str]
    attentions: list[Any]
    hidden: list[Any]
    logits: Any = None
    source_tokens: list[str] | None = None
    cross_attentions: list[Any] | None = None


def _rounded(t: Any) -> list:
    """A tensor as nested lists of floats rounded to :data:`DECIMALS` places."""
    import numpy as np

    return np.round(t.detach().double().cpu().numpy(), DECIMALS).tolist()


@dataclass
class ModelService:
    """A served model: name, the model (eval mode), its tokenizer, family and capabilities.

    Methods are safe to call from many threads: model calls are serialised by a lock (torch
    already uses every core inside one call).
    """

    name: str
    model: Any
    tokenizer: Any
    family: str = "gpt"
    capabilities: frozenset[str] = frozenset({"generate"})
    max_chars: int = DEFAULT_MAX_CHARS
    max_attention_values: int = MAX_ATTENTION_VALUES
    source: str = ""  # where it came from (checkpoint folder), shown in the page
    static_vectors: Any = None  # word2vec vectors (attnlm serve --vectors): the static half
    # generate and translate through the compiled decode step (attnlm serve --compile): the
    # graphs are kept per model, so a long-running server compiles each shape once
    compile: bool = False
    # chat (a ChatTemplate and the ids that end a turn; sources.resolve finds them)
    chat_template: Any = None
    stop_ids: tuple[int, ...] = ()
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _chat_session: Any = field(default=None, repr=False)  # its KV cache outlives one request

    def __post_init__(self) -> None:
        self.model.eval()
        self.capabilities = frozenset(self.capabilities)

    # -- facts -----------------------------------------------------------------------------

    @property
    def window(self) -> int | None:
        """Most tokens one forward pass takes (the model's context length), if known."""
        cfg = getattr(self.model, "config", None)
        return getattr(cfg, "block_size", None) or getattr(cfg, "max_len", None)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def chats(self) -> bool:
        """A language model with a chat template: the page shows the chat panel."""
        return self.chat_template is not None and "generate" in self.capabilities

    @property
    def lenses(self) -> bool:
        """A causal decoder the logit lens reads (a final norm and an LM head)."""
        from attnlm.web.service.llm import lens_supported

        return (
            "generate" in self.capabilities and not self.translates and (lens_supported(self.model))
        )

    @property
    def interprets(self) -> bool:
        """A causal decoder the experiments read (head ablation, activation patching, head
        scores: :mod:`.interp`)."""
        from attnlm.web.service.interp import supported

        return not self.translates and supported(self.model)

    @property
    def translates(self) -> bool:
        """A translation model: texts are source sentences, answers carry cross-attention."""
        return "translate" in self.capabilities

    @property
    def _model_input(self) -> bool:
        """BERT-style input: the tokenizer builds ``[CLS] text [SEP]`` for the model."""
        return not self.translates and hasattr(self.tokenizer, "encode_for_model")

    def _layers_heads(self) -> tuple[int | None, int | None]:
        """Attention layers x heads the views show (translation: decoder layers; an RNN
        encoder-decoder has one attention map)."""
        cfg = getattr(self.model, "config", None)
        if self.translates:
            return getattr(cfg, "n_decoder_layers", None) or 1, getattr(cfg, "n_head", None) or 1
        return getattr(cfg, "n_layer", None), getattr(cfg, "n_head", None)

    def info(self) -> dict[str, Any]:
        layers, heads = self._layers_heads()
        vocab = getattr(self._pairs().target, "vocab_size", None) if self.translates else None
        return {
            "name": self.name,
            "family": self.family,
            "capabilities": sorted(self.capabilities),
            "n_layer": layers,
            "n_head": heads,
            "window": self.window,
            "vocab_size": vocab or getattr(self.tokenizer, "vocab_size", None),
            "max_chars": self.max_chars,
            "parameters": count_params(self.model),
            "source": self.source,
            "chat": self.chats,
            "lens": self.lenses,
            "interpret": self.interprets,
            "sample": self.sample(),
        }

    def sample(self, text: str = SAMPLE_TEXT) -> dict[str, Any]:
        """The page's opening text for this model: ``text`` with its last words dropped until
        it fits the model's window (and the tokenizer knows every symbol), with a ``note``
        saying so when it was trimmed, so the first screen always draws something."""
        words = text.split()
        for n in range(len(words), 0, -1):
            candidate = " ".join(words[:n])
            try:
                self.encode(candidate, "sample")
            except ServiceError:
                continue
            if n == len(words):
                return {"text": candidate, "note": ""}
            return {
                "text": candidate,
                "note": f"the sample sentence was trimmed to {n} of its {len(words)} words "
                f"to fit this model (window: {self.window} tokens)",
            }
        return {"text": "", "note": "the sample sentence does not fit this model: type a text"}

    def require(self, capability: str) -> None:
        if capability not in self.capabilities:
            have = ", ".join(sorted(self.capabilities)) or "none"
            raise NotSupportedError(
                f"{capability} is not supported by this model ({self.name}, family "
                f"{self.family}; capabilities: {have})"
            )

    def _compiled(self) -> bool:
        """Whether to decode through the compiled step: asked for (``serve --compile``) and
        the model has one (other families are served uncompiled)."""
        from attnlm.runtime.compiled import has_compiled_step

        return self.compile and has_compiled_step(self.model)

    # -- tokens ----------------------------------------------------------------------------

    def _check_text(self, text: str, what: str = "text") -> None:
        if not isinstance(text, str) or not text:
            raise ServiceError(f"{what} must be a non-empty string")
        if len(text) > self.max_chars:
            raise TooLongError(
                f"{what} is {len(text)} characters long; the limit is {self.max_chars}"
            )

    def encode(self, text: str, what: str = "text") -> list[int]:
        """Token ids of ``text`` as the model sees them (BERT: ``[CLS] text [SEP]``;
        translation models: the source ids); too long, empty or unencodable text raises
        ServiceError."""
        self._check_text(text, what)
        try:
            ids = self._ids(text, what)
        except ServiceError:
            raise
        except AttnlmError as e:
            raise ServiceError(f"cannot tokenize the {what}: {e}") from None
        except (KeyError, ValueError) as e:
            raise ServiceError(f"cannot tokenize the {what}: unknown symbol {e}") from None
        if not ids:
            raise ServiceError(f"the {what} has no tokens")
        return ids

    def _ids(self, text: str, what: str) -> list[int]:
        if self.translates:
            pairs = self._pairs()
            if not pairs.tokens(text, "source"):
                return []
            return list(pairs.encode_source(text))
        ids = list(self.tokenizer.encode(text))
        if not self._model_input:  # a decoder sees the BOS its tokenizer adds (Gemma's)
            from attnlm.inspect.record import with_bos

            ids = with_bos(self.tokenizer, text, ids)
        n = len(ids) + (2 if self._model_input else 0)  # [CLS] ... [SEP]
        if self.window and n > self.window:
            raise TooLongError(
                f"the {what} is {n} tokens long; this model's window is {self.window}"
            )
        if self._model_input and ids:
            from attnlm.inspect.record import model_input

            ids, _ = model_input(self.model, self.tokenizer, text)
        return ids

    def _pairs(self) -> Any:
        """The source/target tokenizers of a translation model (one shared tokenizer wrapped)."""
        from attnlm.data.pairs import PairTokenizers

        if isinstance(self.tokenizer, PairTokenizers):
            return self.tokenizer
        return PairTokenizers.from_tokenizers(self.tokenizer)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Display string of each token id (bytes of a split character show as U+FFFD;
        BERT and translation models: the vocabulary's labels such as ``[CLS]``, ``##s``,
        ``</s>``)."""
        from attnlm.tokenizers import token_label

        if self.translates:
            pairs = self._pairs()
            sp, cfg = pairs.source_ids, pairs.config
            names = {sp.pad: cfg.pad, sp.bos: cfg.bos, sp.eos: cfg.eos}
            return [names[i] if i in names else token_label(pairs.source, i) for i in ids]
        if self._model_input:
            return [token_label(self.tokenizer, i) for i in ids]
        return [self.tokenizer.decode([i]) for i in ids]

    def tokens(self, text: str) -> dict[str, Any]:
        ids = self.encode(text)
        return {"tokens": self.token_strings(ids), "ids": ids}

    # -- the one forward pass --------------------------------------------------------------

    def _inspect(self, text: str, target: Sequence[int] | None = None) -> Inspection:
        """Run the model once over ``text`` with attention and hidden states (translation
        models: over the source ``text`` and the ``target`` ids they are made to read, their
        greedy translation when None).

        The only place that calls the model for inspection, through the shared record
        (:func:`attnlm.inspect.inspect`), so every family the registry knows is served.
        """
        from attnlm.inspect import inspect

        self.encode(text)  # limits and tokenizer errors as service errors
        try:
            with self._lock:
                rec = inspect(self.model, self.tokenizer, text, target=target)
        except InputError as e:
            raise ServiceError(str(e)) from None
        plain = rec.cross_attentions is None and not self._model_input
        return Inspection(
            ids=rec.ids,
            tokens=self.token_strings(rec.ids) if plain else list(rec.tokens),
            attentions=rec.attentions,  # L x (H, T, T)
            hidden=rec.hidden_states,  # (L + 1) x (T, C)
            logits=rec.logits,  # (T, V) or None
            source_tokens=rec.source_tokens,
            cross_attentions=rec.cross_attentions,
        )

    # -- endpoints -------------------------------------------------------------------------

    def attention(self, text: str) -> dict[str, Any]:
        """The attention record of ``text`` (translation models: of its greedy translation,
        as :meth:`translate` answers it)."""
        if self.translates:
            return self.translate(text)
        layers, heads = self._layers_heads()
        if layers and heads:  # refuse before computing an answer too large to send
            t = len(self.encode(text))
            n = layers * heads * t * t
            if n > self.max_attention_values:
                raise TooLongError(
                    f"the attention of {t} tokens is {layers} layers x {heads} heads x {t} x {t}"
                    f" = {n:,} weights; the limit is {self.max_attention_values:,} (shorten it)"
                )
        return self._record(self._inspect(text))

    def _record(self, rec: Inspection) -> dict[str, Any]:
        """The JSON attention record of an inspection (refused when too large to send)."""
        n = sum(a.numel() for a in [*rec.attentions, *(rec.cross_attentions or [])])
        if n > self.max_attention_values:
            raise TooLongError(
                f"the attention record holds {n:,} weights; the limit is "
                f"{self.max_attention_values:,} (shorten the text)"
            )
        out: dict[str, Any] = {
            "tokens": rec.tokens,
            "attention": [_rounded(a) for a in rec.attentions],  # [L][H][T][T]
        }
        if rec.cross_attentions is not None:
            out["source_tokens"] = rec.source_tokens
            out["cross_attention"] = [_rounded(a) for a in rec.cross_attentions]  # [L][H][T][S]
        return out

    def next_tokens(self, text: str, k: int = 5) -> dict[str, Any]:
        """The ``k`` most likely next tokens (with probabilities) after every position."""
        import torch

        self.require("generate")
        if not 1 <= k <= MAX_TOP_K:
            raise ServiceError(f"k must be between 1 and {MAX_TOP_K}")
        rec = self._inspect(text)
        probs = torch.softmax(rec.logits, dim=-1)  # (T, V)
        k = min(k, probs.size(-1))
        top_p, top_i = probs.topk(k, dim=-1)  # (T, k)
        nxt = [
            [
                {"token": self.tokenizer.decode([int(i)]), "id": int(i), "prob": round(float(p), 6)}
                for p, i in zip(ps, idx)
            ]
            for ps, idx in zip(top_p.tolist(), top_i.tolist())
        ]
        return {"tokens": rec.tokens, "k": k, "next": nxt}

    def generate(self, text: str, sampling: SamplingConfig) -> dict[str, Any]:
        from attnlm.generate.options import DecodeOptions
        from attnlm.generate.text import generate_text

        self.require("generate")
        self.encode(text, "prompt")
        with self._lock:
            (cont,) = generate_text(
                self.model,
                self.tokenizer,
                [text],
                sampling,
                DecodeOptions(compile=self._compiled()),
            )
        return {"prompt": text, "continuation": cont, "text": text + cont}

    def lens(self, text: str, k: int = 5) -> dict[str, Any]:
        """The logit lens of ``text`` (:func:`attnlm.web.service.llm.lens`)."""
        from attnlm.web.service.llm import lens

        return lens(self, text, k)

    def chat(self, messages: Sequence[Any], sampling: SamplingConfig) -> dict[str, Any]:
        """The reply to a conversation (:func:`attnlm.web.service.llm.chat`)."""
        from attnlm.web.service.llm import chat

        return chat(self, messages, sampling)

    def ablate(
        self, text: str, heads: Sequence[str], mean: bool = False, k: int = 10
    ) -> dict[str, Any]:
        """The next tokens with and without some heads (:func:`.interp.ablate`)."""
        from attnlm.web.service.interp import ablate

        return ablate(self, text, heads, mean, k)

    def patch(self, clean: str, corrupt: str, answer: str, wrong: str) -> dict[str, Any]:
        """Activation patching from ``clean`` into ``corrupt`` (:func:`.interp.patch`)."""
        from attnlm.web.service.interp import patch

        return patch(self, clean, corrupt, answer, wrong)

    def head_scores(
        self, kind: str = "induction", length: int = 20, batch: int = 8, seed: int = 0
    ) -> dict[str, Any]:
        """Every head's induction (or other) score (:func:`.interp.head_scores`)."""
        from attnlm.web.service.interp import head_scores

        return head_scores(self, kind, length, batch, seed)

    def embeddings(self, word: str, sentences: Sequence[str]) -> dict[str, Any]:
        """A word's contextual drift across layers (:func:`.encoders.embeddings`)."""
        from attnlm.web.service.encoders import embeddings

        return embeddings(self, word, sentences)

    def fill_mask(self, text: str, k: int = 5) -> dict[str, Any]:
        """The likeliest tokens at every ``[MASK]`` (:func:`.encoders.fill_mask`)."""
        from attnlm.web.service.encoders import fill_mask

        return fill_mask(self, text, k)

    def translate(
        self,
        text: str,
        sampling: SamplingConfig | None = None,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
    ) -> dict[str, Any]:
        """Translate the source sentence ``text`` (greedy unless ``sampling`` samples, beam
        search with ``num_beams > 1``, as ``attnlm translate --beam K``; at most
        ``max_new_tokens`` tokens, by default twice the source length plus 10, as ``attnlm
        translate``, capped at :data:`MAX_NEW_TOKENS`) and record the attention of the model
        reading the ids it produced: target tokens (queries) over source tokens (keys). The
        decoder is causal, so these are the weights of the decoding steps themselves."""
        from attnlm.generate.translate import default_max_new_tokens, target_limit, translate_ids

        self.require("translate")
        if max_new_tokens is not None and not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ServiceError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}")
        if not 1 <= num_beams <= MAX_BEAMS:
            raise ServiceError(f"num_beams must be between 1 and {MAX_BEAMS}, got {num_beams}")
        source = self.encode(text, "source sentence")
        n = max_new_tokens or min(default_max_new_tokens([source]), MAX_NEW_TOKENS)
        pairs = self._pairs()
        try:
            with self._lock:
                (ids,) = translate_ids(
                    self.model,
                    [source],
                    num_beams=num_beams,
                    sampling=sampling,
                    max_new_tokens=n,
                    compile=self._compiled(),
                    vocab_limit=target_limit(self.model, pairs),
                )
        except InputError as e:
            raise ServiceError(str(e)) from None
        translation = pairs.decode_target(ids)
        rec = self._inspect(text, target=ids[1:])  # the ids after the start token, as decoded
        return {"source": text, "translation": translation, **self._record(rec)}
