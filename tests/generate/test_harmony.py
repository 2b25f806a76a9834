"""OpenAI's harmony format (gpt-oss's chat, :mod:`attnlm.tokenizers.harmony`): a reply read
piece by piece at every piece size into its reasoning (the ``analysis`` channel) and its answer
without a marker; ``<|end|>`` no longer ends a reply where the vocabulary has ``<|return|>`` and
``<|call|>`` (llama.cpp's rule); a chat with a harmony vocabulary (a tiny model whose tokens
are scripted) runs past the analysis message to the answer, streams each channel to its own
callback and keeps the answer as the turn; the server's chat reply and stream carry the
reasoning as ``reasoning_content``."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from attnlm.tokenizers.harmony import HarmonyStream, harmony_stops, is_harmony, split_harmony

REPLY = ("<|channel|>analysis<|message|>The user wants 3 + 4 <b>. Answer: 7.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>3 + 4 = 7. Arr, matey!")  # fmt: skip
ANSWER, REASONING = "3 + 4 = 7. Arr, matey!", "The user wants 3 + 4 <b>. Answer: 7."


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, len(REPLY)])
def test_a_reply_fed_in_pieces_splits_into_its_channels(size):
    s, items = HarmonyStream(), []
    for i in range(0, len(REPLY), size):
        items += s.feed(REPLY[i : i + size])
    items += s.flush()
    assert "".join(v for k, v in items if k == "content") == ANSWER
    assert "".join(v for k, v in items if k == "reasoning") == REASONING
    assert all("<|" not in v for _, v in items)  # never a piece of a marker
    kinds = [k for k, _ in items]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # the reasoning came first


def test_replies_without_markers_and_tool_messages():
    assert split_harmony("plain <answer>") == ("plain <answer>", "")
    call = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}'
    assert split_harmony(call) == ('{"a": 1}', "")
    assert split_harmony("<|channel|>analysis<|message|>cut sho") == ("", "cut sho")


def test_end_of_message_is_not_a_stop_in_a_harmony_vocabulary():
    specials = {"<|channel|>": 5, "<|message|>": 6, "<|end|>": 7, "<|return|>": 8, "<|call|>": 9}
    assert is_harmony(specials)
    assert harmony_stops(specials, (7, 2)) == (2, 8, 9)
    chatml = {"<|im_end|>": 3, "<|end|>": 7}
    assert harmony_stops(chatml, (3, 7)) == (3, 7)  # another vocabulary: as it was


@pytest.fixture(scope="module")
def harmony_chat(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from attnlm.loading.sources import resolve
    from support_chat import tiny_harmony_llama

    return resolve(tiny_harmony_llama(tmp_path_factory.mktemp("harmony") / "m"))


def test_a_chat_runs_to_the_answer_and_keeps_it(harmony_chat, monkeypatch):
    from attnlm.generate.chat import ChatSession
    from attnlm.generate.sampling import SamplingConfig

    model, tok, info = harmony_chat
    specials = dict(tok.special_tokens)
    assert specials["<|end|>"] not in info.stop_ids and specials["<|return|>"] in info.stop_ids
    script = tok.encode(REPLY + "<|return|>") + tok.encode("never reached")
    picks = iter(script)
    monkeypatch.setattr(ChatSession, "_pick", lambda self, logits: next(picks))
    session = ChatSession(model, tok, info.chat_template, info.stop_ids,
                          sampling=SamplingConfig(temperature=0, max_new_tokens=200),
                          lookahead=0)  # fmt: skip
    answer, thinking = [], []
    reply = session.reply("hello", on_text=answer.append, on_reasoning=thinking.append)
    assert (reply.text, reply.reasoning, reply.finish) == (ANSWER, REASONING, "end of turn")
    assert "".join(answer) == ANSWER and "".join(thinking) == REASONING
    assert reply.to_json()["reasoning"] == REASONING
    assert session.messages[-1] == {"role": "assistant", "content": ANSWER}


def _served(reply: str):
    """A served harmony model, a one-choice request and its finished reply ``reply``, as the
    server's response code reads them."""
    from attnlm.api.respond import Choice

    specials = {"<|channel|>": 5, "<|message|>": 6, "<|end|>": 7, "<|return|>": 8, "<|call|>": 9}
    served = SimpleNamespace(id="m", tokenizer=SimpleNamespace(special_tokens=specials))
    job = SimpleNamespace(params=SimpleNamespace(logprobs=None), reused=0)
    choice = Choice()
    choice.pieces, choice.finish, choice.tokens = [reply], "stop", 9
    return served, SimpleNamespace(jobs=[job], prompt=[1, 2]), choice


def test_the_server_returns_the_reasoning_apart():
    from attnlm.api.respond import chat_body, chat_stream

    served, request, choice = _served(REPLY)
    message = chat_body(served, request, [choice], None)["choices"][0]["message"]
    assert message["content"] == ANSWER and message["reasoning_content"] == REASONING

    async def stream() -> list[dict]:
        request.events = asyncio.Queue()
        for i in range(0, len(REPLY), 4):
            request.events.put_nowait(("token", 0, REPLY[i : i + 4], None))
        request.events.put_nowait(("end", 0, "stop", 9))
        return [json.loads(c[6:]) for c in [b.decode() async for b in
                                             chat_stream(served, request, None, False)]
                if c.startswith("data: {")]  # fmt: skip

    deltas = [c["choices"][0]["delta"] for c in asyncio.run(stream())]
    assert "".join(d.get("content", "") for d in deltas) == ANSWER
    assert "".join(d.get("reasoning_content", "") for d in deltas) == REASONING


CALLING = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
           "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
           '{"city": "Paris"}')  # fmt: skip


@pytest.mark.parametrize("size", [1, 4, len(CALLING)])
def test_a_message_to_a_function_is_one_call(size):
    s, items = HarmonyStream(), []
    for i in range(0, len(CALLING), size):
        items += s.feed(CALLING[i : i + size])
    items += s.flush()
    calls = [v for k, v in items if k == "call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert "".join(v for k, v in items if k == "content") == ""  # held, not streamed
    assert split_harmony(CALLING) == ('{"city": "Paris"}', "Need the weather.")


def test_the_server_turns_a_harmony_call_into_tool_calls():
    from attnlm.api.respond import chat_body

    served, request, choice = _served(CALLING)
    out = chat_body(served, request, [choice], frozenset({"get_weather"}))["choices"][0]
    message = out["message"]
    assert out["finish_reason"] == "tool_calls" and message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert message["reasoning_content"] == "Need the weather."
