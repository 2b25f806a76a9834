"""Conversations for supervised fine-tuning: JSON Lines in, token ids and loss masks out.

A chat data file holds one conversation per line, ``{"messages": [{"role": ..., "content":
...}, ...]}`` (the format of TRL's conversational datasets and OpenAI's fine-tuning files).
:func:`read_conversations` checks every record (one-line :class:`~attnlm.base.errors.InputError`
naming ``FILE:LINE``); :func:`encode_conversation` renders one with the model's chat template
and marks which tokens count in the loss: as TRL's assistant-only loss, the tokens of each
assistant message's content and of the end-of-turn token the template puts right after it;
everything else (system and user turns, the role headers, the template's separators) is
context only.

How the spans are found: the template renders the conversation up to assistant message ``i``
with the generation prompt (``...<|im_start|>assistant\\n``); rendered with message ``i``, the
text continues with the message's content. The text is then encoded piece by piece at those
boundaries, so each token is wholly inside or outside an assistant span.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.fileio import read_file_text
from attnlm.base.textio import text_problem
from attnlm.tokenizers.chat_template import check_messages

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Conversation:
    """One record: its messages and the line it came from."""

    messages: list[dict[str, str]]
    line: int


def _record(raw: str, where: str) -> list[dict[str, str]]:
    from attnlm.base.foreign import json_depth_problem

    deep = json_depth_problem(raw)  # json.loads would recurse until the stack runs out
    if deep:
        raise InputError(f"{where}: not valid JSON ({deep})")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(doc, dict) or "messages" not in doc:
        raise InputError(f'{where}: expected an object with "messages" (a list of messages)')
    messages = doc["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(f'{where}: "messages" must be a non-empty list of messages')
    out = check_messages(messages, f"{where}: messages")  # objects with string fields
    for i, m in enumerate(out):
        if m["role"] not in ROLES:
            raise InputError(f"{where}: messages[{i}] has role {m['role']!r} (expected one of "
                             f"{', '.join(ROLES)})")  # fmt: skip
        problem = text_problem(m["content"], empty_ok=True)
        if problem:
            raise InputError(f"{where}: messages[{i}] 'content': {problem}")
    if not any(m["role"] == "assistant" for m in out):
        raise InputError(f"{where}: no assistant message (nothing to learn from)")
    return out


def read_conversations(path: str | Path) -> list[Conversation]:
    """Every conversation of a chat JSON Lines file (blank lines skipped)."""
    path = Path(path)
    text = read_file_text(path, "chat data file")  # bounded: /dev/zero costs one block
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append(Conversation(_record(line, f"{path}:{n}"), n))
    if not out:
        raise InputError(f"{path}: no conversations")
    return out


def _encode(tokenizer: Any, text: str, first: bool) -> list[int]:
    """``text`` encoded as a piece of a longer text: a BOS the tokenizer adds by itself is kept
    for the first piece only."""
    ids = list(tokenizer.encode(text)) if text else []
    bos = getattr(tokenizer, "bos_id", None)
    if not first and ids and getattr(tokenizer, "add_bos", False) and ids[0] == bos:
        ids = ids[1:]
    return ids


def assistant_spans(
    template: Any, messages: list[dict[str, str]], end_tokens: list[str]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the ``[start, end)`` character spans of the assistant
    contents, each with the end-of-turn token (one of ``end_tokens``) right after it."""
    full = template.render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        where = f"{template.origin}: rendering message {i}"
        prefix = template.render(messages[:i], add_generation_prompt=True)
        upto = template.render(messages[: i + 1])
        if not full.startswith(upto):
            raise InputError(f"{where}: the template does not render a conversation as a "
                             "prefix of its continuation")  # fmt: skip
        # the content follows the generation prompt (a template that adds a default system
        # prompt to a conversation that starts with the assistant renders no common prefix)
        start = upto.find(m["content"], len(prefix) if upto.startswith(prefix) else 0)
        if start < 0:
            raise InputError(f"{where}: the assistant content is not in the rendered text")
        end = start + len(m["content"])
        end += next((len(t) for t in end_tokens if upto.startswith(t, end)), 0)
        spans.append((start, end))
    return full, spans


def encode_conversation(
    tokenizer: Any, template: Any, messages: list[dict[str, str]], end_tokens: list[str]
) -> tuple[list[int], list[bool]]:
    """``(ids, mask)``: the rendered conversation's token ids and, for each, whether it is
    an assistant token the loss counts (see the module docstring)."""
    text, spans = assistant_spans(template, messages, end_tokens)
    ids: list[int] = []
    mask: list[bool] = []
    pos = 0
    for start, end in spans:
        for piece, counted in ((text[pos:start], False), (text[start:end], True)):
            new = _encode(tokenizer, piece, not ids)
            ids += new
            mask += [counted] * len(new)
        pos = end
    tail = _encode(tokenizer, text[pos:], not ids)
    return ids + tail, mask + [False] * len(tail)
