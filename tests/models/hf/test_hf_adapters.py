"""The Hugging Face adapter table (``attnlm.models.hf``): ``attnlm.models.save_hf`` picks the
adapter from the model's class and ``attnlm.models.from_hf`` from ``config.json``'s
``model_type``; a round trip through both gives back the same class, config and weights for
every architecture, and ``transformers`` reads the folder as the architecture we claim.
Model modules import no adapter (the arrows run from the adapters to the models)."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from attnlm.base.errors import ConfigError
from attnlm.models import from_hf, registry, save_hf
from attnlm.models.bert import Bert, BertConfig
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.hf import ARCHITECTURES, adapter, adapter_for, model_types
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.models.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig
from attnlm.models.transformer import Transformer, TransformerConfig


def _randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter random (norm weights and biases too), so a dropped or swapped weight
    shows in the round trip."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model.eval()


MODELS = {  # model_type -> a small model of ours and the transformers class it must load as
    "gpt2": (lambda: GPT(GPTConfig(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=16)),
             "GPT2LMHeadModel"),
    "bert": (lambda: Bert(BertConfig(vocab_size=31, block_size=16, n_layer=1, n_head=2,
                                     n_embd=16, d_ff=64, pooler=True)), "BertForMaskedLM"),
    "marian": (lambda: Transformer(TransformerConfig(vocab_size=31, d_model=16, n_head=2,
                                                     n_encoder_layers=1, n_decoder_layers=1,
                                                     d_ff=64, final_logits_bias=True,
                                                     positions_layout="split", pad_id=0, bos_id=0,
                                                     eos_id=1)),
               "MarianMTModel"),
    "llama": (lambda: Llama(LlamaConfig(vocab_size=31, block_size=16, n_layer=2, n_head=4,
                                        n_kv_head=2, n_embd=16, d_ff=48)), "LlamaForCausalLM"),
}  # fmt: skip
SMALL = dict(vocab_size=31, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=16, d_ff=48)
GEMMA = dict(post_norms=True, mlp_act="gelu_tanh", embed_scale=4.0, attn_scale=0.25, d_head=8,
             sliding_window=4, layer_types=("sliding_attention", "full_attention"),
             tie_embeddings=True)  # fmt: skip
LLAMA_FAMILY = {  # the Llama family's other members: our Llama with their parts
    "qwen2": (dict(arch="qwen2", qkv_bias=True), "Qwen2ForCausalLM"),
    "qwen3": (dict(arch="qwen3", qk_norm=True, d_head=8), "Qwen3ForCausalLM"),
    "mistral": (dict(arch="mistral", sliding_window=4), "MistralForCausalLM"),
    "phi3": (dict(arch="phi3"), "Phi3ForCausalLM"),
    "gemma2": (dict(arch="gemma2", attn_softcap=50.0, final_softcap=30.0, **GEMMA),
               "Gemma2ForCausalLM"),
    "gemma3_text": (dict(arch="gemma3", qk_norm=True, rope_local_theta=1e4, **GEMMA),
                    "Gemma3ForCausalLM"),
    "qwen3_moe": (dict(arch="qwen3moe", qk_norm=True, d_head=8, n_expert=4, n_expert_used=2),
                  "Qwen3MoeForCausalLM"),
    "mixtral": (dict(arch="mixtral", n_expert=3, n_expert_used=2), "MixtralForCausalLM"),
    "smollm3": (dict(arch="smollm3", nope_layers=(1,)), "SmolLM3ForCausalLM"),
    "granite": (dict(arch="granite", embed_scale=6.0, attn_scale=0.125, residual_scale=0.5,
                     logit_scale=4.0), "GraniteForCausalLM"),
    "olmo2": (dict(arch="olmo2", qk_norm=True, qk_norm_all=True, post_norms=True,
                   pre_norms=False), "Olmo2ForCausalLM"),
    "olmo3": (dict(arch="olmo3", qk_norm=True, qk_norm_all=True, post_norms=True,
                   pre_norms=False, sliding_window=4, rope_local_theta=10000.0,
                   layer_types=("sliding_attention", "full_attention")), "Olmo3ForCausalLM"),
    "gpt_oss": (dict(arch="gptoss", qkv_bias=True, attn_out_bias=True, attn_sinks=True,
                     n_expert=3, n_expert_used=2, moe_bias=True, moe_gating="topk_softmax",
                     moe_norm_topk=False, mlp_act="swiglu_oai", sliding_window=4,
                     layer_types=("sliding_attention", "full_attention")),
                "GptOssForCausalLM"),
}  # fmt: skip
for _type, (_parts, _cls) in LLAMA_FAMILY.items():
    MODELS[_type] = ((lambda p: lambda: Llama(LlamaConfig(**SMALL, **p)))(_parts), _cls)


def test_table_covers_every_architecture():
    assert sorted(ARCHITECTURES) == sorted(MODELS)
    for model_type in ARCHITECTURES:
        a = adapter(model_type)
        assert a.MODEL_TYPE == model_type
        assert callable(a.load) and callable(a.save)
        assert model_type in model_types(a.MODEL)


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_round_trip_through_the_public_calls(tmp_path, model_type):
    torch.manual_seed(0)
    make, architecture = MODELS[model_type]
    ours = _randomized(make())
    save_hf(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [architecture]
    back = from_hf(tmp_path)
    assert type(back) is type(ours) and back.config == ours.config and not back.training
    mine, theirs = ours.state_dict(), back.state_dict()
    assert list(mine) == list(theirs)
    for k in mine:  # (Gemma's norms go through 1 + w and back: equal to float32 rounding)
        assert torch.allclose(mine[k], theirs[k], rtol=0, atol=1e-6), k


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_transformers_reads_the_folder_as_that_architecture(tmp_path, model_type):
    transformers = pytest.importorskip("transformers", reason="the reference reader")
    torch.manual_seed(0)
    make, architecture = MODELS[model_type]
    save_hf(make(), tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == model_type and config.architectures == [architecture]


def test_save_picks_the_adapter_by_class_and_refuses_others(tmp_path):
    assert adapter_for(GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4)))
    rnn = RNNSeq2Seq(RNNSeq2SeqConfig(vocab_size=8, d_emb=4, d_hidden=4))
    with pytest.raises(ConfigError, match="RNNSeq2Seq has no Hugging Face layout") as e:
        save_hf(rnn, tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "config.json").exists()


def test_family_table_lists_the_types_an_adapter_loads():
    from attnlm.cli.models import families_table

    rows = {r["type"]: r["hf_model_types"] for r in families_table()}
    assert rows["gpt"] == ["gpt2"] and rows["llama"][0] == "llama"
    assert set(rows["llama"]) == {"llama", *LLAMA_FAMILY}
    assert rows["bert"] == ["bert"] and rows["transformer"] == ["marian"]
    assert rows["rnn-seq2seq"] == []


def test_model_modules_do_not_import_the_adapters():
    """No model class carries a file format: no ``from_hf`` / ``save_hf`` methods, no
    ``hf_types`` on the family, and the family modules import nothing from
    ``attnlm.models.hf`` (the import graph check is ``tests/test_architecture.py``)."""
    for family in registry.families():
        assert not hasattr(family.model, "from_hf") and not hasattr(family.model, "save_hf")
        assert not hasattr(family, "hf_types")
        source = importlib.import_module(family.model.__module__).__file__
        text = open(source, encoding="utf-8").read()
        assert "attnlm.models.hf" not in text and "from .hf" not in text, source
