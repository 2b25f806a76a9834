"""HTTP server of the attention explorer: one static page and a JSON API (standard library).

Routes (all JSON answers are objects; errors are ``{"error": "one line"}``):

- ``GET /`` the page; ``GET /static/NAME`` its files (from ``attnlm/web/static/``);
- ``GET /api/models``: ``{"models": [info, ...], "default": name}``;
- ``GET /api/models/NAME``: one model's info (404 when unknown);
- ``POST /api/tokens`` ``{"text", "model"?}``;
- ``POST /api/attention`` ``{"text", "model"?}``;
- ``POST /api/next_tokens`` ``{"text", "model"?, "k"?}``;
- ``POST /api/generate`` ``{"text", "model"?, "max_new_tokens"?, "temperature"?, "top_k"?,
  "top_p"?, "seed"?}``;
- ``POST /api/lens`` ``{"text", "model"?, "k"?}``: models whose info says ``lens: true``;
- ``POST /api/chat`` ``{"messages": [{"role", "content"}, ...], "model"?, "max_new_tokens"?,
  "temperature"?, "top_k"?, "top_p"?, "seed"?}``: models whose info says ``chat: true``
  (greedy unless ``temperature`` > 0);
- ``POST /api/embeddings`` ``{"word", "sentences": [s1, s2], "model"?}``;
- ``POST /api/fill_mask`` ``{"text", "model"?, "k"?}``: models with ``fill-mask`` (BERT);
- ``POST /api/translate`` ``{"text", "model"?, "num_beams"?, ...sampling}``: models with
  ``translate`` (greedy unless ``temperature`` > 0, beam search with ``num_beams`` > 1;
  ``max_new_tokens`` defaults to twice the source length plus 10).
- ``POST /api/ablate`` ``{"text", "heads": ["L.H", ...], "mean"?, "k"?, "model"?}``,
  ``POST /api/patch`` ``{"clean", "corrupt", "answer", "wrong", "model"?}``, ``POST
  /api/heads`` ``{"kind"?, "length"?, "batch"?, "seed"?, "model"?}``: head ablation,
  activation patching and head scores, for models whose info says ``interpret: true``
  (:mod:`attnlm.web.service.interp`).

Status codes: 400 malformed JSON, unknown or mistyped fields, unsupported capability; 404
unknown model or path; 405 wrong method; 413 body or text too long; 500 unexpected failure
(logged with its traceback server-side, never sent). Requests whose ``Host`` is not a loopback
name are refused (403) while the server is bound to loopback (DNS rebinding).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from attnlm.base.errors import AttnlmError, InputError
from attnlm.base.foreign import json_depth_problem
from attnlm.base.textio import decode_text, value_problem
from attnlm.generate.sampling import SamplingConfig
from attnlm.web.service import (
    ModelService,
    ServiceError,
    UnknownModelError,
    sampling_config,
)

log = logging.getLogger("attnlm.web")

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY = 256 * 1024  # bytes of one request body
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
# The page may load only its own files; this also stops any request leaving the machine.
CSP = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; font-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'"
)


class HttpError(Exception):
    """An answer other than 200, with a one-line message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- request bodies ----------------------------------------------------------------------------

_Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _opt(check: _Check) -> _Check:
    return lambda v: v is None or check(v)


_STR = (lambda v: isinstance(v, str), "a string")
_INT = (_is_int, "an integer")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_OPT_INT = (_opt(_is_int), "an integer or null")
_OPT_NUM = (_opt(_is_num), "a number or null")
_SAMPLING = {
    "max_new_tokens": (_is_int, "an integer"),
    "temperature": (_is_num, "a number"),
    "top_k": _OPT_INT,
    "top_p": _OPT_NUM,
    "seed": _OPT_INT,
}
# endpoint -> (required fields, optional fields); every field: (check, description)
SCHEMAS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "tokens": ({"text": _STR}, {"model": _STR}),
    "attention": ({"text": _STR}, {"model": _STR}),
    "next_tokens": ({"text": _STR}, {"model": _STR, "k": (_is_int, "an integer")}),
    "generate": ({"text": _STR}, {"model": _STR, **_SAMPLING}),
    "embeddings": (
        {
            "word": _STR,
            "sentences": (
                lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
                "a list of strings",
            ),
        },
        {"model": _STR},
    ),
    "fill_mask": ({"text": _STR}, {"model": _STR, "k": (_is_int, "an integer")}),
    "lens": ({"text": _STR}, {"model": _STR, "k": (_is_int, "an integer")}),
    "chat": (
        {
            "messages": (
                lambda v: isinstance(v, list) and all(isinstance(m, dict) for m in v),
                "a list of {role, content} objects",
            )
        },
        {"model": _STR, **_SAMPLING},
    ),
    "translate": (
        {"text": _STR},
        {"model": _STR, "num_beams": (_is_int, "an integer"), **_SAMPLING},
    ),
    "ablate": (
        {
            "text": _STR,
            "heads": (
                lambda v: isinstance(v, list) and all(isinstance(h, str) for h in v),
                'a list of "LAYER.HEAD" strings',
            ),
        },
        {"model": _STR, "mean": _BOOL, "k": _INT},
    ),
    "patch": ({"clean": _STR, "corrupt": _STR, "answer": _STR, "wrong": _STR}, {"model": _STR}),
    "heads": ({}, {"model": _STR, "kind": _STR, "length": _INT, "batch": _INT, "seed": _INT}),
}


