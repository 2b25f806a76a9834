"""Tool calls in a reply, as Qwen2.5 (and Hermes-style templates) write them:
``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, any number of them, text
around them being the reply's content. :class:`ToolStream` reads the reply piece by piece
(streamed or not): the text outside calls comes out as content as soon as it cannot be the
start of a ``<tool_call>``, each call as soon as its ``</tool_call>`` arrives. A call whose
JSON does not parse, or that has no name, stays in the content as it was written.

Small Qwen models (Qwen2.5-Coder-0.5B) often write the call's JSON without the tags: a reply
that begins with ``{`` is therefore held to its end, and read as one call when the whole of
it is ``{"name": <an offered tool>, "arguments": {...}}``, else given as content."""

from __future__ import annotations

import json
from typing import Any

from attnlm.tokenizers.harmony import call_id, partial_tag

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse_call(text: str) -> dict[str, Any] | None:
    """``{"name", "arguments"}`` (arguments as a JSON string) of one call's body, or None."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    return {"name": data["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}


class ToolStream:
    """Splits a reply into content and tool calls (see the module docstring)."""

    def __init__(self, names: set[str] | frozenset[str] = frozenset()) -> None:
        self.names = names  # the offered tools: a bare JSON reply naming one is a call
        self.bare: bool | None = None  # undecided until the reply's first visible character
        self.buf = ""
        self.inside = False
        self.calls: list[dict[str, Any]] = []
        self.after_call = False  # the newlines after a call's end belong to it

    def feed(self, piece: str) -> list[tuple[str, Any]]:
        """``("content", text)`` and ``("call", {"id", "name", "arguments"})`` items now
        known."""
        self.buf += piece
        out: list[tuple[str, Any]] = []
        if self.bare is None and self.names:
            head = self.buf.lstrip()
            if not head:
                return out
            self.bare = head.startswith("{")
        if self.bare:
            return out
        while True:
            if not self.inside:
                if self.after_call:
                    self.buf = self.buf.lstrip("\n")
                    self.after_call = not self.buf
                i = self.buf.find(OPEN)
                if i < 0:
                    keep = partial_tag(self.buf, (OPEN,))
                    cut = len(self.buf) - keep
                    text, self.buf = self.buf[:cut], self.buf[cut:]
                    if text:
                        out.append(("content", text))
                    return out
                if i > 0:
                    out.append(("content", self.buf[:i]))
                self.buf, self.inside = self.buf[i:], True
            j = self.buf.find(CLOSE)
            if j < 0:
                return out
            body = self.buf[len(OPEN) : j]
            raw = self.buf[: j + len(CLOSE)]
            self.buf, self.inside = self.buf[j + len(CLOSE) :], False
            call = parse_call(body.strip())
            if call is None:
                out.append(("content", raw))
            else:
                self.after_call = True
                call = {"id": call_id(), **call}
                self.calls.append(call)
                out.append(("call", call))

    def flush(self) -> list[tuple[str, Any]]:
        """What is left at the end of the reply (an unfinished call: as content)."""
        rest, self.buf, self.inside = self.buf, "", False
        if self.bare:
            call = parse_call(rest.strip())
            if call is not None and call["name"] in self.names:
                call = {"id": call_id(), **call}
                self.calls.append(call)
                return [("call", call)]
        return [("content", rest)] if rest else []


def split_reply(text: str, names=frozenset()) -> tuple[str, list[dict[str, Any]]]:
    """A whole reply's content and tool calls (``names``: the offered tools)."""
    s = ToolStream(names)
    items = s.feed(text) + s.flush()
    content = "".join(v for k, v in items if k == "content")
    return content, s.calls
