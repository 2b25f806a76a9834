"""Answers of the generating endpoints, whole or streamed (server-sent events in OpenAI's
chunk shapes): a request's events (:class:`~attnlm.api.job.Request`) gathered into the
``chat.completion`` / ``text_completion`` objects, or sent as ``chat.completion.chunk`` /
``text_completion`` chunks ending in ``data: [DONE]``."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from attnlm.api.protocol import ApiError
from attnlm.api.tools import ToolStream, split_reply
from attnlm.tokenizers.harmony import (
    HarmonyStream,
    harmony_parts,
    is_harmony,
    special_tokens_of,
    split_harmony,
)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


class Choice:
    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.logprobs: list[dict] = []
        self.finish: str | None = None
        self.tokens = 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def token_entry(tokenizer: Any, lp: dict) -> dict[str, Any]:
    """One token's ``logprobs.content`` entry (chat)."""

    def one(tok: int, value: float) -> dict[str, Any]:
        raw = _bytes(tokenizer, tok)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value,
                "bytes": list(raw)}  # fmt: skip

    entry = one(lp["id"], lp["logprob"])
    entry["top_logprobs"] = [one(t, v) for t, v in lp["top"]]
    return entry


def _bytes(tokenizer: Any, tok: int) -> bytes:
    if hasattr(tokenizer, "token_bytes"):
        return tokenizer.token_bytes(tok)
    return tokenizer.decode([tok]).encode()


def _event(request: Any, item: tuple, choices: list[Choice]) -> None:
    kind, index = item[0], item[1]
    if kind == "error":
        raise ApiError(500, f"the decoder failed: {item[2]}", None, "server_error")
    c = choices[index]
    if kind == "token":
        if item[2]:
            c.pieces.append(item[2])
        if item[3] is not None:
            c.logprobs.append(item[3])
    else:
        c.finish, c.tokens = item[2], item[3]


async def gather(request: Any) -> list[Choice]:
    """Every choice of ``request`` once all have ended."""
    choices = [Choice() for _ in request.jobs]
    while any(c.finish is None for c in choices):
        _event(request, await request.events.get(), choices)
    return choices


def usage(request: Any, completion: int) -> dict[str, Any]:
    """OpenAI's usage: the prompt counted once, the completion over all choices, and in
    ``prompt_tokens_details.cached_tokens`` the prompt ids read from a slot's cache rather
    than computed (prompt caching; with ``n`` choices, the fewest any choice found)."""
    prompt = len(request.prompt)
    cached = min((job.reused for job in request.jobs), default=0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def chat_body(served: Any, request: Any, choices: list[Choice], tools: Any) -> dict:
    out = []
    harmony = is_harmony(special_tokens_of(served.tokenizer))
    for i, c in enumerate(choices):
        text, reasoning, calls = c.text, "", []
        if harmony and tools:  # (gpt-oss: its channels; the analysis is llama.cpp's server's key)
            text, reasoning, calls = harmony_parts(c.text)
        elif harmony:  # (without tools offered, a call's arguments are text)
            text, reasoning = split_harmony(c.text)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if reasoning:
            message["reasoning_content"] = reasoning
        finish = c.finish
        if tools:
            content, found = split_reply(text, tools)
            calls += found
            if calls:
                message["content"] = content.strip() or None
                message["tool_calls"] = [_call(call) for call in calls]
                finish = "tool_calls"
        lps = None
        if request.jobs[i].params.logprobs is not None:
            lps = {"content": [token_entry(served.tokenizer, lp) for lp in c.logprobs],
                   "refusal": None}  # fmt: skip
        out.append({"index": i, "message": message, "logprobs": lps, "finish_reason": finish})
    return envelope(new_id("chatcmpl"), "chat.completion", int(time.time()), served, out,
                    usage=usage(request, sum(c.tokens for c in choices)))  # fmt: skip


def _call(call: dict, index: int | None = None) -> dict[str, Any]:
    out = {"id": call["id"], "type": "function",
           "function": {"name": call["name"], "arguments": call["arguments"]}}  # fmt: skip
    return out if index is None else {"index": index, **out}


def completion_logprobs(served: Any, lps: list[dict], start: int) -> dict[str, Any]:
    """The legacy ``logprobs`` object: tokens, their log probabilities, the top ones as
    ``{token: logprob}``, each token's offset in the choice's text (from ``start``)."""
    tokens, values, tops, offsets = [], [], [], []
    at = start
    for lp in lps:
        text = _label(served, lp["id"])
        tokens.append(text)
        values.append(lp["logprob"])
        top = lp.get("top")
        tops.append(None if top is None else {_label(served, t): v for t, v in top})
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}  # fmt: skip


def _label(served: Any, tok: int) -> str:
    return _bytes(served.tokenizer, tok).decode("utf-8", errors="replace")


def completion_body(served: Any, request: Any, choices: list[Choice], echo: str | None,
                    echo_lps: list[dict] | None) -> dict:  # fmt: skip
    out = []
    for i, c in enumerate(choices):
        head = echo or ""
        lps = None
        if request.jobs[i].params.logprobs is not None:
            lps = completion_logprobs(served, (echo_lps or []) + c.logprobs, 0)
        out.append({"index": i, "text": head + c.text, "logprobs": lps,
                    "finish_reason": c.finish})  # fmt: skip
    return envelope(new_id("cmpl"), "text_completion", int(time.time()), served, out,
                    usage=usage(request, sum(c.tokens for c in choices)))  # fmt: skip


