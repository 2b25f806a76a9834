"""The Llama family's Hugging Face architectures (``attnlm.models.hf.llama_family``): for each
of Qwen2, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3 (text), SmolLM3 (layers without positions),
Granite (four multipliers), OLMo 2 and 3, and the mixtures of experts Qwen3-MoE, Mixtral and
gpt-oss (attention sinks, biases on the experts, the clamped SwiGLU), a small random
model made by ``transformers`` itself (float32, several layers so Gemma has local and global layers,
grouped-query attention, a head width other than ``hidden / heads`` where the architecture
has one, a sliding window shorter than the test sequence) loads into our Llama with the same
logits (within 1e-5), also left-padded and decoded through the KV cache; saved by us,
``transformers`` loads it as the same class with the same logits; greedy tokens agree."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.generate.loop import decode
from attnlm.generate.sampling import SamplingConfig
from attnlm.models import from_hf, save_hf
from attnlm.models.llama import describe_parts

transformers = pytest.importorskip("transformers", reason="the reference implementation")

V, T = 61, 11  # vocabulary, test sequence (longer than every window below)
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2, pad_token_id=None)  # fmt: skip


LONGROPE = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.2, 2.0],
            "long_factor": [4.0, 40.0], "partial_rotary_factor": 0.5}  # fmt: skip


def _configs() -> dict:
    t = transformers
    full, slide = "full_attention", "sliding_attention"
    return {
        "qwen2": t.Qwen2Config(**COMMON, num_hidden_layers=3, use_sliding_window=True,
                               sliding_window=4, max_window_layers=1, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 5000.0}),
        # YaRN (Qwen3's long-context setting): 4 x an original context of 16
        "qwen3": t.Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=12,
                               tie_word_embeddings=True,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                                "factor": 4.0,
                                                "original_max_position_embeddings": 16}),
        "mistral": t.MistralConfig(**COMMON, num_hidden_layers=2, head_dim=12, sliding_window=4),
        # Phi-4 mini's parts: LongRoPE (short factors up to the original context of 16, long
        # ones past it: the greedy test's last step; cos and sin times sqrt(1 + ln 4 / ln 16))
        # and partial rotary (the first 4 of each head's 8 features turn, 2 factors per set)
        "phi3": t.Phi3Config(**COMMON, num_hidden_layers=2, sliding_window=5,
                             original_max_position_embeddings=16, partial_rotary_factor=0.5,
                             rope_parameters=LONGROPE),
        "gemma2": t.Gemma2Config(**COMMON, num_hidden_layers=4, head_dim=12,
                                 query_pre_attn_scalar=10, sliding_window=4,
                                 attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
        "gemma3_text": t.Gemma3TextConfig(
            **COMMON, num_hidden_layers=4, head_dim=12, query_pre_attn_scalar=12,
            sliding_window=3, layer_types=[slide, slide, full, slide],
            rope_parameters={full: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                             slide: {"rope_type": "default", "rope_theta": 1e3}}),
        # mixtures of experts (2 of 6 and 2 of 4 per token): the router and every expert
        "qwen3_moe": t.Qwen3MoeConfig(**COMMON, num_hidden_layers=2, head_dim=12,
                                      num_experts=6, num_experts_per_tok=2,
                                      moe_intermediate_size=24, norm_topk_prob=True),
        "mixtral": t.MixtralConfig(**COMMON, num_hidden_layers=2, num_local_experts=4,
                                   num_experts_per_tok=2, sliding_window=4),
        # layers 1 and 3 without positions (NoPE; the default would leave only every fourth)
        "smollm3": t.SmolLM3Config(**COMMON, num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0],
                                   tie_word_embeddings=False),
        # Granite's four multipliers: embeddings, scores, sublayer outputs, logits' divisor
        "granite": t.GraniteConfig(**COMMON, num_hidden_layers=2, embedding_multiplier=12.0,
                                   attention_multiplier=0.0625, residual_multiplier=0.22,
                                   logits_scaling=8.0),
        # OLMo 2: norms of the sublayers' outputs only, q/k norms over all heads at once
        "olmo2": t.Olmo2Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=False),
        # OLMo 3: sliding layers 0-2 of 4 (a window of 3), YaRN on the global layer only
        "olmo3": t.Olmo3Config(**COMMON, num_hidden_layers=4, sliding_window=3,
                               rope_parameters={
                                   full: {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                          "original_max_position_embeddings": 16},
                                   slide: {"rope_type": "default", "rope_theta": 1e4}}),
        # gpt-oss: sinks, q/k/v/o biases, a window of 4 on layer 0, 2 of 4 experts with biases
        # (the softmax of the top 2 logits, the clamped SwiGLU), YaRN with its untruncated ramp
        "gpt_oss": t.GptOssConfig(**COMMON, num_hidden_layers=2, head_dim=12,
                                  num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                                  rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                                   "factor": 4.0, "beta_fast": 32.0,
                                                   "beta_slow": 1.0, "truncate": False,
                                                   "original_max_position_embeddings": 16}),
        "llama": t.LlamaConfig(**COMMON, num_hidden_layers=2,  # linear rotary scaling
                               rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 1e4},
                               head_dim=12),  # Mistral Nemo's layout: heads of their own width
    }  # fmt: skip


CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
           "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
           "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
           "smollm3": "SmolLM3ForCausalLM", "granite": "GraniteForCausalLM",
           "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM",
           "gpt_oss": "GptOssForCausalLM"}  # fmt: skip
#: our ``model.arch`` label of each model type (its name without ``_text`` / ``_``)
LABELS = {t: t.removesuffix("_text").replace("_", "") for t in CLASSES}
ARCHS = sorted(CLASSES)


def _hf_model(model_type: str):
    torch.manual_seed(0)
    config = _configs()[model_type]
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # every tensor random: norms, biases, Gemma's offsets all matter
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 1.0 if "router.weight" in name else 0.15)
    return model.eval()


def _hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    scale = max(1.0, float(b.abs().max()))
    assert float((a - b).abs().max()) <= tol * scale, float((a - b).abs().max())


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    """``(model_type, transformers' model, ours loaded from its folder, the folder)``."""
    model_type = request.param
    hf = _hf_model(model_type)
    folder = tmp_path_factory.mktemp(model_type)
    hf.save_pretrained(folder)
    return model_type, hf, from_hf(folder), folder


def _ids(seed: int = 1, rows: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (rows, T), generator=g)


def test_loaded_logits_equal_transformers(pair):
    model_type, hf, ours, _ = pair
    assert ours.config.arch == LABELS[model_type]
    ids = _ids()
    with torch.no_grad():
        _close(ours(ids).logits, _hf_logits(hf, ids))


def test_left_padding_and_the_kv_cache_equal_the_full_forward(pair):
    _, hf, ours, _ = pair
    ids = _ids(2)
    with torch.no_grad():
        full = ours(ids).logits
        _close(full, _hf_logits(hf, ids))
        pad = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], 1)
        keep = torch.ones_like(pad, dtype=torch.bool)
        keep[:, :3] = False
        _close(ours(pad, attention_mask=keep).logits[:, 3:], full)
        for state in (ours.new_state(), ours.new_state(max_len=32)):
            steps = [ours(ids[:, :4], cache=state).logits]
            steps += [ours(ids[:, t : t + 1], cache=state).logits for t in range(4, T)]
            _close(torch.cat(steps, 1), full)


