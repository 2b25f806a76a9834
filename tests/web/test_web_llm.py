"""The explorer on a Hugging Face Llama folder with a chat template (the tiny random ChatML
model of ``tests/support_chat.py``): the info's ``chat``/``lens`` flags, attention against
``transformers``' own weights, ``POST /api/lens`` (every row against ``transformers``' hidden
states read through its norm and head; the last row equals ``/api/next_tokens``), ``POST
/api/chat`` against :class:`attnlm.generate.chat.ChatSession` and ``transformers``' greedy
``generate`` on the same conversation, turn after turn with the cache reused, and the one-line
answers for what the endpoints refuse."""

from __future__ import annotations

import pytest
import torch
from web_helpers import post, request, serving, tiny_checkpoint

from attnlm.generate.chat import ChatSession
from attnlm.generate.sampling import SamplingConfig
from attnlm.loading.sources import resolve
from attnlm.web.service import MAX_CHAT_MESSAGES, load_service

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")

from support_chat import tiny_chat_llama  # noqa: E402

TEXT = "the capital of France is Paris"
N = 12  # new tokens per reply


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_chat_llama(tmp_path_factory.mktemp("web-llm") / "llama")


@pytest.fixture(scope="module")
def hf(folder):
    return transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    gpt = tiny_checkpoint(tmp_path_factory.mktemp("web-llm-gpt") / "gpt", words=True)
    services = [load_service(model=str(folder), name="llama"), load_service(gpt, name="gpt")]
    yield from serving(services)


def test_info_says_chat_and_lens(server):
    models = {m["name"]: m for m in request(server.url + "api/models")[1]["models"]}
    llama, gpt = models["llama"], models["gpt"]
    assert (llama["family"], llama["n_layer"], llama["n_head"]) == ("llama", 2, 4)
    assert llama["chat"] is True and llama["lens"] is True
    assert gpt["chat"] is False and gpt["lens"] is True  # a GPT has ln_f and an LM head
    assert llama["sample"]["note"] == ""  # the whole sample fits


def test_attention_equals_transformers(server, folder, hf):
    status, rec = post(server, "attention", {"text": TEXT, "model": "llama"})
    assert status == 200
    ids = post(server, "tokens", {"text": TEXT, "model": "llama"})[1]["ids"]
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_attentions=True).attentions  # L x (1, H, T, T)
    got = torch.tensor(rec["attention"])  # (L, H, T, T)
    assert got.shape == (2, 4, len(ids), len(ids))
    torch.testing.assert_close(got, torch.cat(ref).double().float(), atol=2e-6, rtol=0)


def test_lens_rows_equal_transformers_and_last_row_equals_next_tokens(server, hf):
    status, lens = post(server, "lens", {"text": TEXT, "model": "llama", "k": 3})
    assert status == 200 and lens["k"] == 3
    ids = lens["ids"]
    assert [r["layer"] for r in lens["layers"]] == ["embed", "layer 1", "layer 2"]
    assert all(len(r["positions"]) == len(ids) for r in lens["layers"])
    with torch.no_grad():
        hs = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        rows = [hf.model.norm(h) for h in hs[:-1]] + [hs[-1]]  # HF's last one is normed
        ref_p, ref_i = torch.softmax(hf.lm_head(torch.cat(rows)), -1).topk(3, -1)  # (L+1, T, 3)
    got_i = torch.tensor([[[c["id"] for c in p] for p in r["positions"]] for r in lens["layers"]])
    got_p = torch.tensor([[[c["prob"] for c in p] for p in r["positions"]] for r in lens["layers"]])
    assert torch.equal(got_i[:, :, 0], ref_i[:, :, 0])
    torch.testing.assert_close(got_p, ref_p, atol=2e-6, rtol=0)

    nxt = post(server, "next_tokens", {"text": TEXT, "model": "llama", "k": 3})[1]
    last = lens["layers"][-1]["positions"]
    assert [[c["id"] for c in p] for p in last] == [[c["id"] for c in p] for p in nxt["next"]]
    for p, q in zip(last, nxt["next"]):
        assert [c["prob"] for c in p] == pytest.approx([c["prob"] for c in q], abs=2e-6)


def test_lens_refusals(server, monkeypatch):
    from attnlm.web.service import llm

    assert post(server, "lens", {"text": TEXT, "model": "llama", "k": 0})[0] == 400
    monkeypatch.setattr(llm, "MAX_LENS_LOGITS", 1000)
    status, err = post(server, "lens", {"text": TEXT, "model": "llama"})
    assert status == 413 and "logits; the limit is 1,000 (shorten the text)" in err["error"]


