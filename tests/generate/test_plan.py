"""The decoding plan (attnlm.generate.plan): each family's Decoding record, the choices made once
before the loop, and the one way to say how tokens are picked (a SamplingConfig) across
families."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.generate import SamplingConfig, decode, generate, generate_text
from attnlm.generate.plan import GROWING, NO_STATE, STATIC, DecodeOptions, plan_decode
from attnlm.models import registry
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.models.rnn import RNNLM, RNNConfig
from attnlm.models.transformer import Transformer, TransformerConfig


def _gpt(positions="learned", block=16):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=30, block_size=block, n_layer=1, n_head=2, n_embd=16,
                    positions=positions)  # fmt: skip
    return GPT(cfg).eval()


def _llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=30, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)
    return Llama(cfg).eval()


def _rnn():
    torch.manual_seed(0)
    return RNNLM(RNNConfig(vocab_size=30, n_embd=16, n_layer=1)).eval()


def _transformer():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=30, d_model=16, n_head=2, n_encoder_layers=1,
                            n_decoder_layers=1, d_ff=32, dropout=0.0)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():  # larger weights: varied tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    return model


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


def test_each_family_says_what_its_models_do():
    """The records agree with the models: a static state takes ``max_len``, a windowed family
    has ``block_size``, and the position scheme is the one the model was built with."""
    for family in registry.families():
        d = family.decoding
        if d.static_state:
            assert "max_len" in family.model.new_state.__code__.co_varnames
        if d.fixed_state or d.prefix_step:
            assert d.static_state  # a compiled step runs over a static state
    assert registry.get("gpt").decoding.scheme(_gpt("alibi").config) == "alibi"
    assert registry.get("llama").decoding.scheme(_llama().config) == "rope"
    assert _llama().rotary is not None and _gpt("alibi").alibi is not None
    assert not registry.get("rnn").decoding.window
    assert not registry.get("transformer").decoding.window
    assert not hasattr(_transformer().config, "block_size")


def test_the_plan_is_decided_from_the_record_and_the_call():
    gpt = _gpt("rope")
    greedy = dict(greedy=True, options=DecodeOptions(lookahead=8))
    plan = plan_decode(gpt, PROMPTS, 10, False)
    assert (plan.state, plan.window, plan.slide, plan.max_len) == (STATIC, 16, True, 15)
    assert plan_decode(gpt, PROMPTS, 10, False, DecodeOptions(static=False)).state == GROWING
    assert plan_decode(gpt, PROMPTS, 10, False, DecodeOptions(use_cache=False)).state == NO_STATE
    assert plan_decode(gpt, PROMPTS[:1], 10, **greedy).lookahead == 8  # one greedy prompt
    assert plan_decode(gpt, PROMPTS[:1], 20, **greedy).lookahead == 0  # past the window
    assert plan_decode(gpt, PROMPTS, 10, **greedy).lookahead == 0  # several prompts
    assert plan_decode(gpt, PROMPTS[:1], 10, watched=True, **greedy).lookahead == 0
    assert not plan_decode(_gpt("learned"), PROMPTS, 10, False).slide  # crop and recompute
    rnn = plan_decode(_rnn(), PROMPTS, 100, False)
    assert (rnn.state, rnn.window) == (GROWING, None)  # no static state, no window
    with pytest.raises(InputError, match="needs the model's decoding state"):
        plan_decode(_rnn(), PROMPTS, 5, False, DecodeOptions(use_cache=False), conditioned=True)
    with pytest.raises(InputError, match="no compiled decode step"):
        plan_decode(_gpt("alibi"), PROMPTS, 5, False, DecodeOptions(compile=True))


@pytest.mark.parametrize("make", [_gpt, _llama, _rnn], ids=["gpt", "llama", "rnn"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_sampling_config_decodes_every_language_model(make, temperature):
    """The cached decode equals recomputing the context at every step, and ``sampling.seed``
    gives the samples of a generator seeded the same; ``generate`` on tensors agrees."""
    model = make()
    sampling = SamplingConfig(temperature=temperature, top_k=8, max_new_tokens=12, seed=5)
    cached = decode(model, PROMPTS, sampling)
    g = torch.Generator().manual_seed(5)
    recomputed = decode(
        model, PROMPTS, sampling.with_(seed=None), DecodeOptions(use_cache=False), generator=g
    )
    assert cached == recomputed and all(len(row) == 12 for row in cached)
    if sampling.greedy:  # a batch gives each row the tokens it gets alone
        ids = torch.tensor([PROMPTS[1]])
        assert generate(model, ids, sampling)[0, 5:].tolist() == cached[1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_sampling_config_decodes_a_translation_model(temperature):
    """The encoder-decoder: static and growing states give the same tokens from one config."""
    model = _transformer()
    setup = model.prepare_decoding([[3, 4, 5], [6, 7], [8]])
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=10, seed=2)
    kw = dict(state_batch=setup.state_batch, eos_id=setup.eos_id, process=setup.process)
    static = decode(model, setup.prompts, sampling, **kw)
    growing = decode(model, setup.prompts, sampling, DecodeOptions(static=False), **kw)
    assert static == growing and all(1 <= len(row) <= 10 for row in static)


class _Chars:
    def encode(self, text):
        return [ord(c) - 96 for c in text]

    def decode(self, ids):
        return "".join(chr(96 + i) for i in ids)


def test_the_loose_sampling_arguments_are_gone():
    model = _gpt()
    with pytest.raises(TypeError, match="temperature"):
        decode(model, PROMPTS, temperature=0)
    with pytest.raises(TypeError, match="max_new_tokens"):
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=3)
    with pytest.raises(TypeError, match="seed"):
        generate_text(model, _Chars(), ["ab"], seed=1)
    with pytest.raises(InputError, match="sampling must be a SamplingConfig, got int"):
        decode(model, PROMPTS, 5)
    with pytest.raises(InputError, match="sampling must be a SamplingConfig, got dict"):
        generate_text(model, _Chars(), ["ab"], {"temperature": 0})
