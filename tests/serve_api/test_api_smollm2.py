"""The API over real models (slow; skipped when the files are not in attnlm's cache):
SmolLM2-135M-Instruct's GGUF names Paris, streams the same reply it gives whole, gives four
concurrent clients (and eight streaming ones on the C engine) the replies each gets alone,
writes JSON that validates against a schema; MiniLM's /v1/embeddings equal ``attnlm embed``'s
vectors; Qwen2.5-Coder-0.5B-Instruct, offered a tool through its own template, calls it
(parsed into ``tool_calls``)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

pytest.importorskip("openai")
pytest.importorskip("gguf")
from api_server_support import client, serving  # noqa: E402

from gguf_support import smollm2_file  # noqa: E402

pytestmark = pytest.mark.slow
PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def cached(name):
    from attnlm.data.corpus import cache_dir
    from attnlm.data.pretrained import PRETRAINED

    spec = PRETRAINED[name]
    folder = cache_dir() / "pretrained" / spec.name
    if not folder.is_dir():
        pytest.skip(f"{name} is not in attnlm's cache")
    return name


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_file(fetch=False)
    with serving(path, parallel=4, name="smollm2") as (served, url):
        yield served, client(url)


def test_smollm2_chat_stream_and_concurrency(smollm2):
    served, c = smollm2
    r = c.chat.completions.create(model="smollm2", messages=PARIS, max_tokens=24, temperature=0)
    assert "Paris" in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    parts = list(
        c.chat.completions.create(
            model="smollm2",
            messages=PARIS,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == r.choices[0].message.content
    # the same counts; the second request may find the first's prompt in a slot's cache
    streamed = parts[-1].usage
    assert (streamed.prompt_tokens, streamed.completion_tokens, streamed.total_tokens) == (
        r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens)  # fmt: skip
    asks = [
        [{"role": "user", "content": q}]
        for q in ("Name a color.", "What is 2 + 2?", "Say hello in French.", "Name a planet.")
    ]
    alone = [
        c.chat.completions.create(model="smollm2", messages=m, max_tokens=16, temperature=0)
        .choices[0]
        .message.content
        for m in asks
    ]
    got = [None] * 4

    def one(i):
        got[i] = (
            c.chat.completions.create(
                model="smollm2", messages=asks[i], max_tokens=16, temperature=0
            )
            .choices[0]
            .message.content
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert got == alone and served.scheduler.max_rows > 1


def test_smollm2_eight_streams_on_the_engine():
    """Eight streaming clients at once on eight slots of the C engine (the file's own Q4
    blocks), each reply the one the same server gives it alone."""
    from attnlm.api.steppers import engine_rows
    from attnlm.runtime.engine import Engine

    if not engine_rows(Engine):
        pytest.skip("the engine has no rows API")
    path = smollm2_file(fetch=False)
    asks = [[{"role": "user", "content": f"Count from {i} to {i + 5}."}] for i in range(8)]
    with serving(path, parallel=8, threads=2) as (served, url):
        assert served.backend == "c-engine"
        c = client(url)

        def ask(m, stream):
            kw = dict(model=served.id, messages=m, max_tokens=32, temperature=0)
            if not stream:
                return c.chat.completions.create(**kw).choices[0].message.content
            parts = c.chat.completions.create(**kw, stream=True)
            return "".join(p.choices[0].delta.content or "" for p in parts if p.choices)

        alone = [ask(m, False) for m in asks]
        got = [None] * 8
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, ask(asks[i], True)))
                   for i in range(8)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert got == alone and served.scheduler.max_rows > 4


def test_smollm2_json_schema(smollm2):
    served, c = smollm2
    schema = {
        "type": "object",
        "properties": {
            "capital": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["capital", "country"],
        "additionalProperties": False,
    }
    r = c.chat.completions.create(
        model="smollm2",
        messages=PARIS,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"capital", "country"} and "Paris" in data["capital"]


def test_minilm_embeddings_equal_attnlm_embed(cli):
    name = cached("minilm")
    sentences = ["The cat sits outside", "A man is playing guitar", "The new movie is awesome"]
    out = cli("embed", "--model", name, *sentences, "--json")
    assert out.code == 0, out.err
    cosine = np.array(json.loads(out.out)["cosine"])
    with serving(name) as (served, url):
        data = client(url).embeddings.create(model=served.id, input=sentences).data
    emb = np.array([d.embedding for d in data])
    assert emb.shape == (3, 384)
    np.testing.assert_allclose(emb @ emb.T, cosine, atol=1e-5)


def test_qwen_calls_an_offered_tool():
    name = cached("qwen2.5-coder-0.5b-instruct")
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    with serving(name, parallel=2) as (served, url):
        c = client(url)
        r = c.chat.completions.create(
            model=served.id, messages=ask, tools=[tool], max_tokens=48, temperature=0
        )
        chunks = list(
            c.chat.completions.create(
                model=served.id,
                messages=ask,
                tools=[tool],
                max_tokens=48,
                temperature=0,
                stream=True,
            )
        )
    streamed = [d.tool_calls[0] for d in (x.choices[0].delta for x in chunks) if d.tool_calls]
    assert len(streamed) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    ch = r.choices[0]
    assert streamed[0].function.arguments == ch.message.tool_calls[0].function.arguments
    assert ch.finish_reason == "tool_calls", ch.message.content
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert "Paris" in json.loads(call.function.arguments)["city"]
