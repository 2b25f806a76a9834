"""``ChatSession``: greedy replies equal ``transformers``' ``generate`` on the prompt
``apply_chat_template`` renders, turn after turn; the cache is reused (only the new suffix is
prefilled) and cut back when the re-rendered conversation differs from what it holds; the
replies with and without the cache, and with and without lookahead drafts, are the same."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.generate.chat import ChatSession, _common_prefix
from attnlm.generate.sampling import SamplingConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")

from support_chat import tiny_chat_llama  # noqa: E402

N = 12


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from attnlm.loading.sources import resolve

    folder = tiny_chat_llama(tmp_path_factory.mktemp("chat") / "llama")
    model, tok, info = resolve(folder)
    ref = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tok, info, ref, ref_tok


def reference_reply(ref, ref_tok, messages, stop_ids):
    ids = ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        out = ref.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=N, eos_token_id=list(stop_ids),
                           pad_token_id=0)  # fmt: skip
    new = out[0, x.size(1) :].tolist()
    for i, t in enumerate(new):
        if t in stop_ids:
            return new[:i]
    return new


@pytest.mark.parametrize(("use_cache", "lookahead"), [(True, 8), (True, 0), (False, 8)])
def test_turns_equal_transformers_generate(chat_model, use_cache, lookahead):
    model, tok, info, ref, ref_tok = chat_model
    session = ChatSession(model, tok, info.chat_template, info.stop_ids,
                          sampling=SamplingConfig(temperature=0, max_new_tokens=N),
                          system="You are terse.", use_cache=use_cache,
                          lookahead=lookahead)  # fmt: skip
    for turn, user in enumerate(["hello", "the capital of France?", "Paris"]):
        before = list(session.messages)
        reply = session.reply(user)
        expected = reference_reply(ref, ref_tok, before + [{"role": "user", "content": user}],
                                   set(info.stop_ids))  # fmt: skip
        assert reply.ids == expected, f"turn {turn}"
        assert reply.text == tok.decode(expected)
        assert session.messages[-1] == {"role": "assistant", "content": reply.text}
        if use_cache and turn > 0:
            assert 0 < reply.reused < reply.prompt_tokens
            assert reply.prefilled == reply.prompt_tokens - reply.reused


def test_drafts_give_the_same_replies_in_fewer_passes(chat_model):
    """Greedy replies with lookahead drafts equal one-token-per-pass replies over three turns
    (the last one ended by the window), each turn reusing the cache the drafts left (a reply
    may end inside an accepted draft); the random model repeats itself, so drafts are taken."""
    model, tok, info, _, _ = chat_model
    sampling = SamplingConfig(temperature=0, max_new_tokens=40)
    replies, passes = {}, {}
    for lookahead in (0, 8):
        session = ChatSession(model, tok, info.chat_template, info.stop_ids, sampling=sampling,
                              lookahead=lookahead)  # fmt: skip
        feed, count = session._feed_every, [0]

        def counted(ids, feed=feed, count=count):
            count[0] += 1
            return feed(ids)

        session._feed_every = counted
        replies[lookahead] = [session.reply(u) for u in ("hello", "the capital?", "Paris")]
        passes[lookahead] = count[0]
        assert len(session.cached) == session.state.length  # the ids the state holds
    plain, drafted = replies[0], replies[8]
    assert [r.ids for r in drafted] == [r.ids for r in plain]
    assert [r.finish for r in drafted] == [r.finish for r in plain]
    assert plain[-1].finish == "window" and drafted[1].reused > 0
    assert passes[0] == 0  # one token per pass never checks drafts
    assert 0 < passes[8] < sum(len(r.ids) for r in drafted) - 3  # fewer passes than tokens


def test_cache_is_cut_back_when_the_history_changes(chat_model):
    model, tok, info, ref, ref_tok = chat_model
    sampling = SamplingConfig(temperature=0, max_new_tokens=N)
    session = ChatSession(model, tok, info.chat_template, info.stop_ids, sampling=sampling)
    session.reply("hello")
    session.messages[-1]["content"] = "the capital of France is Paris."  # edited history
    session.set_system("You are a helpful assistant.")  # a new first message too
    reply = session.reply("and of Italy?")
    fresh = ChatSession(model, tok, info.chat_template, info.stop_ids, sampling=sampling)
    fresh.messages = [dict(m) for m in session.messages[:-1]]
    again = fresh.reply(None)
    assert reply.ids == again.ids and reply.reused < reply.prompt_tokens
    expected = reference_reply(ref, ref_tok, session.messages[:-1], set(info.stop_ids))
    assert reply.ids == expected
    session.reset()
    assert session.messages == [] and session.cached == []


def test_stop_string_and_errors(chat_model):
    model, tok, info, _, _ = chat_model
    with pytest.raises(InputError, match="no chat template"):
        ChatSession(model, tok, None)
    sampling = SamplingConfig(temperature=0, max_new_tokens=N)
    session = ChatSession(model, tok, info.chat_template, info.stop_ids, sampling=sampling)
    full = session.reply("hello")
    if len(full.text) > 2:
        stop = full.text[1:3]
        s2 = ChatSession(model, tok, info.chat_template, info.stop_ids,
                         sampling=sampling.with_(stop=(stop,)))  # fmt: skip
        cut = s2.reply("hello")
        assert cut.finish == "stop string" and cut.text == full.text[: full.text.index(stop)]
    long = ChatSession(model, tok, info.chat_template, info.stop_ids, sampling=sampling)
    with pytest.raises(InputError, match="window"):
        long.reply("hello " * 300)
    assert long.messages == []  # the refused turn is not kept


def test_common_prefix():
    assert _common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert _common_prefix([], [1]) == 0 and _common_prefix([1, 2], [1, 2, 3]) == 2
