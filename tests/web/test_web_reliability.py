"""Outputs are what they claim (docs/reliability.md), the explorer's part: ``serve --host ''``
is refused in one line (it would bind every interface), and an error message that UTF-8
cannot encode still gets its answer."""

from __future__ import annotations

from web_helpers import post, serving, tiny_checkpoint

from attnlm.base.errors import InputError
from attnlm.web.service import load_service
from support import run_cli


def test_serve_refuses_an_empty_host(tmp_path, capsys):
    run = tiny_checkpoint(tmp_path / "char")
    r = run_cli(capsys, "serve", "--checkpoint", run, "--host", "", "--port", "0")
    assert r.code == 2 and "--host" in r.err and len(r.err.strip().splitlines()) == 1


def test_an_error_utf8_cannot_encode_still_gets_an_answer(tmp_path, monkeypatch):
    gen = serving([load_service(tiny_checkpoint(tmp_path / "char"), name="char")])
    server = next(gen)
    try:

        def fail(path, body):
            raise InputError("bad text '\udc80' in the request")

        monkeypatch.setattr(server.explorer, "post", fail)
        status, doc = post(server, "tokens", {"model": "char", "text": "ab"})
        assert status == 400 and doc["error"] == "bad text '\\udc80' in the request"
    finally:
        next(gen, None)
