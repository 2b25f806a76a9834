"""Model access for the attention explorer: one :class:`ModelService` per served model.

Everything the web server knows about models goes through this module; the HTTP layer
(:mod:`attnlm.web.server`) only validates JSON and calls these methods. A service answers with
plain JSON-ready dicts:

- ``info()``: name, family, capabilities, layers, heads, window, character limit;
- ``tokens(text)``: ``{"tokens": [str], "ids": [int]}``, the tokens as the model sees them
  (BERT: ``[CLS] ... [SEP]``; translation models: the source side with its end token);
- ``attention(text)``: ``{"tokens": [T], "attention": [L][H][T][T]}`` (query rows, key
  columns, each row sums to 1); translation models answer for the greedy translation of
  ``text``: ``"translation"``, the target tokens as ``"tokens"`` (decoder self-attention in
  ``"attention"``; empty for the RNN encoder-decoder), ``"source_tokens"`` ``[S]`` and
  ``"cross_attention"`` ``[L][H][T][S]`` (query = target token, key = source token);
- ``next_tokens(text, k)``: the ``k`` most likely next tokens after every position;
- ``generate(text, sampling)``: a continuation;
- ``embeddings(word, sentences)``: cosine of the word's contextual vectors in two sentences at
  every layer (index 0 = the embedding layer); not for translation models;
- ``lens(text, k)`` (info ``lens: true``: causal decoders with a final norm and LM head): the
  logit lens, ``{"k", "tokens", "ids", "layers": [{"layer", "positions": [T][k] of {"id",
  "token", "prob"}}]}``, ``L + 1`` rows from the embeddings to the last layer
  (:mod:`.llm`);
- ``chat(messages, sampling)`` (info ``chat: true``: a chat template): the assistant's reply
  to the conversation, its tokens and timings (:mod:`.llm`);
- ``ablate(text, heads, mean, k)``, ``patch(clean, corrupt, answer, wrong)``,
  ``head_scores(kind, length, batch, seed)`` (info ``interpret: true``: causal decoders the
  tracer reads): head ablation, activation patching and induction / previous-token /
  duplicate-token head scores (:mod:`.interp`, through :mod:`attnlm.inspect.experiments`);
- ``fill_mask(text, k)`` (capability ``fill-mask``): the top ``k`` tokens at every
  ``[MASK]`` (:func:`attnlm.inspect.fill_mask.fill_mask`), ``{"text", "filled", "k",
  "tokens", "masks": [{"index", "predictions": [{"token", "id", "prob"}]}]}``;
- ``translate(text, sampling, max_new_tokens)`` (capability ``translate``): the translation
  (:func:`attnlm.generate.translate.translate_ids`; greedy unless ``sampling`` samples) and the
  attention record of the model reading it, ``{"source", "translation", "tokens",
  "attention", "source_tokens", "cross_attention"}``.

A request for a capability the model lacks answers :class:`NotSupportedError` (HTTP 400).

The package keeps one job per file: the request limits, errors and sampling settings
(:mod:`.limits`), the served model and its endpoints (:mod:`.model`), the logit lens and
chat (:mod:`.llm`), the experiments inside a decoder (:mod:`.interp`), character spans of words
and tokens (:mod:`.spans`) and model loading (:mod:`.loading`). Every name is importable from
``attnlm.web.service`` (loaded on first use).

Where other model families plug in (kept in one place each):

- :func:`load_service` (:mod:`.loading`): loads a checkpoint; the family and its
  capabilities come from the model-family registry (translation checkpoints are served with
  their pair tokenizers);
- :meth:`ModelService._inspect` (:mod:`.model`): the single forward pass that yields tokens,
  per-layer attention, hidden states and logits, through the shared record
  (:func:`attnlm.inspect.record.inspect`; encoder-decoders through
  :func:`attnlm.inspect.translation.inspect_translation`);
- :func:`resolve_named_model`: ``attnlm serve --model NAME`` (``minilm`` or a Hugging Face folder).

Shapes: ``L`` layers, ``H`` heads, ``T`` tokens (target tokens for translation), ``S`` source
tokens, ``C`` width, ``V`` vocabulary.
"""

from __future__ import annotations

import logging

from attnlm._lazy import lazy_exports

log = logging.getLogger("attnlm.web")

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".limits": "DECIMALS DEFAULT_MAX_CHARS MAX_ATTENTION_VALUES MAX_BEAMS MAX_CHAT_CHARS "
        "MAX_CHAT_MESSAGES MAX_LENS_LOGITS MAX_NEW_TOKENS MAX_PATCH_LOGITS MAX_SCORE_BATCH "
        "MAX_SCORE_LENGTH MAX_SCORE_WEIGHTS MAX_TOP_K NotSupportedError "
        "ServiceError TooLongError UnknownModelError sampling_config",
        ".model": "Inspection ModelService",
        ".spans": "find_word token_spans",
        ".llm": "check_conversation lens_supported",
        ".loading": "load_service resolve_named_model",
    },
)
