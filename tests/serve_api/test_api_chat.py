"""The API through the official ``openai`` client on loopback, a tiny chat model behind it:
models and health, a chat reply equal to ``attnlm chat``'s (ChatSession, the existing decode
path) token for token, streamed chat in OpenAI's chunk shapes with exact usage, n, seeds,
stop strings, logit bias, log probabilities, completions with echo and logprobs against a
forward pass, /tokenize and /detokenize, JSON output under a schema that validates, and the
next turn of a chat read from the slot's cache."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("openai")
pytest.importorskip("llguidance")
from api_server_support import client, reuse_seen, serving, tiny_tools_model  # noqa: E402

from attnlm.generate.chat import ChatSession  # noqa: E402
from attnlm.generate.sampling import SamplingConfig  # noqa: E402
from attnlm.loading.sources import resolve  # noqa: E402

HELLO = [{"role": "user", "content": "hello, what is the capital of France?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_tools_model(tmp_path_factory.mktemp("api") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir):
    with serving(model_dir, parallel=4) as (served, url):
        yield served, url, client(url)


def reference_reply(model_dir, messages, n):
    """The greedy reply of ``attnlm chat``'s session (no lookahead: one token per pass)."""
    model, tok, info = resolve(str(model_dir), "cpu")
    s = ChatSession(
        model,
        tok,
        info.chat_template,
        info.stop_ids,
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=n),
        lookahead=0,
    )
    s.messages = list(messages)
    return s.reply(None)


def test_models_and_health(server):
    served, url, c = server
    models = c.models.list().data
    assert [m.id for m in models] == [served.id] and models[0].owned_by == "attnlm"
    assert c.models.retrieve(served.id).id == served.id
    import urllib.request

    health = json.loads(urllib.request.urlopen(url + "/health").read())
    assert health["status"] == "ok" and health["slots"] == 4


def test_chat_equals_the_chat_session(server, model_dir):
    served, _, c = server
    r = c.chat.completions.create(model=served.id, messages=HELLO, max_tokens=12, temperature=0)
    ref = reference_reply(model_dir, HELLO, 12)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ("length" if ref.finish == "length" else "stop")
    assert r.usage.prompt_tokens == ref.prompt_tokens
    assert r.usage.completion_tokens == len(ref.ids) == 12
    assert r.usage.total_tokens == ref.prompt_tokens + 12


