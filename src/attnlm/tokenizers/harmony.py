"""OpenAI's harmony format, gpt-oss's chat: a reply is a run of messages, each on a channel,
``<|channel|>analysis<|message|>…<|end|>`` then ``<|start|>assistant<|channel|>final<|message|>…``
ended by ``<|return|>`` (``<|call|>`` after a tool call's message). The channels: ``analysis``
(the model's reasoning), ``commentary`` (tool calls and their preambles) and ``final`` (the
answer).

So that a reply runs to its answer, ``<|end|>`` does not end it where the vocabulary has
``<|return|>`` and ``<|call|>`` (llama.cpp's rule for these vocabularies: :func:`harmony_stops`),
and :class:`HarmonyStream` reads the reply piece by piece (streamed or not) into its reasoning
(the ``analysis`` channel) and its content (the others' messages), without the markers: a
chat prints the answer and shows the reasoning apart, and the OpenAI-compatible server returns
them as ``content`` and ``reasoning_content`` (llama.cpp's server's name). A message addressed
to a function (``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}``)
is a tool call: its body, held to its end, comes out as one ``("call", {"id", "name",
"arguments"})`` item. A reply without any marker is content as it is."""

from __future__ import annotations

import re
import secrets
from typing import Any

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
RETURN, CALL = "<|return|>", "<|call|>"
#: the markers that end a message's body
ENDS = (END, RETURN, CALL, START, CHANNEL)
REASONING = "analysis"
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


def is_harmony(special_tokens: dict[str, int]) -> bool:
    """Whether a vocabulary (its special tokens, text -> id) writes harmony: it has the
    channel and message markers and both reply ends."""
    return all(t in special_tokens for t in (CHANNEL, MESSAGE, RETURN, CALL))


def harmony_stops(special_tokens: dict[str, int], stops: tuple[int, ...]) -> tuple[int, ...]:
    """``stops`` for a harmony vocabulary: without ``<|end|>`` (it ends a message, not the
    reply), with ``<|return|>`` and ``<|call|>``; other vocabularies' stops as they are."""
    if not is_harmony(special_tokens):
        return stops
    end = special_tokens.get(END)
    ends = (special_tokens[RETURN], special_tokens[CALL])
    return tuple(dict.fromkeys([i for i in stops if i != end] + list(ends)))


def call_id() -> str:
    """A tool call's id, as OpenAI's are written (``call_`` and 24 hex digits)."""
    return "call_" + secrets.token_hex(12)


def partial_tag(text: str, tags: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins one of ``tags`` (text a stream
    holds back: it may be the start of a marker)."""
    for n in range(min(max(map(len, tags)) - 1, len(text)), 0, -1):
        if any(t.startswith(text[-n:]) for t in tags):
            return n
    return 0


class HarmonyStream:
    """Splits a harmony reply into ``("reasoning", text)`` and ``("content", text)`` items (see
    the module docstring): a body's text comes out as soon as it cannot be the start of a
    marker; a message's header (``<|start|>assistant<|channel|>final``) never does."""

    def __init__(self) -> None:
        self.buf = ""
        self.channel: str | None = None  # the message being read (None: in a header)
        self.started = False  # any text seen (a reply without markers is content)
        self.function: str | None = None  # the function the message calls, or None
        self.args = ""  # a call's body so far
        self.calls: list[dict[str, Any]] = []

    def _kind(self) -> str:
        return "reasoning" if self.channel == REASONING else "content"

    def _text(self, text: str) -> list[tuple[str, Any]]:
        if self.function is not None:  # a call's arguments: held to the message's end
            self.args += text
            return []
        return [(self._kind(), text)] if text else []

    def _end(self) -> list[tuple[str, Any]]:
        """The message ends: a call's item, if it was one."""
        if self.function is None:
            return []
        call = {"id": call_id(), "name": self.function, "arguments": self.args.strip()}
        self.function, self.args = None, ""
        self.calls.append(call)
        return [("call", call)]

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.buf += piece
        out: list[tuple[str, str]] = []
        while self.buf:
            if not self.started:
                if partial_tag(self.buf, (START, CHANNEL)) == len(self.buf):
                    return out  # too short to tell
                self.started = True
                if not self.buf.startswith((START, CHANNEL)):
                    self.channel = "final"  # no header: the whole reply is its answer
            if self.channel is None:  # a header: up to its <|message|>
                i = self.buf.find(MESSAGE)
                if i < 0:
                    return out
                header, self.buf = self.buf[:i], self.buf[i + len(MESSAGE) :]
                name = header.rpartition(CHANNEL)[2] if CHANNEL in header else "final"
                self.channel = name.split(" ")[0].split("<|")[0] or "final"
                found = _RECIPIENT.search(header)
                self.function = found.group(1) if found else None
                continue
            at = [i for i in (self.buf.find(t) for t in ENDS) if i >= 0]
            if not at:
                cut = len(self.buf) - partial_tag(self.buf, ENDS)
                out += self._text(self.buf[:cut])
                self.buf = self.buf[cut:]
                return out
            i = min(at)
            out += self._text(self.buf[:i]) + self._end()
            self.buf = self.buf[i:]
            for t in (END, RETURN, CALL):
                if self.buf.startswith(t):
                    self.buf = self.buf[len(t) :]
            self.channel = None  # the next message's header (or the reply's end)
        return out

    def flush(self) -> list[tuple[str, Any]]:
        """What is left at the end of the reply (a body cut short: its text, or its call; a
        header: none)."""
        rest, self.buf = self.buf, ""
        if self.channel is None and self.started:
            return []
        if not self.started:
            return [("content", rest)] if rest else []
        return self._text(rest) + self._end()


def harmony_parts(text: str) -> tuple[str, str, list[dict[str, Any]]]:
    """``(content, reasoning, calls)`` of a whole harmony reply."""
    s = HarmonyStream()
    items = s.feed(text) + s.flush()
    content, reasoning = ("".join(v for k, v in items if k == kind)
                          for kind in ("content", "reasoning"))  # fmt: skip
    return content, reasoning, s.calls


def split_harmony(text: str) -> tuple[str, str]:
    """``(content, reasoning)`` of a whole harmony reply, a call's arguments as content (where
    no tools were offered: a chat)."""
    content, reasoning, calls = harmony_parts(text)
    return content + "".join(c["arguments"] for c in calls), reasoning


def special_tokens_of(tokenizer: Any) -> dict[str, int]:
    """A tokenizer's special tokens (text -> id), or an empty dict."""
    return dict(getattr(tokenizer, "special_tokens", {}) or {})
