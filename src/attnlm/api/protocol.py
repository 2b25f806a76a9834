"""The request bodies of the OpenAI API, checked: every field the server takes (see
``docs/server.md``) read into a prompt and one :class:`~attnlm.api.job.Params` per choice, or
an :class:`ApiError` in OpenAI's shape naming the field (``param``). Fields the server does not
use (``user``, ``metadata``, ...) are ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from attnlm.api.job import Params
from attnlm.base.errors import AttnlmError

MAX_STOP = 4  # stop sequences per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error",
             404: "invalid_request_error", 413: "invalid_request_error",
             429: "rate_limit_error", 503: "server_error", 500: "server_error"}  # fmt: skip

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = self.TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}  # fmt: skip


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param, "invalid_value")


def number(body: dict, key: str, lo: float, hi: float, default: Any) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(key, f"expected a number, got {json.dumps(v)[:40]}")
    if not lo <= v <= hi:
        raise bad(key, f"must be between {lo} and {hi}, got {v}")
    return v


def integer(body: dict, key: str, lo: int, hi: int, default: Any) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(key, f"expected an integer, got {json.dumps(v)[:40]}")
    if not lo <= v <= hi:
        raise bad(key, f"must be between {lo} and {hi}, got {v}")
    return v


def boolean(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(key, "expected true or false")
    return v


def stops(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v) or len(v) > MAX_STOP:
        raise bad("stop", f"expected a string or a list of at most {MAX_STOP} strings")
    return tuple(s for s in v if s)


def logit_bias(body: dict, vocab: int) -> tuple[tuple[int, float], ...]:
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad("logit_bias", "expected an object mapping token ids to numbers")
    out = []
    for k, b in v.items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise bad("logit_bias", f"{k!r} is not a token id") from None
        if not 0 <= tok < vocab:
            raise bad("logit_bias", f"token id {tok} is not in the vocabulary")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad("logit_bias", f"the bias of {tok} must be a number in [-100, 100]")
        out.append((tok, float(b)))
    return tuple(out)


@dataclass
class Sampling:
    """The fields every generating endpoint shares."""

    n: int
    max_tokens: int | None
    temperature: float
    top_p: float | None
    seed: int | None
    stop: tuple[str, ...]
    bias: tuple[tuple[int, float], ...]
    presence: float
    frequency: float
    stream: bool
    include_usage: bool

    def params(self, room: int, logprobs: int | None, grammar: Any) -> list[Params]:
        return [
            Params(max_tokens=room, temperature=self.temperature, top_p=self.top_p,
                   seed=self.seed, stop=self.stop, logprobs=logprobs, logit_bias=self.bias,
                   presence_penalty=self.presence, frequency_penalty=self.frequency,
                   grammar=grammar)
            for _ in range(self.n)
        ]  # fmt: skip


def sampling(body: dict, limits: Any, vocab: int, max_key: str = "max_tokens") -> Sampling:
    max_tokens = integer(body, max_key, 0, limits.max_tokens, None)
    if max_key == "max_tokens" or max_tokens is None:
        max_tokens = integer(body, "max_tokens", 0, limits.max_tokens, max_tokens)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", "expected an object")
    stream = boolean(body, "stream")
    if options is not None and not stream:
        raise bad("stream_options", "is only allowed with stream: true")
    top_p = number(body, "top_p", 0.0, 1.0, None)
    if top_p is not None and top_p <= 0:
        raise bad("top_p", "must be greater than 0")
    return Sampling(
        n=integer(body, "n", 1, limits.max_n, 1),
        max_tokens=max_tokens,
        temperature=float(number(body, "temperature", 0.0, 2.0, 1.0)),
        top_p=top_p,
        seed=integer(body, "seed", -(2**63), 2**63 - 1, None),
        stop=stops(body),
        bias=logit_bias(body, vocab),
        presence=float(number(body, "presence_penalty", -2.0, 2.0, 0.0)),
        frequency=float(number(body, "frequency_penalty", -2.0, 2.0, 0.0)),
        stream=stream,
        include_usage=boolean(options or {}, "include_usage"),
    )


def message_text(content: Any, where: str) -> str:
    """A message's content: a string, a list of ``{"type": "text", "text": ...}`` parts, or
    None (an assistant turn that only calls tools)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if (
                not isinstance(p, dict)
                or p.get("type") != "text"
                or not isinstance(p.get("text"), str)
            ):
                raise bad(f"{where}.content[{i}]", 'only {"type": "text"} parts are taken')
            parts.append(p["text"])
        return "".join(parts)
    raise bad(f"{where}.content", "expected a string or a list of text parts")


