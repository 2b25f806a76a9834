"""Speculative decoding with a quantized copy of the model (:mod:`attnlm.generate.speculative`):
the greedy tokens equal one-token-per-pass greedy decoding of the float32 model (drafts taken,
drafts rejected, a stop inside a draft, chat turns); the copy leaves the model alone and shares
its unquantized tensors; ``--draft`` on ``generate`` and ``chat``, and its refusals."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.generate import SamplingConfig, decode
from attnlm.generate.options import DecodeOptions
from attnlm.generate.speculative import ModelDrafter, draft_model
from attnlm.models import registry
from attnlm.quant.layers import QuantLinear, quantize_weights

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingConfig(temperature=0, max_new_tokens=64)


def _tiny(family: str, seed: int = 0):
    torch.manual_seed(seed)
    table = {"type": family, "vocab_size": 70, "block_size": 128, "n_layer": 2, "n_head": 4,
             "n_embd": 64, "d_ff": 96}  # fmt: skip
    if family == "llama":
        table.update(n_kv_head=2)
    model, _, _ = registry.build(table)
    return model.eval()


class Recording(ModelDrafter):
    """A drafter that keeps each call's context length and guesses."""

    def __init__(self, draft):
        super().__init__(draft)
        self.guessed: list[tuple[int, list[int]]] = []

    def __call__(self, seq, k):
        out = super().__call__(seq, k)
        self.guessed.append((len(seq), out))
        return out

    def right(self, full: list[int]) -> int:
        """How many guesses equal the tokens of ``full`` (prompt and output) at their places."""
        return sum(full[n + j] == t for n, g in self.guessed for j, t in enumerate(g)
                   if n + j < len(full))  # fmt: skip


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("fmt", ["q8", "q4"])
@pytest.mark.parametrize("lookahead", [1, 8, 15])
def test_greedy_with_a_quantized_draft_equals_plain_greedy(family, fmt, lookahead, monkeypatch):
    import attnlm.generate.speculative as spec

    model = _tiny(family, seed=3)
    draft = draft_model(model, fmt)
    prompt = [5, 17, 3, 40, 9, 22, 61, 8]
    plain = decode(model, [prompt], GREEDY, DecodeOptions(lookahead=0))[0]
    recording = Recording(draft)
    monkeypatch.setattr(spec, "ModelDrafter", lambda d: recording)
    fast = decode(model, [prompt], GREEDY, DecodeOptions(lookahead=lookahead, draft=draft))[0]
    assert fast == plain and len(fast) == 64
    made = sum(len(g) for _, g in recording.guessed)
    assert recording.seen, "the draft model never ran"
    assert recording.right(prompt + plain) > made // 2  # most guesses are right


def test_a_draft_of_a_model_that_already_decoded():
    """The C step keeps its plan (pointers into the model) on the model: the copy makes its
    own instead of sharing or copying it."""
    model = _tiny("llama", seed=6)
    plain = decode(
        model, [[1, 2, 3]], GREEDY, DecodeOptions(lookahead=0)
    )  # the C step plans for model
    draft = draft_model(model, "q4")
    assert decode(model, [[1, 2, 3]], GREEDY, DecodeOptions(draft=draft)) == plain
    assert (
        decode(model, [[1, 2, 3]], GREEDY, DecodeOptions(lookahead=0)) == plain
    )  # model's plan still works


def test_a_wrong_draft_model_changes_no_token(monkeypatch):
    """Another random model as the draft: its guesses are mostly rejected and undone."""
    import attnlm.generate.speculative as spec

    model, other = _tiny("llama", seed=1), _tiny("llama", seed=2)
    prompt = [4, 8, 15, 16, 23, 42]
    plain = decode(model, [prompt], GREEDY, DecodeOptions(lookahead=0))[0]
    recording = Recording(other)
    monkeypatch.setattr(spec, "ModelDrafter", lambda d: recording)
    assert decode(model, [prompt], GREEDY, DecodeOptions(lookahead=8, draft=other))[0] == plain
    made = sum(len(g) for _, g in recording.guessed)
    assert recording.right(prompt + plain) < made // 2  # most guesses were wrong


def test_a_stop_inside_a_draft_ends_there():
    model = _tiny("gpt", seed=4)
    draft = draft_model(model, "q4")
    seen: list[int] = []
    out = decode(model, [[1, 2, 3]], GREEDY, DecodeOptions(draft=draft),
                 on_token=lambda r, t: seen.append(t) or len(seen) == 11)  # fmt: skip
    assert out[0] == seen and len(seen) == 11
    assert out[0] == decode(model, [[1, 2, 3]], GREEDY, DecodeOptions(lookahead=0))[0][:11]