def test_saved_folder_loads_in_transformers_with_the_same_logits(pair, tmp_path):
    model_type, hf, ours, _ = pair
    save_hf(ours, tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["model_type"] == model_type and doc["architectures"] == [CLASSES[model_type]]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(back).__name__ == CLASSES[model_type]
    back.config._attn_implementation = "eager"
    ids = _ids(3)
    _close(_hf_logits(back.eval(), ids), _hf_logits(hf, ids))
    again = from_hf(tmp_path)  # and our own round trip: the same config and tensors
    assert again.config == ours.config
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), k


def test_greedy_tokens_equal_transformers(pair):
    _, hf, ours, _ = pair
    prompt = _ids(4, rows=1)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=6, eos_token_id=None)  # fmt: skip
    mine = decode(ours, prompt.tolist(), SamplingConfig(temperature=0, max_new_tokens=6))[0]
    assert theirs[0, T:].tolist() == list(mine)


def test_training_backward_reaches_every_part(pair):
    _, _, ours, _ = pair
    ours.train()
    try:
        ids = _ids(5, rows=8)  # (enough tokens that each expert is chosen by some)
        ours(ids, targets=ids).loss.backward()
        missing = [n for n, p in ours.named_parameters() if p.grad is None]
        assert not missing
    finally:
        ours.zero_grad(set_to_none=True)
        ours.eval()


def test_bfloat16_weights_load_with_gemmas_offset_in_float32(tmp_path):
    hf = _hf_model("gemma3_text").to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert ours.tok_emb.weight.dtype == torch.float32
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ref.config._attn_implementation = "eager"
    ids = _ids(6)
    _close(ours(ids).logits.detach(), _hf_logits(ref.eval(), ids))


def test_qwen3_moe_without_renormalised_weights_equals_transformers(tmp_path):
    """``norm_topk_prob = false``: the chosen experts' probabilities mix as they are; 3 of 6
    experts per token."""
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        **COMMON,
        num_hidden_layers=2,
        head_dim=12,
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=24,
        norm_topk_prob=False,
    )
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert (ours.config.n_expert, ours.config.n_expert_used) == (6, 3)
    assert not ours.config.moe_norm_topk
    ids = _ids(7)
    _close(ours(ids).logits.detach(), _hf_logits(hf, ids))
    renormalised = ours.blocks[0].mlp
    renormalised.norm_topk = True  # the switch matters: the logits move
    assert float((ours(ids).logits.detach() - _hf_logits(hf, ids)).abs().max()) > 1e-3