def messages(body: dict) -> list[dict]:
    v = body.get("messages")
    if not isinstance(v, list) or not v:
        raise bad("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(where, "expected an object with a role")
        msg = dict(m, content=message_text(m.get("content"), where))
        calls = m.get("tool_calls")
        if calls is not None:  # arguments as objects, the way chat templates write them
            if not isinstance(calls, list):
                raise bad(f"{where}.tool_calls", "expected a list")
            msg["tool_calls"] = [_call_for_template(c, f"{where}.tool_calls") for c in calls]
        out.append({k: v for k, v in msg.items() if v is not None})
    return out


def _call_for_template(call: Any, where: str) -> dict:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise bad(where, "each tool call needs a function object")
    f = dict(call["function"])
    if isinstance(f.get("arguments"), str):
        try:
            f["arguments"] = json.loads(f["arguments"])
        except ValueError:
            raise bad(where, "function.arguments is not JSON") from None
    return dict(call, function=f)


def tools(body: dict) -> tuple[list[dict] | None, Any]:
    """``tools`` and ``tool_choice``: the tools offered (None: none, or ``tool_choice:
    none``) and the ones a reply must call (None: the model chooses)."""
    offered, choice = body.get("tools"), body.get("tool_choice")
    if offered is None:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", "needs tools")
        return None, None
    if not isinstance(offered, list) or not offered:
        raise bad("tools", "expected a non-empty list of function tools")
    for i, t in enumerate(offered):
        f = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(f, dict)
                and isinstance(f.get("name"), str) and f["name"]):  # fmt: skip
            raise bad(f"tools[{i}]", 'expected {"type": "function", "function": {"name": ...}}')
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"tools[{i}].function.parameters", "expected a JSON schema object")
    if choice in (None, "auto"):
        return offered, None
    if choice == "none":
        return None, None
    if choice == "required":
        return offered, offered
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        chosen = [t for t in offered if t["function"]["name"] == name]
        if not chosen:
            raise bad("tool_choice", f"names no offered tool ({name!r})")
        return offered, chosen
    raise bad("tool_choice", 'expected "none", "auto", "required" or a function')


def response_format(body: dict) -> tuple[str, dict | None]:
    """``("text" | "json_object" | "json_schema", schema)``."""
    v = body.get("response_format")
    if v is None:
        return "text", None
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "text":
        return "text", None
    if kind == "json_object":
        return kind, None
    if kind == "json_schema":
        spec = v.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "expected a JSON schema object")
        return kind, schema
    raise bad("response_format", 'type must be "text", "json_object" or "json_schema"')


def prompt_ids(served: Any, body: dict) -> list[int]:
    """``/v1/completions``' prompt: a string, a list of token ids, or a list of one of them."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    try:
        if isinstance(p, str) and p:
            return served.encode(p, specials=True)
        if (
            isinstance(p, list)
            and p
            and all(isinstance(i, int) and not isinstance(i, bool) for i in p)
        ):
            return served.check_ids(list(p), "prompt")
    except AttnlmError as e:
        raise bad("prompt", str(e)) from None
    raise bad("prompt", "expected a non-empty string or list of token ids (one prompt)")