def check_body(endpoint: str, body: Any) -> dict[str, Any]:
    """``body`` if it is an object with exactly the endpoint's fields, well typed; else 400."""
    required, optional = SCHEMAS[endpoint]
    if not isinstance(body, dict):
        raise HttpError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        allowed = ", ".join(sorted({*required, *optional}))
        raise HttpError(400, f"unknown field(s): {', '.join(unknown)} (allowed: {allowed})")
    for name in required:
        if name not in body:
            raise HttpError(400, f"missing field: {name}")
    for name, value in body.items():
        check, what = {**required, **optional}[name]
        if not check(value):
            raise HttpError(400, f"field {name} must be {what}")
        problem = value_problem(value)
        for item in value if isinstance(value, list) and not problem else []:
            if isinstance(item, dict):  # the chat's messages: the same rules for their texts
                problem = problem or value_problem(list(item.values()))
        if problem:  # a lone surrogate ("\ud800"), a NUL, a huge line: the one reader's rules
            raise HttpError(400, f"field {name}: {problem}")
    return body


def _sampling(body: dict[str, Any], **defaults: Any) -> SamplingConfig:
    return sampling_config(**{**defaults, **{k: body[k] for k in _SAMPLING if k in body}})


# -- the application ----------------------------------------------------------------------------


class Explorer:
    """The served models and the API's dispatch (independent of HTTP, so it is testable)."""

    def __init__(self, services: Sequence[ModelService]) -> None:
        if not services:
            raise AttnlmError("no model to serve: give --checkpoint DIR or --model NAME")
        self.services: dict[str, ModelService] = {}
        for s in services:
            if s.name in self.services:
                raise AttnlmError(f"two models are named {s.name!r}")
            self.services[s.name] = s
        self.default = services[0].name

    def service(self, name: str | None) -> ModelService:
        name = self.default if name is None else name
        if name not in self.services:
            raise UnknownModelError(f"unknown model {name!r} (served: {', '.join(self.services)})")
        return self.services[name]

    def get(self, path: str) -> dict[str, Any]:
        if path == "/api/models":
            return {
                "models": [s.info() for s in self.services.values()],
                "default": self.default,
            }
        if path.startswith("/api/models/"):
            return self.service(unquote(path[len("/api/models/") :])).info()
        if path[len("/api/") :] in SCHEMAS:
            raise HttpError(405, f"{path} takes POST with a JSON body")
        raise HttpError(404, f"no such API endpoint: {path}")

    def post(self, path: str, body: Any) -> dict[str, Any]:
        endpoint = path[len("/api/") :]
        if endpoint not in SCHEMAS:
            if path.startswith("/api/models"):
                raise HttpError(405, f"{path} takes GET")
            raise HttpError(404, f"no such API endpoint: {path}")
        b = check_body(endpoint, body)
        s = self.service(b.get("model"))
        if endpoint == "tokens":
            return s.tokens(b["text"])
        if endpoint == "attention":
            return s.attention(b["text"])
        if endpoint == "next_tokens":
            return s.next_tokens(b["text"], b.get("k", 5))
        if endpoint == "generate":
            return s.generate(b["text"], _sampling(b))
        if endpoint == "embeddings":
            return s.embeddings(b["word"], b["sentences"])
        if endpoint == "fill_mask":
            return s.fill_mask(b["text"], b.get("k", 5))
        if endpoint == "lens":
            return s.lens(b["text"], b.get("k", 5))
        if endpoint == "chat":
            return s.chat(b["messages"], _sampling(b, temperature=0, max_new_tokens=200))
        if endpoint == "ablate":
            return s.ablate(b["text"], b["heads"], b.get("mean", False), b.get("k", 10))
        if endpoint == "patch":
            return s.patch(b["clean"], b["corrupt"], b["answer"], b["wrong"])
        if endpoint == "heads":
            opts = {k: b[k] for k in ("kind", "length", "batch", "seed") if k in b}
            return s.head_scores(**opts)
        return s.translate(
            b["text"], _sampling(b, temperature=0), b.get("max_new_tokens"), b.get("num_beams", 1)
        )