def envelope(rid: str, kind: str, created: int, served: Any, choices: list, **more: Any) -> dict:
    """One reply or chunk of kind ``kind`` (``object``): its id, time, model and choices, then
    ``more`` (``usage``)."""
    return {"id": rid, "object": kind, "created": created, "model": served.id,
            "system_fingerprint": None, "choices": choices, **more}  # fmt: skip


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def chat_stream(served: Any, request: Any, tools: Any, include_usage: bool
                      ) -> AsyncIterator[bytes]:  # fmt: skip
    """The chat chunks (see the module docstring)."""
    rid, created = new_id("chatcmpl"), int(time.time())
    n = len(request.jobs)
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, finish: str | None = None, lps: Any = None) -> bytes:
        one = {"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}
        return sse(envelope(rid, "chat.completion.chunk", created, served, [one], **extra))

    splitters = [ToolStream(tools) if tools else None for _ in range(n)]
    harmony = is_harmony(special_tokens_of(served.tokenizer))
    channels = [HarmonyStream() if harmony else None for _ in range(n)]

    def split(i: int, text: str, end: bool = False) -> list[tuple[str, Any]]:
        """A piece (or the end) of reply ``i`` as delta items: reasoning (a harmony reply's
        analysis), content, tool calls."""
        h, s = channels[i], splitters[i]
        parts = (h.flush() if end else h.feed(text)) if h else [("content", text)]
        items: list[tuple[str, Any]] = []
        for kind, value in parts:
            if kind == "call" and s is not None:  # a harmony call (tools were offered)
                s.calls.append(value)
                items.append((kind, value))
            elif kind == "call":
                items.append(("content", value["arguments"]))
            elif kind == "reasoning" or s is None:
                items += [(kind, value)] if value else []
            else:
                items += s.feed(value)
        return items + (s.flush() if end and s is not None else [])

    ended = [False] * n
    total = 0
    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    while not all(ended):
        item = await request.events.get()
        if item[0] == "error":
            yield sse(ApiError(500, f"the decoder failed: {item[2]}").body())
            break
        i = item[1]
        wants_lp = request.jobs[i].params.logprobs is not None
        if item[0] == "token":
            lps = None
            if item[3] is not None and wants_lp:
                lps = {"content": [token_entry(served.tokenizer, item[3])], "refusal": None}
            s = splitters[i]
            items = split(i, item[2])
            if not items and lps is not None:
                items = [("content", "")]
            for k, (kind, value) in enumerate(items):
                yield _delta(chunk, i, kind, value, s, lps if k == 0 else None)
            continue
        s, finish = splitters[i], item[2]
        for kind, value in split(i, "", end=True):
            yield _delta(chunk, i, kind, value, s, None)
        if s is not None and s.calls:
            finish = "tool_calls"
        yield chunk(i, {}, finish)
        ended[i], total = True, total + item[3]
    if include_usage and all(ended):
        yield sse(envelope(rid, "chat.completion.chunk", created, served, [],
                           usage=usage(request, total)))  # fmt: skip
    yield b"data: [DONE]\n\n"


def _delta(chunk, i: int, kind: str, value: Any, splitter: Any, lps: Any) -> bytes:
    if kind in ("content", "reasoning"):
        key = "content" if kind == "content" else "reasoning_content"
        return chunk(i, {key: value}, None, lps)
    index = splitter.calls.index(value)
    return chunk(i, {"tool_calls": [_call(value, index)]}, None, lps)


async def completion_stream(served: Any, request: Any, echo: str | None, include_usage: bool
                            ) -> AsyncIterator[bytes]:  # fmt: skip
    rid, created = new_id("cmpl"), int(time.time())
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, text: str, finish: str | None = None, lps: Any = None) -> bytes:
        one = {"index": index, "text": text, "logprobs": lps, "finish_reason": finish}
        return sse(envelope(rid, "text_completion", created, served, [one], **extra))

    n = len(request.jobs)
    if echo:
        for i in range(n):
            yield chunk(i, echo)
    ended, total = [False] * n, 0
    offsets = [len(echo or "")] * n
    while not all(ended):
        item = await request.events.get()
        if item[0] == "error":
            yield sse(ApiError(500, f"the decoder failed: {item[2]}").body())
            break
        i = item[1]
        if item[0] == "token":
            lps = None
            if item[3] is not None and request.jobs[i].params.logprobs is not None:
                lps = completion_logprobs(served, [item[3]], offsets[i])
            offsets[i] += len(item[2])
            yield chunk(i, item[2], None, lps)
        else:
            yield chunk(i, "", item[2])
            ended[i], total = True, total + item[3]
    if include_usage and all(ended):
        yield sse(envelope(rid, "text_completion", created, served, [],
                           usage=usage(request, total)))  # fmt: skip
    yield b"data: [DONE]\n\n"


async def until_disconnect(receive) -> None:
    """Returns when the client has gone away (an ASGI ``http.disconnect``)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def gather_or_leave(request: Any, receive) -> list[Choice] | None:
    """:func:`gather`, or None when the client disconnects first."""
    work = asyncio.ensure_future(gather(request))
    gone = asyncio.ensure_future(until_disconnect(receive))
    done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        gone.cancel()
        return work.result()
    work.cancel()
    return None