def test_content_parts_and_max_completion_tokens(server):
    served, _, c = server
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hello, what is "},
                {"type": "text", "text": "the capital of France?"},
            ],
        }
    ]
    a = c.chat.completions.create(
        model=served.id, messages=parts, max_completion_tokens=6, temperature=0
    )
    b = c.chat.completions.create(model=served.id, messages=HELLO, max_tokens=6, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == 6


def test_streamed_chat_chunk_shapes_and_usage(server):
    served, _, c = server
    whole = c.chat.completions.create(model=served.id, messages=HELLO, max_tokens=10, temperature=0)
    chunks = list(
        c.chat.completions.create(
            model=served.id,
            messages=HELLO,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    first, *middle, finish, last = chunks
    assert all(ch.object == "chat.completion.chunk" and ch.id == first.id for ch in chunks)
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(ch.usage is None for ch in chunks[:-1])
    assert all(ch.choices[0].finish_reason is None and ch.choices[0].delta.content for ch in middle)
    text = "".join(ch.choices[0].delta.content for ch in middle)
    assert text == whole.choices[0].message.content
    assert finish.choices[0].finish_reason == "length" and finish.choices[0].delta.content is None
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.total_tokens == whole.usage.total_tokens
    # the same prompt again: all of it held but its last id, fed again for its logits
    cached = last.usage.prompt_tokens_details.cached_tokens
    assert cached == whole.usage.prompt_tokens - 1
    # without include_usage no usage chunk is sent
    plain = list(
        c.chat.completions.create(
            model=served.id, messages=HELLO, max_tokens=3, temperature=0, stream=True
        )
    )
    assert plain[-1].choices[0].finish_reason == "length" and plain[-1].usage is None


def test_logprobs_are_the_log_softmax_of_the_model(server, model_dir):
    served, _, c = server
    r = c.chat.completions.create(
        model=served.id, messages=HELLO, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    model, tok, info = resolve(str(model_dir), "cpu")
    text = info.chat_template.render(HELLO, add_generation_prompt=True)
    new = reference_reply(model_dir, HELLO, 4).ids
    assert [bytes(e.bytes) for e in content] == [tok.token_bytes(i) for i in new]
    ids = list(tok.encode(text)) + new
    with torch.no_grad():
        logits = model(ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    start = len(ids) - 4
    for k, e in enumerate(content):
        row = lp[start - 1 + k]
        assert e.logprob == pytest.approx(float(row.max()), abs=1e-4)  # greedy: the top one
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(
            row.topk(3).values.tolist(), abs=1e-4
        )
        assert e.top_logprobs[0].token == e.token


def test_n_seed_stop_and_logit_bias(server):
    served, _, c = server
    kw = dict(model=served.id, messages=HELLO, max_tokens=8)
    a = c.chat.completions.create(**kw, temperature=1.0, seed=7, n=3)
    b = c.chat.completions.create(**kw, temperature=1.0, seed=7, n=3)
    assert [x.index for x in a.choices] == [0, 1, 2]
    assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices]
    assert (
        a.usage.completion_tokens == sum(len(x) for x in [[0] * 8] * 3)
        and a.usage.prompt_tokens == b.usage.prompt_tokens
    )
    greedy = c.chat.completions.create(**kw, temperature=0).choices[0].message.content
    stop = greedy[3:5]
    cut = c.chat.completions.create(**kw, temperature=0, stop=[stop]).choices[0]
    assert cut.message.content == greedy[: greedy.index(stop)] and cut.finish_reason == "stop"
    # a +100 bias on one id makes it every greedy token
    target = served.tokenizer.encode(" Paris")[0]
    biased = c.chat.completions.create(**kw, temperature=0, logit_bias={str(target): 100})
    assert biased.choices[0].message.content == served.tokenizer.decode([target] * 8)
    # a frequency penalty changes a reply that repeats itself, presence alike
    pen = c.chat.completions.create(
        **kw,
        temperature=0,
        logit_bias={str(target): 5},
        frequency_penalty=2.0,
        presence_penalty=2.0,
    )
    assert pen.choices[0].message.content != biased.choices[0].message.content


def test_completions_with_echo_and_logprobs(server, model_dir):
    served, _, c = server
    prompt = "the capital of France is"
    r = c.completions.create(
        model=served.id, prompt=prompt, max_tokens=5, temperature=0, logprobs=2, echo=True
    )
    ch = r.choices[0]
    assert r.object == "text_completion" and ch.text.startswith(prompt)
    ids = served.tokenizer.encode(prompt)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 5
    lp = ch.logprobs
    assert len(lp.tokens) == len(ids) + 5 and lp.token_logprobs[0] is None
    model, tok, _ = resolve(str(model_dir), "cpu")
    full = list(ids)
    with torch.no_grad():
        for _ in range(5):  # greedy by hand: a whole forward per token
            full.append(int(model(ids=torch.tensor([full])).logits[0, -1].argmax()))
        ref = torch.log_softmax(model(ids=torch.tensor([full])).logits[0].float(), -1)
    assert lp.tokens == [tok.token_bytes(i).decode("utf-8", "replace") for i in full]
    for t in range(1, len(full)):
        assert lp.token_logprobs[t] == pytest.approx(float(ref[t - 1, full[t]]), abs=1e-4)
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(len(lp.tokens))]
    by_ids = c.completions.create(model=served.id, prompt=ids, max_tokens=5, temperature=0)
    assert prompt + by_ids.choices[0].text == ch.text
    streamed = list(
        c.completions.create(
            model=served.id, prompt=prompt, max_tokens=5, temperature=0, stream=True
        )
    )
    assert "".join(x.choices[0].text for x in streamed) == by_ids.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_tokenize_and_detokenize(server):
    import httpx

    served, url, _ = server
    ids = served.tokenizer.encode("hello Paris")
    r = httpx.post(url + "/tokenize", json={"content": "hello Paris"}).json()
    assert r["tokens"] == ids and r["count"] == len(ids)
    back = httpx.post(url + "/detokenize", json={"tokens": ids}).json()
    assert back["content"] == "hello Paris"
    chat = httpx.post(url + "/tokenize", json={"messages": HELLO}).json()
    text = served.template.render(HELLO, add_generation_prompt=True)
    assert chat["tokens"] == served.tokenizer.encode(text)


def test_json_schema_output_validates(server):
    served, _, c = server
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "rank": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    r = c.chat.completions.create(
        model=served.id, messages=HELLO, max_tokens=60, temperature=0, response_format=fmt
    )
    data = json.loads(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    assert set(data) == {"city", "rank"} and isinstance(data["city"], str)
    assert len(data["city"]) <= 12 and isinstance(data["rank"], int) and 0 <= data["rank"] <= 99
    obj = c.chat.completions.create(
        model=served.id,
        messages=HELLO,
        max_tokens=60,
        seed=1,
        temperature=1.0,
        response_format={"type": "json_object"},
    )
    choice = obj.choices[0]
    if choice.finish_reason == "stop":  # an object that closed within 60 tokens
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.startswith("{")


def test_next_turn_reads_the_cached_prefix(server):
    served, _, c = server
    first = c.chat.completions.create(model=served.id, messages=HELLO, max_tokens=6, temperature=0)
    turn = HELLO + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and of Italy?"},
    ]
    with reuse_seen(served.scheduler) as seen:
        again = c.chat.completions.create(
            model=served.id, messages=turn, max_tokens=6, temperature=0
        )
    assert seen and seen[0] >= first.usage.prompt_tokens  # the first turn came from the cache
    assert again.usage.prompt_tokens_details.cached_tokens == seen[0]
    assert math.isfinite(again.usage.prompt_tokens)
    with serving(served.info.path, parallel=1) as (fresh, url):
        alone = client(url).chat.completions.create(
            model=fresh.id, messages=turn, max_tokens=6, temperature=0
        )
    assert alone.choices[0].message.content == again.choices[0].message.content
    assert alone.usage.prompt_tokens_details.cached_tokens == 0  # a fresh server holds nothing


def test_max_tokens_zero_gives_the_prompt_usage_alone(server):
    served, _, c = server
    r = c.completions.create(model=served.id, prompt="the capital", max_tokens=0, temperature=0)
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == 2