class Handler(BaseHTTPRequestHandler):
    """Serves the page, its static files and the API of ``self.server.explorer``."""

    server: ExplorerServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a silent client may hold its thread
    server_version = "attnlm-explorer"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.info("%s %s", self.address_string(), format % args)

    # -- answers ----------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", CSP)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8")
        self._send(status, body, "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        # a message quoting the request may hold lone surrogates, which UTF-8 cannot encode:
        # escape them, so that every error still gets its answer
        safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
        self._json(status, {"error": safe})

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            if not self._host_ok():
                raise HttpError(403, "requests must name a loopback host (127.0.0.1 or localhost)")
            fn()
        except HttpError as e:
            self._error(e.status, str(e))
        except ServiceError as e:
            self._error(e.status, str(e))
        except AttnlmError as e:
            self._error(400, str(e))
        except Exception:  # noqa: BLE001 - any bug: log it, answer 500, keep serving
            log.exception("error while answering %s %s", self.command, self.path)
            self._error(500, "internal error while answering this request (see the server log)")

    def _host_ok(self) -> bool:
        if not self.server.loopback_only:
            return True
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            host = host[: host.find("]") + 1]
        else:
            host = host.rsplit(":", 1)[0]
        return host.lower() in LOOPBACK_HOSTS

    # -- methods ----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._guard(self._get)

    def do_HEAD(self) -> None:  # noqa: N802
        self._guard(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._guard(self._post)

    def _get(self) -> None:
        path = urlsplit(self.path).path
        if path.startswith("/api/"):
            self._json(200, self.server.explorer.get(path))
            return
        if path in ("/", "/index.html"):
            self._static("index.html")
            return
        if path.startswith("/static/"):
            self._static(unquote(path[len("/static/") :]))
            return
        if path == "/favicon.ico":
            self._send(204, b"", "image/x-icon")
            return
        raise HttpError(404, f"not found: {path}")

    def _static(self, name: str) -> None:
        files = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()}
        if name not in files:  # only the package's own files, no path traversal
            raise HttpError(404, f"not found: /static/{name}")
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        self._send(200, files[name].read_bytes(), ctype)

    def _post(self) -> None:
        path = urlsplit(self.path).path
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise HttpError(411, "send the body with a Content-Length (no chunked encoding)")
        try:
            n = int(length or 0)
        except ValueError:
            self.close_connection = True
            raise HttpError(400, "bad Content-Length") from None
        if n < 0 or n > MAX_BODY:
            self.close_connection = True  # the body is not read: drop the connection after
            raise HttpError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(n)
        if not path.startswith("/api/"):
            raise HttpError(404, f"not found: {path}")
        try:
            text = decode_text(raw, "request body", empty_ok=True, name_line=False)
        except InputError as e:
            raise HttpError(400, str(e)) from None
        problem = json_depth_problem(text)  # Python's parser would hit its recursion limit
        if problem:
            raise HttpError(400, f"malformed JSON body ({problem})")
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise HttpError(400, f"malformed JSON body ({e})") from None
        self._json(200, self.server.explorer.post(path, body))


class ExplorerServer(ThreadingHTTPServer):
    """A threading HTTP server holding the :class:`Explorer` it serves."""

    daemon_threads = True
    request_queue_size = 128  # 100 concurrent clients connect without refusals

    def __init__(self, address: tuple[str, int], explorer: Explorer) -> None:
        self.explorer = explorer
        self.loopback_only = address[0] in LOOPBACK_HOSTS or address[0].startswith("127.")
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/"


def make_server(
    services: Sequence[ModelService], host: str = "127.0.0.1", port: int = 8000
) -> ExplorerServer:
    """A bound (not yet serving) explorer server; port 0 picks a free port."""
    return ExplorerServer((host, port), Explorer(services))


def serve_in_thread(server: ExplorerServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread (tests, notebooks)."""
    t = threading.Thread(target=server.serve_forever, name="attnlm-explorer", daemon=True)
    t.start()
    return t
