"""The explorer's views of a causal language model's inside and of its chat: the logit lens
(:func:`lens`) and one chat turn (:func:`chat`), each answering for one
:class:`~attnlm.web.service.model.ModelService`.

The chat endpoint is stateless (each request carries the whole conversation), but each served
model keeps one :class:`~attnlm.generate.chat.ChatSession`: a request whose conversation
extends the previous one feeds only the new turn (the session keeps the longest common prefix
of the rendered prompt in its KV cache), so a conversation in the page costs one prefill of
the new turn per reply, as ``attnlm chat`` does.

Shapes: ``L`` layers (``L + 1`` lens rows, the embeddings first), ``T`` positions, ``k``
predictions per cell, ``V`` vocabulary. ``service`` is always a ``ModelService`` (not
imported: the service imports this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnlm.base.errors import InputError
from attnlm.generate.sampling import SamplingConfig
from attnlm.inspect.lens import supports_lens
from attnlm.web.service.limits import (
    MAX_CHAT_CHARS,
    MAX_CHAT_MESSAGES,
    MAX_LENS_LOGITS,
    MAX_TOP_K,
    ServiceError,
    TooLongError,
)

CHAT_ROLES = ("system", "user", "assistant")


# whether the logit lens reads a model (the predicate attnlm.inspect.lens applies itself)
lens_supported = supports_lens


def lens(service: Any, text: str, k: int = 5) -> dict[str, Any]:
    """The logit lens of ``text``: for each of the ``L + 1`` rows (``"embed"``, ``"layer 1"``
    ...) and each position, the top ``k`` next-token predictions read through the final norm
    and the LM head (:func:`attnlm.inspect.lens.logit_lens`). The last row is the model's own
    output, so it equals :meth:`ModelService.next_tokens`."""
    from attnlm.inspect.lens import logit_lens

    if not service.lenses:
        raise ServiceError(
            f"the logit lens reads a causal decoder's layers through its final norm and LM "
            f"head; {service.name} (family {service.family}) has none"
        )
    if not 1 <= k <= MAX_TOP_K:
        raise ServiceError(f"k must be between 1 and {MAX_TOP_K}")
    t = len(service.encode(text))
    layers, _ = service._layers_heads()
    vocab = getattr(service.tokenizer, "vocab_size", None) or 0
    n = ((layers or 0) + 1) * t * vocab
    if n > MAX_LENS_LOGITS:  # every row is read through the LM head at once: (L + 1, T, V)
        raise TooLongError(
            f"the logit lens of {t} tokens reads {layers + 1} rows x {t} positions x {vocab:,} "
            f"tokens = {n:,} logits; the limit is {MAX_LENS_LOGITS:,} (shorten the text)"
        )
    try:
        with service._lock:
            result = logit_lens(service.model, service.tokenizer, text, k=k)
    except InputError as e:
        raise ServiceError(str(e)) from None
    return {"k": min(k, result.top_ids.size(-1)), **result.to_json()}


def check_conversation(messages: Any, max_chars: int) -> list[dict[str, str]]:
    """``messages`` as ``[{"role", "content"}]``, checked against the chat limits: at most
    :data:`MAX_CHAT_MESSAGES` messages, each of ``max_chars`` characters at most and
    :data:`MAX_CHAT_CHARS` in all, roles ``system``/``user``/``assistant``, the last one the
    user's."""
    from attnlm.tokenizers.chat_template import check_messages

    try:
        msgs = check_messages(messages, "messages")
    except InputError as e:
        raise ServiceError(str(e)) from None
    if not msgs:
        raise ServiceError("messages is empty: give at least the user's message")
    if len(msgs) > MAX_CHAT_MESSAGES:
        raise TooLongError(
            f"the conversation has {len(msgs)} messages; the limit is {MAX_CHAT_MESSAGES} "
            "(start a new one)"
        )
    for i, m in enumerate(msgs):
        if m["role"] not in CHAT_ROLES:
            raise ServiceError(
                f"messages[{i}]: role {m['role']!r} is not one of {', '.join(CHAT_ROLES)}"
            )
        if len(m["content"]) > max_chars:
            raise TooLongError(
                f"messages[{i}] is {len(m['content'])} characters long; the limit is {max_chars}"
            )
    total = sum(len(m["content"]) for m in msgs)
    if total > MAX_CHAT_CHARS:
        raise TooLongError(
            f"the conversation is {total} characters long; the limit is {MAX_CHAT_CHARS} "
            "(start a new one)"
        )
    if msgs[-1]["role"] != "user" or not msgs[-1]["content"].strip():
        raise ServiceError("the last message must be the user's, and not empty")
    return msgs


def chat(service: Any, messages: Sequence[Any], sampling: SamplingConfig) -> dict[str, Any]:
    """The assistant's reply to ``messages`` (the conversation so far, ending with the user's
    turn): :meth:`attnlm.generate.chat.ChatSession.reply`'s answer (``reply``, ``tokens``,
    ``token_texts``, ``finish``, ``prompt_tokens``, ``reused_tokens``, ``prefilled_tokens``,
    ``timings``)."""
    import torch

    from attnlm.generate.chat import ChatSession

    if not service.chats:
        raise ServiceError(
            f"{service.name} has no chat template (not a chat model?): use the generate box"
        )
    msgs = check_conversation(messages, service.max_chars)
    with service._lock:
        session = service._chat_session
        if session is None:
            session = ChatSession(
                service.model, service.tokenizer, service.chat_template, service.stop_ids
            )
            service._chat_session = session
        session.sampling = sampling  # this request's settings; the cache stays
        session.generator = None
        if sampling.seed is not None:
            session.generator = torch.Generator(device=service.device)
            session.generator.manual_seed(sampling.seed)
        session.messages = msgs
        try:
            reply = session.reply(None)
        except InputError as e:  # a template that refuses the conversation, a full window
            raise ServiceError(str(e)) from None
    return reply.to_json()
