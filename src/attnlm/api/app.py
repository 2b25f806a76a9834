"""The OpenAI-compatible HTTP API (Starlette, served by uvicorn): ``GET /v1/models``,
``/health``; ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/tokenize``, ``/detokenize``. Every error answers in OpenAI's shape (``{"error": {"message",
"type", "param", "code"}}``) with 400, 401, 404, 413, 429 or 503; see ``docs/server.md``."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from attnlm.api import protocol as P
from attnlm.api import respond as R
from attnlm.api.job import Request
from attnlm.api.protocol import ApiError
from attnlm.api.scheduler import Closed, QueueFull
from attnlm.base.errors import AttnlmError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_response(e: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


class Api:
    """The routes over one :class:`~attnlm.api.served.Served` model; ``api_key``: the Bearer
    token every route but ``/health`` needs (None: none)."""

    def __init__(self, served: Any, api_key: str | None = None) -> None:
        self.served, self.api_key = served, api_key
        self.limits = served.limits

    # -- common --------------------------------------------------------------------------------

    def check_key(self, req: HttpRequest) -> None:
        if self.api_key is None:
            return
        got = req.headers.get("authorization", "")
        if not (got.startswith("Bearer ") and secrets.compare_digest(got[7:], self.api_key)):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                           "invalid_api_key")  # fmt: skip

    async def body(self, req: HttpRequest) -> dict:
        self.check_key(req)
        limit = self.limits.max_body_bytes
        declared = req.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body is over {limit:,} bytes", None,
                           "request_too_large")  # fmt: skip
        data = bytearray()
        async for part in req.stream():
            data += part
            if len(data) > limit:
                raise ApiError(413, f"the request body is over {limit:,} bytes", None,
                               "request_too_large")  # fmt: skip
        try:
            body = json.loads(bytes(data) or b"null")
        except ValueError:
            raise ApiError(400, "the request body is not JSON", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
        return body

    def model(self, body: dict, generate: bool = True) -> Any:
        name = body.get("model")
        s = self.served
        if name is not None and name != s.id:
            raise ApiError(404, f"the model {name!r} does not exist (this server: {s.id!r})",
                           "model", "model_not_found")  # fmt: skip
        if generate and not s.generates:
            raise ApiError(400, f"{s.id} does not generate text (an encoder: /v1/embeddings)",
                           "model", "model_not_supported")  # fmt: skip
        if not generate and not s.embeds:
            raise ApiError(400, f"{s.id} makes no sentence embeddings (not an encoder)",
                           "model", "model_not_supported")  # fmt: skip
        return s

    def submit(self, prompt: list[int], params: list, receive_ok: bool = True) -> Request:
        s = self.served
        request = Request(prompt, params, s.context, time.monotonic() + self.limits.request_seconds)
        try:
            s.scheduler.submit(request)
        except QueueFull:
            raise ApiError(429, "the server is busy: too many requests wait; try again later",
                           None, "queue_full") from None  # fmt: skip
        except Closed:
            raise ApiError(503, "the server is shutting down", None, "unavailable") from None
        return request

    @staticmethod
    def cancel(request: Request, scheduler: Any) -> None:
        request.cancelled = True
        scheduler.wake()

    # -- routes --------------------------------------------------------------------------------

    async def models(self, req: HttpRequest) -> Response:
        self.check_key(req)
        s = self.served
        card = {"id": s.id, "object": "model", "created": s.created, "owned_by": "attnlm"}
        if "name" in req.path_params:
            if req.path_params["name"] != s.id:
                raise ApiError(404, f"the model {req.path_params['name']!r} does not exist",
                               "model", "model_not_found")  # fmt: skip
            return JSONResponse(card)
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, req: HttpRequest) -> Response:
        sch = self.served.scheduler
        info: dict[str, Any] = {"status": "ok", "model": self.served.id}
        if sch is not None:
            info.update(slots=len(sch.slots), busy=sch.busy, waiting=len(sch.waiting))
        return JSONResponse(info)

    async def chat(self, req: HttpRequest) -> Response:
        body = await self.body(req)
        s = self.model(body)
        samp = P.sampling(body, self.limits, int(s.tokenizer.vocab_size), "max_completion_tokens")
        msgs = P.messages(body)
        offered, forced = P.tools(body)
        fmt, schema = P.response_format(body)
        want_lp = P.boolean(body, "logprobs")
        top = P.integer(body, "top_logprobs", 0, P.MAX_TOP_LOGPROBS, None)
        if top is not None and not want_lp:
            raise P.bad("top_logprobs", "needs logprobs: true")
        try:
            prompt = s.encode(s.render(msgs, offered))
            room = s.room(prompt, samp.max_tokens)
            grammar = None
            if forced is not None:
                if fmt != "text":
                    raise P.bad("response_format", "cannot be combined with a forced tool call")
                grammar = s.grammars.tool_call(forced)
            elif fmt != "text":
                grammar = s.grammars.json_schema(schema)
        except AttnlmError as e:
            raise ApiError(400, str(e), "messages", "invalid_value") from None
        lp = (top or 0) if want_lp else None
        request = self.submit(prompt, samp.params(room, lp, grammar))
        tools = frozenset(t["function"]["name"] for t in offered or ()) or None
        if samp.stream:
            return self.stream(request, R.chat_stream(s, request, tools, samp.include_usage))
        choices = await self.wait(request, req)
        return JSONResponse(R.chat_body(s, request, choices, tools))

    async def completions(self, req: HttpRequest) -> Response:
        body = await self.body(req)
        s = self.model(body)
        samp = P.sampling(body, self.limits, int(s.tokenizer.vocab_size))
        prompt = P.prompt_ids(s, body)
        echo = P.boolean(body, "echo")
        lp = P.integer(body, "logprobs", 0, 5, None)
        try:
            room = s.room(prompt, 16 if samp.max_tokens is None else samp.max_tokens)
        except AttnlmError as e:
            raise ApiError(400, str(e), "prompt", "invalid_value") from None
        echo_text = s.decode(prompt) if echo else None
        echo_lps = None
        if echo and lp is not None and not samp.stream:
            try:
                logits = await asyncio.wrap_future(s.prompt_logits(prompt))
            except Closed:
                raise ApiError(503, "the server is shutting down", None, "unavailable") from None
            echo_lps = s.prompt_logprobs(prompt, lp, logits)
        request = self.submit(prompt, samp.params(room, lp, None))
        if samp.stream:
            return self.stream(request, R.completion_stream(s, request, echo_text,
                                                            samp.include_usage))  # fmt: skip
        choices = await self.wait(request, req)
        return JSONResponse(R.completion_body(s, request, choices, echo_text, echo_lps))

    def stream(self, request: Request, chunks) -> StreamingResponse:
        sch = self.served.scheduler

        async def guarded():
            try:
                async for c in chunks:
                    yield c
            finally:  # the end, or the client went away: the slot is freed either way
                self.cancel(request, sch)

        return StreamingResponse(guarded(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def wait(self, request: Request, req: HttpRequest) -> list:
        try:
            choices = await R.gather_or_leave(request, req.receive)
        finally:
            self.cancel(request, self.served.scheduler)
        if choices is None:  # nobody to answer
            raise ApiError(400, "the client disconnected", None, "client_disconnected")
        return choices

    async def embeddings(self, req: HttpRequest) -> Response:
        from starlette.concurrency import run_in_threadpool

        body = await self.body(req)
        s = self.model(body, generate=False)
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if (
            not isinstance(texts, list)
            or not texts
            or not all(isinstance(t, str) and t for t in texts)
        ):
            raise P.bad("input", "expected a non-empty string or list of non-empty strings")
        if len(texts) > self.limits.max_inputs:
            raise P.bad("input", f"at most {self.limits.max_inputs} inputs per request")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise P.bad("encoding_format", 'expected "float" or "base64"')
        if body.get("dimensions") is not None:
            raise P.bad("dimensions", "this model's embeddings have one width")
        emb, tokens = await run_in_threadpool(s.embed_counted, texts)
        data = []
        for i, row in enumerate(np.asarray(emb, dtype="<f4")):
            vec = base64.b64encode(row.tobytes()).decode() if fmt == "base64" else row.tolist()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        used = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": s.id, "usage": used})

    async def tokenize(self, req: HttpRequest) -> Response:
        body = await self.body(req)
        s = self.model(body, generate=False) if not self.served.generates else self.model(body)
        try:
            if "messages" in body:
                offered, _ = P.tools(body)
                ids = s.encode(s.render(P.messages(body), offered))
            else:
                text = body.get("content", body.get("prompt"))
                if not isinstance(text, str):
                    raise P.bad("content", "expected a string")
                ids = s.encode(text) if text else []
        except AttnlmError as e:
            raise ApiError(400, str(e), "content", "invalid_value") from None
        out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": s.window}
        if P.boolean(body, "with_pieces"):
            out["pieces"] = [R._label(s, i) for i in ids]
        return JSONResponse(out)

    async def detokenize(self, req: HttpRequest) -> Response:
        body = await self.body(req)
        s = self.model(body, generate=False) if not self.served.generates else self.model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise P.bad("tokens", "expected a list of token ids")
        try:
            s.check_ids(ids, "tokens")
        except AttnlmError as e:
            raise ApiError(400, str(e), "tokens", "invalid_value") from None
        return JSONResponse({"content": s.decode(ids) if ids else ""})


def make_app(served: Any, api_key: str | None = None) -> Starlette:
    """The Starlette application of :class:`Api` over ``served``."""
    api = Api(served, api_key)

    def guarded(handler):
        async def endpoint(req: HttpRequest) -> Response:
            try:
                return await handler(req)
            except ApiError as e:
                return error_response(e)
            except AttnlmError as e:  # a bad input found deeper down: one line, 400
                return error_response(ApiError(400, str(e), None, "invalid_value"))

        return endpoint

    routes = [
        Route("/v1/models", guarded(api.models), methods=["GET"]),
        Route("/v1/models/{name:path}", guarded(api.models), methods=["GET"]),
        Route("/health", guarded(api.health), methods=["GET"]),
        Route("/v1/chat/completions", guarded(api.chat), methods=["POST"]),
        Route("/v1/completions", guarded(api.completions), methods=["POST"]),
        Route("/v1/embeddings", guarded(api.embeddings), methods=["POST"]),
        Route("/tokenize", guarded(api.tokenize), methods=["POST"]),
        Route("/detokenize", guarded(api.detokenize), methods=["POST"]),
    ]

    async def http_error(req: HttpRequest, exc: HTTPException) -> Response:
        if exc.status_code == 405:
            e = ApiError(405, f"{req.method} is not allowed on {req.url.path}", None,
                         "method_not_allowed")  # fmt: skip
        else:
            e = ApiError(exc.status_code, f"no such path: {req.url.path}", None, "not_found")
        return error_response(e)

    async def server_error(req: HttpRequest, exc: Exception) -> Response:
        return error_response(ApiError(500, f"internal error ({type(exc).__name__})"))

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error,
                                                        Exception: server_error})  # fmt: skip
