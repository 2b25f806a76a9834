"""Running the API under uvicorn on a socket bound here (so port 0 gives a port we know):
in the foreground for ``attnlm serve --api``, or in a thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when ``host`` has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server(app: Any, sock: socket.socket, log_level: str = "warning") -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_keep_alive=30,
                            limit_concurrency=1024)  # fmt: skip
    return uvicorn.Server(config)


def serve_forever(app: Any, sock: socket.socket) -> None:
    server(app, sock, "info").run(sockets=[sock])


class Background:
    """The app served in a daemon thread on ``127.0.0.1`` (``url``); ``stop()`` ends it."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self.server = server(app, self.sock)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)  # fmt: skip
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