def test_smollm3s_default_layers_without_positions_equal_transformers(tmp_path):
    """Without ``no_rope_layers`` every fourth layer has no positions (``transformers``'
    default, the released SmolLM3's); rotating those layers too moves the logits."""
    torch.manual_seed(0)
    config = transformers.SmolLM3Config(**COMMON, num_hidden_layers=4)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # weights large enough that positions matter
        for p in hf.parameters():
            p.normal_(0.0, 0.15)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert ours.config.nope_layers == (3,) and ours.config.tie_embeddings
    assert "no positions in 1 of 4 layers (NoPE)" in describe_parts(ours.config)
    ids = _ids(8)
    _close(ours(ids).logits.detach(), _hf_logits(hf, ids))
    ours.blocks[3].attn.nope = False  # the part matters: the logits move
    assert float((ours(ids).logits.detach() - _hf_logits(hf, ids)).abs().max()) > 1e-3


def _write_config(tmp_path, doc: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"model_type": "gemma3", "vision_config": {}}, "vision tower"),
        ({"model_type": "qwen2_moe"}, "mixture of experts"),
        ({**COMMON, "model_type": "qwen3_moe", "num_hidden_layers": 2, "num_experts": 4,
          "num_experts_per_tok": 2, "moe_intermediate_size": 8, "mlp_only_layers": [1]},
         "mlp_only_layers"),
        ({**COMMON, "model_type": "mixtral", "num_hidden_layers": 1, "num_local_experts": 2,
          "num_experts_per_tok": 3}, "n_expert_used"),
        ({**COMMON, "model_type": "qwen2", "num_hidden_layers": 1, "num_experts": 4},
         "num_experts"),
        ({**COMMON, "model_type": "qwen3", "num_hidden_layers": 1, "partial_rotary_factor": 0.5},
         "partial_rotary_factor 0.5 .partial rotary. is not supported for Qwen3ForCausalLM"),
        ({**COMMON, "model_type": "mistral", "num_hidden_layers": 1,
          "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 0.7,
                           "mscale_all_dim": 0.7}}, "mscale"),
        ({**COMMON, "model_type": "qwen3", "num_hidden_layers": 1,
          "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": "no"}}, "truncate"),
        ({**COMMON, "model_type": "gpt_oss", "num_hidden_layers": 1, "num_local_experts": 2,
          "num_experts_per_tok": 1, "swiglu_limit": 5.0}, "swiglu_limit 5.0 is not supported"),
        ({**COMMON, "model_type": "qwen2", "num_hidden_layers": 1,
          "quantization_config": {"quant_method": "awq"}}, "quantization_config 'awq'"),
        ({**COMMON, "model_type": "phi3", "num_hidden_layers": 1,
          "rope_scaling": {"type": "longrope", "short_factor": [1.0]}}, "lacks a list 'long_"),
        ({**COMMON, "model_type": "phi3", "num_hidden_layers": 1,
          "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
         "short_factor must list 4 positive numbers"),
        ({**COMMON, "model_type": "phi3", "num_hidden_layers": 1, "partial_rotary_factor": 1.5},
         "partial_rotary_factor must be in"),
        ({**COMMON, "model_type": "gemma2", "num_hidden_layers": 1,
          "hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
        ({**COMMON, "model_type": "mistral", "num_hidden_layers": 1, "attention_bias": True},
         "attention_bias"),
        ({**COMMON, "model_type": "llama", "num_hidden_layers": 1, "head_dim": "wide"},
         "head_dim must be a positive integer"),
        ({**COMMON, "model_type": "smollm3", "num_hidden_layers": 4,
          "no_rope_layers": [1, 1, 0]}, "no_rope_layers must give"),
        ({**COMMON, "model_type": "smollm3", "num_hidden_layers": 4,
          "no_rope_layer_interval": 0}, "no_rope_layer_interval"),
        ({**COMMON, "model_type": "granite", "num_hidden_layers": 1, "logits_scaling": 0},
         "logits_scaling must be a positive number"),
    ],
)  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(tmp_path, doc, message):
    _write_config(tmp_path, doc)
    with pytest.raises((ConfigError, InputError), match=message) as e:
        from_hf(tmp_path)
    assert "\n" not in str(e.value)


def test_a_config_the_architecture_cannot_hold_is_refused_on_save(tmp_path):
    from attnlm.models.llama import Llama, LlamaConfig

    plain = dict(vocab_size=V, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=16,
                 d_ff=24)  # fmt: skip
    with pytest.raises(ConfigError, match="model.qkv_bias") as e:
        save_hf(Llama(LlamaConfig(**plain, arch="qwen2")), tmp_path)  # Qwen2 has biases
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="cannot be saved as LlamaForCausalLM"):
        save_hf(Llama(LlamaConfig(**plain, qk_norm=True)), tmp_path)
    with pytest.raises(ConfigError, match="model.nope_layers"):  # only SmolLM3 has NoPE layers
        save_hf(Llama(LlamaConfig(**plain, arch="qwen3", qk_norm=True, nope_layers=[1])), tmp_path)
    assert not (tmp_path / "config.json").exists()
