"""Tool calls: the template renders the offered tools (and earlier calls and their results),
a forced call (``tool_choice`` "required" or a named function) is decoded under llguidance's
grammar of ``<tool_call>{"name", "arguments"}</tool_call>`` so even a tiny random model makes
one, and the reply is parsed into ``tool_calls`` (finish_reason ``tool_calls``), whole and
streamed in OpenAI's delta shape. A model that chooses to call a tool on its own ("auto") is
the same parser on text the model wrote; that parser is tested here on scripted replies fed
piece by piece (a tiny random model does not choose tools)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openai")
pytest.importorskip("llguidance")
from api_server_support import client, serving, tiny_tools_model  # noqa: E402

from attnlm.api.tools import ToolStream, split_reply  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "what is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tiny_tools_model(tmp_path_factory.mktemp("tools") / "tiny")
    with serving(folder, parallel=2) as (served, url):
        yield served, url, client(url)


def check_weather_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    assert isinstance(args["city"], str) and len(args["city"]) <= 10


def test_the_template_renders_tools_and_earlier_calls(server):
    import httpx

    served, url, _ = server
    turn = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = httpx.post(
        url + "/tokenize", json={"messages": turn, "tools": [WEATHER], "with_pieces": True}
    ).json()
    text = served.tokenizer.decode(r["tokens"])
    assert "<tools>" in text and json.dumps(WEATHER) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text


def test_a_forced_call_is_parsed(server):
    served, _, c = server
    r = c.chat.completions.create(
        model=served.id,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200,
        temperature=0,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    assert len(ch.message.tool_calls) == 1
    check_weather_call(ch.message.tool_calls[0])


def test_a_required_call_streams_in_the_delta_shape(server):
    served, _, c = server
    chunks = list(
        c.chat.completions.create(
            model=served.id,
            messages=ASK,
            tools=[TIME],
            tool_choice="required",
            max_tokens=200,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    calls = [d.tool_calls for d in deltas if d.tool_calls]
    assert len(calls) == 1 and calls[0][0].index == 0
    call = calls[0][0]
    assert call.type == "function" and call.function.name == "get_time"
    assert -12 <= json.loads(call.function.arguments)["zone"] <= 12
    assert not "".join(d.content or "" for d in deltas).strip()
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0
    whole = c.chat.completions.create(
        model=served.id,
        messages=ASK,
        tools=[TIME],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    assert whole.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens


def test_tool_choice_none_and_auto(server):
    served, _, c = server
    r = c.chat.completions.create(
        model=served.id,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=5,
        temperature=0,
    )
    plain = c.chat.completions.create(model=served.id, messages=ASK, max_tokens=5, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].message.content  # no tools offered
    auto = c.chat.completions.create(
        model=served.id, messages=ASK, tools=[WEATHER], max_tokens=5, temperature=0
    )
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens  # the tools are in the prompt


SCRIPTED = (
    'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
    '{"zone": 1}}\n</tool_call>'
)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(SCRIPTED)])
def test_the_parser_on_a_scripted_reply_fed_in_pieces(size):
    s = ToolStream()
    items = []
    for i in range(0, len(SCRIPTED), size):
        items += s.feed(SCRIPTED[i : i + size])
    items += s.flush()
    content = "".join(v for k, v in items if k == "content")
    calls = [v for k, v in items if k == "call"]
    assert content == "Let me look. "
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "c"}
    assert json.loads(calls[1]["arguments"]) == {"zone": 1}
    # the text before a call comes out before the call arrives, never a piece of "<tool_call>"
    assert all("<" not in v for k, v in items if k == "content")


def test_the_parser_keeps_broken_calls_as_text():
    broken = "a <tool_call>\n{not json}\n</tool_call> b <tool_ca"
    content, calls = split_reply(broken)
    assert calls == [] and content == broken
    assert split_reply("x < y and <tool") == ("x < y and <tool", [])


def test_a_bare_json_call_of_an_offered_tool():
    bare = '{"name": "get_time", "arguments": {"zone": 2}}'
    content, calls = split_reply(bare, frozenset({"get_time"}))
    assert content == "" and calls[0]["name"] == "get_time"
    assert json.loads(calls[0]["arguments"]) == {"zone": 2}
    # not an offered tool, not a call, or no tools offered: the text as it was
    assert split_reply(bare, frozenset({"other"})) == (bare, [])
    assert split_reply('{"a": 1}', frozenset({"get_time"})) == ('{"a": 1}', [])
    assert split_reply(bare) == (bare, [])
    s = ToolStream(frozenset({"get_time"}))
    assert s.feed(bare[:10]) == [] and s.feed(bare[10:]) == []  # held to the end
    assert [k for k, _ in s.flush()] == ["call"]
