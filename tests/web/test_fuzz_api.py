"""Every string field of every JSON endpoint of the explorer, fed what the one strict reader
(``attnlm.base.textio``) refuses: bytes that are not UTF-8 in the body, a lone surrogate (the JSON
escape ``\\ud800``), a NUL, a 10 MB line and an empty string (issue 26). Each answer is a 4xx
with a JSON object ``{"error": one line}``; the endpoints and fields come from the server's own
``SCHEMAS``, so a new endpoint is covered without editing this file.
"""

from __future__ import annotations

import json

import pytest
from web_helpers import request, serving, tiny_checkpoint

from attnlm.web import server as S
from attnlm.web.service import load_service

GOOD = {
    "text": "the bank",
    "word": "bank",
    "sentences": ["the bank", "a river bank"],
    "messages": [{"role": "user", "content": "the bank"}],
    "heads": ["0.0"],
    "clean": "the bank",
    "corrupt": "the river",
    "answer": "bank",
    "wrong": "river",
}
BAD = {
    "lone-surrogate": "a\ud800b",
    "nul": "the\x00bank",
    "huge-line": "a" * (10 * 1024 * 1024),
    "empty": "",
}


def _string_fields():
    for endpoint, (required, optional) in S.SCHEMAS.items():
        for field, (check, _) in {**required, **optional}.items():
            if check("x") or check(["x"]):  # a string field, or a list of strings
                yield endpoint, field, check("x")


FIELDS = list(_string_fields())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = tiny_checkpoint(tmp_path_factory.mktemp("fuzz") / "gpt", words=True)
    yield from serving([load_service(run, name="gpt")])


def _body(endpoint: str, field: str, value, is_str: bool) -> dict:
    required, _ = S.SCHEMAS[endpoint]
    body = {name: GOOD[name] for name in required}
    body[field] = value if is_str else [value, GOOD["text"]]
    return body


def _post_head(server, endpoint: str, body: bytes) -> tuple[int, dict]:
    """POST announcing all of ``body`` but sending only its first 64 KiB, then read the
    answer (the server refuses an oversized body from its Content-Length alone)."""
    import socket

    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        head = (
            f"POST /api/{endpoint} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body[: 64 * 1024])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.partition(b"\r\n\r\n")[2])


def _assert_one_line_4xx(status: int, data) -> str:
    assert 400 <= status < 500, (status, data)
    assert isinstance(data, dict) and set(data) == {"error"}, data
    assert "\n" not in data["error"] and "Traceback" not in data["error"]
    return data["error"]


def test_the_table_covers_every_endpoint():
    assert {e for e, _, _ in FIELDS} == set(S.SCHEMAS)
    assert ("embeddings", "sentences", False) in FIELDS


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize(
    ("endpoint", "field", "is_str"), FIELDS, ids=[f"{e}.{f}" for e, f, _ in FIELDS]
)
def test_bad_strings_are_a_one_line_4xx(server, endpoint, field, is_str, bad):
    body = _body(endpoint, field, BAD[bad], is_str)
    if bad == "huge-line":  # answered before the body is read: send its start only
        status, data = _post_head(server, endpoint, json.dumps(body).encode())
    else:
        status, data = request(server.url + "api/" + endpoint, body)
    message = _assert_one_line_4xx(status, data)
    if bad in ("lone-surrogate", "nul"):  # refused by the reader, naming the field
        assert message.startswith(f"field {field}: "), message


@pytest.mark.parametrize("endpoint", sorted(S.SCHEMAS))
def test_body_bytes_that_are_not_utf8(server, endpoint):
    body = json.dumps(
        _body(endpoint, "text" if "text" in S.SCHEMAS[endpoint][0] else "word", "X", True)
    )
    raw = body.replace("X", "caf\udce9").encode("utf-8", "surrogateescape")  # the byte 0xe9
    status, data = request(server.url + "api/" + endpoint, raw=raw)
    message = _assert_one_line_4xx(status, data)
    assert message.startswith("request body: not valid UTF-8 (bad byte 0xe9 at offset"), message


@pytest.mark.parametrize("bad", ["lone-surrogate", "nul"])
@pytest.mark.parametrize("key", ["role", "content"])
def test_bad_strings_inside_chat_messages(server, key, bad):
    """The chat's messages are objects: their strings follow the same reader's rules."""
    msg = {"role": "user", "content": "the bank", key: BAD[bad]}
    status, data = request(server.url + "api/chat", {"messages": [msg]})
    assert _assert_one_line_4xx(status, data).startswith("field messages: ")


@pytest.mark.parametrize("depth", [201, 100_000])
def test_deeply_nested_body_is_a_400(server, depth):
    """Nesting deep enough for Python's parser to hit its recursion limit was a 500."""
    body = b'{"text": ' + b"[" * depth + b"]" * depth + b"}"
    status, answer = request(server.url + "api/inspect", raw=body)
    assert status == 400, answer
    assert "nested" in answer["error"] and "\n" not in answer["error"]