def _reference_reply(folder, messages):
    """ChatSession's greedy reply to ``messages`` in a fresh session, and transformers'."""
    model, tok, info = resolve(folder)
    session = ChatSession(model, tok, info.chat_template, info.stop_ids,
                          sampling=SamplingConfig(temperature=0.0, max_new_tokens=N))  # fmt: skip
    session.messages = [dict(m) for m in messages]
    reply = session.reply(None)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    prompt = getattr(prompt, "input_ids", prompt)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    out = hf.generate(prompt, max_new_tokens=N, do_sample=False, eos_token_id=list(info.stop_ids),
                      pad_token_id=0)[0, prompt.shape[1]:].tolist()  # fmt: skip
    return reply, [t for t in out if t not in info.stop_ids][: len(out)]


def test_chat_turns_equal_chat_session_and_transformers(server, folder):
    msgs = [{"role": "user", "content": "hello"}]
    status, first = post(server, "chat", {"model": "llama", "messages": msgs,
                                          "max_new_tokens": N})  # fmt: skip
    assert status == 200, first
    ref, hf_ids = _reference_reply(folder, msgs)
    assert first["reply"] == ref.text and first["tokens"] == ref.ids == hf_ids
    assert first["finish"] == ref.finish and first["reused_tokens"] == 0
    assert set(first["timings"]) == {"prefill_s", "decode_s", "tokens_per_s"}

    msgs += [{"role": "assistant", "content": first["reply"]},
             {"role": "user", "content": "the capital of France?"}]  # fmt: skip
    status, second = post(server, "chat", {"model": "llama", "messages": msgs,
                                           "max_new_tokens": N})  # fmt: skip
    assert status == 200, second
    ref, hf_ids = _reference_reply(folder, msgs)
    assert second["reply"] == ref.text and second["tokens"] == ref.ids == hf_ids
    assert second["reused_tokens"] > 0  # the first turn came from the kept cache
    assert second["prefilled_tokens"] == second["prompt_tokens"] - second["reused_tokens"]

    # a different conversation afterwards: the cache is cut back, the answer is unchanged
    other = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    status, third = post(server, "chat", {"model": "llama", "messages": other,
                                          "max_new_tokens": N})  # fmt: skip
    ref, _ = _reference_reply(folder, other)
    assert status == 200 and third["tokens"] == ref.ids


def test_chat_sampling_with_a_seed_repeats(server):
    body = {"model": "llama", "messages": [{"role": "user", "content": "hello"}],
            "max_new_tokens": 8, "temperature": 1.5, "seed": 7}  # fmt: skip
    a, b = post(server, "chat", body)[1], post(server, "chat", body)[1]
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) >= 1


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}, 400,
         "gpt has no chat template"),
        ({"model": "llama", "messages": []}, 400, "messages is empty"),
        ({"model": "llama", "messages": [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "yes"}]}, 400,
         "the last message must be the user's"),
        ({"model": "llama", "messages": [{"role": "robot", "content": "hi"}]}, 400,
         "role 'robot' is not one of system, user, assistant"),
        ({"model": "llama", "messages": [{"role": "user"}]}, 400, "'content' must be a string"),
        ({"model": "llama", "messages": "hi"}, 400, "field messages must be a list"),
        ({"model": "llama", "messages": [{"role": "user", "content": "a" * 2001}]}, 413,
         "messages[0] is 2001 characters long; the limit is 2000"),
        ({"model": "llama", "messages": [{"role": "user", "content": "a" * 2000}] * 9}, 413,
         "the conversation is 18000 characters long; the limit is 16000"),
        ({"model": "llama", "messages": [{"role": "user", "content": "hi"}] * 65}, 413,
         f"the limit is {MAX_CHAT_MESSAGES}"),
        ({"model": "llama", "messages": [{"role": "user", "content": "hi"}],
          "max_new_tokens": 501}, 400, "max_new_tokens must be between 1 and 500"),
        ({"model": "llama", "messages": [{"role": "user", "content": "hi"}], "top": 1}, 400,
         "unknown field(s): top"),
    ],
)  # fmt: skip
def test_chat_refusals_are_one_line(server, body, status, needle):
    got, err = post(server, "chat", body)
    assert got == status and needle in err["error"] and "\n" not in err["error"], err


def test_chat_window_full_is_a_one_line_400(server):
    # letters the tiny BPE never merged: one token each, 400 of them in a 256-token window
    msgs = [{"role": "user", "content": "zqxj" * 100}]
    status, err = post(server, "chat", {"model": "llama", "messages": msgs})
    assert status == 400 and "window 256" in err["error"] and "\n" not in err["error"], err


@pytest.mark.parametrize("weights", ["q8", "q4"])
def test_the_parameter_count_is_the_models_whatever_holds_its_weights(folder, hf, weights, cli):
    """The explorer's header counts the values the model stands for, as ``attnlm params``
    and ``transformers`` do: 8- and 4-bit weights are buffers, not parameters, and were left
    out (SmolLM2 showed 35,136 parameters, its float32 norms alone)."""
    served = load_service(model=str(folder), name="llama", weights=weights).info()
    want = sum(p.numel() for p in hf.parameters())  # a tied head once
    assert served["parameters"] == want
    assert f"{want:,}" in cli("params", "--model", folder).out