def test_the_draft_leaves_the_model_alone_and_shares_its_other_tensors():
    model = _tiny("llama", seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    draft = draft_model(model, "q4")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
    assert any(isinstance(m, QuantLinear) for m in draft.modules())
    shared = {p.data_ptr() for p in model.parameters()}
    kept = list(draft.parameters())  # the norms' gains: not copied
    assert kept and all(p.data_ptr() in shared for p in kept)


def test_refusals_are_one_line_errors():
    model = _tiny("gpt")
    with pytest.raises(InputError, match="q8 or q4"):
        draft_model(model, "bf16")
    quantize_weights(model, "q8")
    with pytest.raises(InputError, match="float32 weights"):
        draft_model(model, "q4")
    with pytest.raises(InputError, match="KV cache"):
        draft_model(torch.nn.Linear(4, 4), "q4")


def test_chat_with_a_draft_gives_the_same_turns(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from attnlm.generate.chat import ChatSession
    from attnlm.loading.sources import resolve
    from support_chat import tiny_chat_llama

    model, tok, info = resolve(tiny_chat_llama(tmp_path / "llama"))
    sampling = SamplingConfig(temperature=0, max_new_tokens=30)
    runs = []
    for draft in (None, draft_model(model, "q4")):
        session = ChatSession(model, tok, info.chat_template, info.stop_ids, sampling=sampling,
                              lookahead=8, draft=draft)  # fmt: skip
        turns = [session.reply(u).ids for u in ("hello", "the capital?")]
        session.messages[-1]["content"] = "an edited reply"  # both caches cut back
        turns.append(session.reply("again").ids)
        runs.append(turns)
        if draft is not None:
            assert session.propose.seen, "the draft model never ran"
    assert runs[0] == runs[1]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from support_chat import tiny_chat_llama

    return tiny_chat_llama(tmp_path_factory.mktemp("spec") / "llama")


def test_generate_and_chat_draft_flags(cli, hf_folder):
    common = ("--temperature", "0", "--max-new-tokens", "24", "--threads", "1", "--json")
    texts = []
    for extra in (("--lookahead", "0"), ("--draft", "q4"), ("--draft", "q8", "--lookahead", "3")):
        r = cli("generate", "--model", str(hf_folder), "--prompt", "hello", *common, *extra)
        assert r.code == 0, r.err
        texts.append(json.loads(r.out.strip().splitlines()[-1])["texts"])
    assert texts[0] == texts[1] == texts[2]
    replies = []
    for extra in (("--lookahead", "0"), ("--draft", "q4")):
        r = cli("chat", "--model", str(hf_folder), "--message", "hello", *common, *extra)
        assert r.code == 0, r.err
        replies.append(json.loads(r.out.strip().splitlines()[-1])["tokens"])
    assert replies[0] == replies[1]


@pytest.mark.parametrize(("extra", "message"), [
    (("--temperature", "0.8"), "greedy"),
    (("--temperature", "0", "--lookahead", "0"), "--lookahead 0"),
    (("--temperature", "0", "--no-cache"), "--no-cache"),
    (("--temperature", "0", "--weights", "q4"), "float32 weights"),
])  # fmt: skip
def test_draft_refusals_on_the_command_line(cli, hf_folder, extra, message):
    r = cli("generate", "--model", str(hf_folder), "--prompt", "hello", "--draft", "q4",
            "--max-new-tokens", "4", *extra)  # fmt: skip
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.slow
def test_smollm2_float32_tokens_with_a_4_bit_draft():
    """The real model: 96 greedy float32 tokens of a chat prompt, one per pass and with a q4
    copy drafting, are the same, and most of the q4 copy's guesses are kept."""
    import attnlm.generate.speculative as spec
    from attnlm.loading.sources import resolve
    from gguf_support import smollm2_file

    model, tok, info = resolve(smollm2_file(fetch=True), weights="f32")
    text = info.chat_template.render([{"role": "user", "content": "Explain attention."}],
                                     add_generation_prompt=True)  # fmt: skip
    prompt = tok.encode(text)
    greedy = SamplingConfig(temperature=0, max_new_tokens=96)
    plain = decode(model, [prompt], greedy, DecodeOptions(lookahead=0))[0]
    recording = Recording(draft_model(model, "q4"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spec, "ModelDrafter", lambda d: recording)
        fast = decode(model, [prompt], greedy, DecodeOptions(draft=recording.model))[0]
    assert fast == plain
    made = sum(len(g) for _, g in recording.guessed)
    assert recording.right(prompt + plain) > 0.9 * made
