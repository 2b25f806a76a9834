"""Every error in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``, one
line, no traceback) with its status: 400 bad fields and bodies, 401 without the key, 404 an
unknown model or path, 413 a body over the limit, 429 a full queue, 503 a server shutting
down; the limits on max_tokens, n and the prompt; a request past its time ends with what it
has; a client that goes away frees its slot; a bad request beside a good one leaves the good
one's reply as it is."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytest.importorskip("openai")
import openai  # noqa: E402
from api_server_support import client, serving, tiny_tools_model  # noqa: E402

from attnlm.api.served import Limits  # noqa: E402

KEY = "s3cret-key"
HI = [{"role": "user", "content": "hello"}]
LIMITS = Limits(
    max_body_bytes=4096,
    max_tokens=64,
    max_n=2,
    max_queue=1,
    request_seconds=30,
    max_prompt_tokens=200,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_tools_model(tmp_path_factory.mktemp("errors") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir):
    with serving(model_dir, api_key=KEY, parallel=1, limits=LIMITS) as (served, url):
        yield served, url


def post(url, path, body, key=KEY, raw=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        return httpx.post(url + path, content=raw, headers=headers, timeout=60)
    return httpx.post(url + path, json=body, headers=headers, timeout=60)


def check(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "\n" not in err["message"] and "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def chat(served, **fields):
    return {"model": served.id, "messages": HI, "max_tokens": 4, **fields}


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 3}, "n"),
        ({"max_tokens": 65}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"stop": [1]}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({"response_format": {"type": "xml"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_fields_are_400_naming_the_field(server, fields, param):
    served, url = server
    err = check(post(url, "/v1/chat/completions", chat(served, **fields)), 400, param)
    assert err["type"] == "invalid_request_error"


def test_bad_bodies_and_prompts(server):
    served, url = server
    check(post(url, "/v1/chat/completions", None, raw=b"{not json"), 400, code="invalid_json")
    check(post(url, "/v1/chat/completions", None, raw=b"[1, 2]"), 400, code="invalid_json")
    check(post(url, "/v1/completions", {"model": served.id, "prompt": ""}), 400, "prompt")
    check(post(url, "/v1/completions", {"model": served.id, "prompt": [1, 10**6]}), 400, "prompt")
    long = {"model": served.id, "prompt": [5] * 300}
    assert "300 tokens; at most 200" in check(post(url, "/v1/completions", long), 400)["message"]
    check(post(url, "/v1/embeddings", {"model": served.id, "input": "x"}), 400, "model")
    check(post(url, "/detokenize", {"tokens": [1, "a"]}), 400, "tokens")


def test_401_404_405_and_413(server):
    served, url = server
    r = post(url, "/v1/chat/completions", chat(served), key=None)
    assert check(r, 401, code="invalid_api_key")["type"] == "authentication_error"
    check(post(url, "/v1/chat/completions", chat(served), key="wrong"), 401)
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/health").status_code == 200  # health needs no key
    check(
        post(url, "/v1/chat/completions", chat(served, model="gpt-4o")),
        404,
        "model",
        "model_not_found",
    )
    check(httpx.get(url + "/v1/nothing"), 404)
    check(httpx.get(url + "/v1/chat/completions"), 405)
    big = chat(served, messages=[{"role": "user", "content": "x" * 5000}])
    check(post(url, "/v1/chat/completions", big), 413, code="request_too_large")
    # the client raises its own classes for them
    c = client(url, key=KEY)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=HI)
    with pytest.raises(openai.AuthenticationError):
        client(url, key="bad").models.list()
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=served.id, messages=HI, temperature=9)


def test_429_when_the_queue_is_full_and_slots_freed_by_leaving(server):
    served, url = server
    head = {"Authorization": f"Bearer {KEY}"}
    never_ends = {str(i): -100 for i in served.stop_ids}  # all 64 tokens, no end of turn
    body = chat(served, max_tokens=64, stream=True, temperature=0, logit_bias=never_ends)
    sch = served.scheduler
    step = sch._decode
    sch._decode = lambda: (time.sleep(0.1), step())  # a slow model: A holds its slot >= 6.4 s
    try:
        _fill_the_queue(served, url, head, body)
        left = time.monotonic()  # both went away mid-reply: the slot is freed at once
        while (sch.busy or sch.waiting) and time.monotonic() < left + 2.0:
            time.sleep(0.01)
        assert sch.busy == 0 and not sch.waiting  # long before A's 64 slow steps (6.4 s)
    finally:
        sch._decode = step
    ok = post(url, "/v1/chat/completions", chat(served))
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def _until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def _fill_the_queue(served, url, head, body):
    sch = served.scheduler
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        with a.stream("POST", url + "/v1/chat/completions", json=body, headers=head) as ra:
            next(ra.iter_lines())
            _until(lambda: sch.busy == 1 and not sch.waiting)  # A holds the one slot
            with b.stream("POST", url + "/v1/chat/completions", json=body, headers=head) as rb:
                _until(lambda: len(sch.waiting) == 1)  # B waits
                r = post(url, "/v1/chat/completions", chat(served))
                check(r, 429, code="queue_full")
                assert r.json()["error"]["type"] == "rate_limit_error"
                assert rb.status_code == 200 and sch.busy == 1


def test_a_request_past_its_time_ends_with_what_it_has(model_dir):
    limits = Limits(request_seconds=0.3, max_tokens=2000)
    with serving(model_dir, parallel=2, limits=limits) as (served, url):
        r = client(url).completions.create(
            model=served.id, prompt="the", max_tokens=1900, temperature=0
        )
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens < 1900
        served.scheduler.close()
        check(httpx.post(url + "/v1/completions", json={"prompt": "the", "max_tokens": 2}), 503)


def test_a_bad_request_beside_a_good_one(server):
    import threading

    served, url = server
    c = client(url, key=KEY)
    alone = c.chat.completions.create(model=served.id, messages=HI, max_tokens=16, temperature=0)
    got = {}

    def good():
        got["r"] = c.chat.completions.create(
            model=served.id, messages=HI, max_tokens=16, temperature=0
        )

    t = threading.Thread(target=good)
    t.start()
    for _ in range(5):
        check(
            post(url, "/v1/chat/completions", None, raw=json.dumps({"messages": 3}).encode()), 400
        )
    t.join(60)
    assert got["r"].choices[0].message.content == alone.choices[0].message.content


def test_a_client_that_stops_waiting_frees_its_slot(server):
    served, url = server
    sch = served.scheduler
    step = sch._decode
    sch._decode = lambda: (time.sleep(0.05), step())  # 64 steps: ~3 s if nobody left
    never_ends = {str(i): -100 for i in served.stop_ids}
    try:
        with pytest.raises(httpx.ReadTimeout):  # not streamed: the client gives up waiting
            httpx.post(
                url + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json=chat(served, max_tokens=64, logit_bias=never_ends),
                timeout=0.5,
            )
        left = time.monotonic()
        _until(lambda: sch.busy == 0, 1.5)
        assert time.monotonic() - left < 1.5
    finally:
        sch._decode = step
