"""Many clients at once: N streaming clients with different prompts and lengths share the
slots (the scheduler's steps decode several rows at once: checked), every greedy reply equals
the same request served alone by a one-slot server, none is lost, usage is exact for each;
prompts longer than a prefill chunk are read in chunks between the others' steps; a
well-behaved client's reply is unchanged while others send bad requests and leave mid-reply;
the slots' caches stay within the model's window."""

from __future__ import annotations

import threading

import httpx
import pytest

pytest.importorskip("openai")
from api_server_support import client, serving, tiny_tools_model  # noqa: E402

N = 8
PROMPTS = [[{"role": "user", "content": "hello " * (1 + 7 * i) + f"number {i}"}] for i in range(N)]
LENGTHS = [5 + 7 * i for i in range(N)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_tools_model(tmp_path_factory.mktemp("load") / "tiny")


@pytest.fixture(scope="module")
def alone(model_dir):
    """Each request's reply from a server with one slot, one request at a time."""
    out = []
    with serving(model_dir, parallel=1) as (served, url):
        c = client(url)
        for msgs, n in zip(PROMPTS, LENGTHS):
            r = c.chat.completions.create(
                model=served.id, messages=msgs, max_tokens=n, temperature=0
            )
            out.append((r.choices[0].message.content, r.usage.completion_tokens))
    return out


def streamed(c, model, msgs, n):
    text, usage, finish = [], None, None
    for ch in c.chat.completions.create(
        model=model,
        messages=msgs,
        max_tokens=n,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if ch.choices:
            text.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
        else:
            usage = ch.usage
    return "".join(text), usage, finish


def run_clients(url, model, chaos=False):
    results, errors = [None] * N, []

    def one(i):
        try:
            results[i] = streamed(client(url), model, PROMPTS[i], LENGTHS[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    def bad():  # malformed bodies and clients that leave mid-reply
        with httpx.Client(timeout=30) as h:
            for k in range(6):
                h.post(url + "/v1/chat/completions", content=b"{oops")
                body = {"messages": PROMPTS[0], "max_tokens": 200, "stream": True}
                with h.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    for _ in zip(range(k + 1), r.iter_lines()):
                        pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    if chaos:
        threads += [threading.Thread(target=bad) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return results


@pytest.mark.parametrize("chunk", [256, 8])
def test_concurrent_streams_equal_the_requests_served_alone(model_dir, alone, chunk):
    with serving(model_dir, parallel=4, prefill_chunk=chunk) as (served, url):
        got = run_clients(url, served.id)
        sch = served.scheduler
        assert sch.max_rows > 1  # steps were shared
        states = sch.stepper.states  # memory bounded: no slot past the window
        assert all(s is None or s.length <= served.window for s in states)
        assert all(len(s.cached) <= served.window for s in sch.slots)
    for (text, usage, finish), (ref, n) in zip(got, alone):
        assert text == ref
        assert usage.completion_tokens == n and finish in ("stop", "length")


def test_a_good_client_beside_bad_and_leaving_ones(model_dir, alone):
    with serving(model_dir, parallel=3) as (served, url):
        got = run_clients(url, served.id, chaos=True)
    assert [g[0] for g in got] == [a[0] for a in alone]
