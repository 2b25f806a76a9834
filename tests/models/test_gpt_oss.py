"""gpt-oss's parts, each against ``transformers``' own code (``modeling_gpt_oss``,
``integrations.mxfp4``, ``modeling_rope_utils``) as the independent reference: attention sinks
(:func:`attnlm.nn.attention.sink_softmax`), the clamped SwiGLU
(:class:`attnlm.nn.blocks.ClampedSwiGLU`), the softmax of the top k router logits
(:class:`attnlm.nn.moe.SparseMoE` with ``gating = "topk_softmax"``), YaRN's untruncated ramp,
the released checkpoints' MXFP4 experts (:mod:`attnlm.models.hf.gpt_oss`), and a trace of a
gpt-oss model (its attention pattern: the sinks take their share)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attnlm.base.errors import ConfigError
from attnlm.inspect.trace import trace
from attnlm.models.hf.gpt_oss import dequantize_mxfp4, stack, unstack
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.nn.attention import MultiHeadAttention, sink_softmax
from attnlm.nn.blocks import ClampedSwiGLU
from attnlm.nn.moe import SparseMoE

transformers = pytest.importorskip("transformers", reason="the reference implementation")
oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")

OSS = dict(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, d_ff=32,
           arch="gptoss", qkv_bias=True, attn_out_bias=True, attn_sinks=True, n_expert=4,
           n_expert_used=2, moe_bias=True, moe_gating="topk_softmax", moe_norm_topk=False,
           mlp_act="swiglu_oai", sliding_window=3,
           layer_types=("sliding_attention", "full_attention"))  # fmt: skip


def _randomized(model: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model.eval()


def test_sink_softmax_is_transformers_eager_attention():
    """Scores with a causal mask, grouped heads: our explicit attention (sinks) equals
    ``transformers``' ``eager_attention_forward`` of gpt-oss, weights and outputs."""
    torch.manual_seed(1)
    attn = _randomized(MultiHeadAttention(16, 4, n_kv_head=2, sinks=True), 1.0)
    B, T, D = 2, 5, 4
    q, k, v = torch.randn(B, 4, T, D), torch.randn(B, 2, T, D), torch.randn(B, 2, T, D)
    mask = torch.full((T, T), float("-inf")).triu(1)
    with torch.no_grad():
        y, w = attn._mix(q, k, v, mask, False, True)
    module = SimpleNamespace(num_key_value_groups=2, sinks=attn.sinks, training=False)
    ref_y, ref_w = oss.eager_attention_forward(module, q, k, v, mask, scaling=D**-0.5)
    assert torch.allclose(w, ref_w, atol=1e-6)
    assert torch.allclose(y.transpose(1, 2), ref_y, atol=1e-6)
    assert float(w.sum(-1).max()) < 1.0  # each sink took its share


def test_sink_softmax_by_hand():
    scores, sink = torch.tensor([[1.0, 2.0, -1.0]]), torch.tensor([[0.5]])
    e = torch.exp(torch.tensor([1.0, 2.0, -1.0, 0.5]))
    assert torch.allclose(sink_softmax(scores, sink)[0], (e / e.sum())[:3])
    assert torch.equal(sink_softmax(scores, None), torch.softmax(scores, -1))


def test_clamped_swiglu_is_gpt_oss_gate():
    """Our fused layout (gate rows, then up) through :class:`ClampedSwiGLU` equals gpt-oss's
    ``_apply_gate`` on its interleaved one, with values past the limit of 7 on both sides."""
    gu = torch.randn(3, 2, 20) * 6.0
    experts = SimpleNamespace(alpha=1.702, limit=7.0)
    interleaved = torch.stack([gu[..., :10], gu[..., 10:]], dim=-1).reshape(gu.shape)
    want = oss.GptOssExperts._apply_gate(experts, interleaved)
    got = ClampedSwiGLU(4, 10).gate(gu)
    assert (gu.abs() > 7).any() and torch.allclose(got, want, atol=1e-6)


def test_top_k_softmax_routing_is_gpt_oss_router():
    torch.manual_seed(2)
    moe = _randomized(SparseMoE(16, 8, 5, 2, gating="topk_softmax", bias=True), 1.0)
    config = SimpleNamespace(num_experts_per_tok=2, num_local_experts=5, hidden_size=16)
    router = oss.GptOssTopKRouter(config)
    router.load_state_dict(moe.router.state_dict())
    x = torch.randn(7, 16)
    _, scores, indices = router(x)
    weights, chosen = moe.route(x)
    assert torch.equal(chosen, indices) and torch.allclose(weights, scores, atol=1e-6)


def test_yarn_untruncated_ramp_is_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attnlm.nn.positional import yarn_frequencies

    rope = {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    }
    config = transformers.GptOssConfig(hidden_size=64, num_attention_heads=1, head_dim=64,
                                       rope_parameters=rope)  # fmt: skip
    want, scale = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    keys = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate")
    got, ours = yarn_frequencies(64, 150000.0, **{k: rope[k] for k in keys})
    assert torch.equal(got, want) and ours == pytest.approx(scale)
    rounded, _ = yarn_frequencies(64, 150000.0, **{**{k: rope[k] for k in keys}, "truncate": True})
    assert not torch.equal(rounded, want)  # llama.cpp's rounded ends: another ramp


def test_mxfp4_experts_are_transformers_dequantized():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (2, 6, 3, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 134, (2, 6, 3), dtype=torch.uint8, generator=g)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # (E, K, R)
    assert torch.equal(dequantize_mxfp4(blocks, scales), want.transpose(1, 2))
    one = torch.tensor([[[0x21] + [0] * 15]], dtype=torch.uint8)  # codes 1 then 2: 0.5, 1.0
    got = dequantize_mxfp4(one, torch.tensor([[128]], dtype=torch.uint8))
    assert got[0, :3].tolist() == [1.0, 2.0, 0.0]  # times 2^(128 - 127)


def test_stacked_experts_round_trip_and_mxfp4_folders_load():
    """Our experts -> gpt-oss's stacked tensors -> ours again, exactly; and MXFP4 blocks in
    their place load as their dequantized values (the gate and up rows de-interleaved)."""
    model = _randomized(Llama(LlamaConfig(**OSS)))
    ours = {f"model.layers.{k.removeprefix('blocks.')}": v for k, v in model.state_dict().items()
            if ".mlp.experts." in k}  # fmt: skip
    stacked = stack(ours, 2, 4)
    assert stacked["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 32, 64)
    back = unstack(stacked, 2, "test")
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)
    g = torch.Generator().manual_seed(4)
    packed = {}
    for i in range(2):
        at = f"model.layers.{i}.mlp.experts."
        for name, rows in (("gate_up_proj", 64), ("down_proj", 32)):  # (inputs: one block)
            packed[at + name + "_blocks"] = torch.randint(
                0, 256, (4, rows, 1, 16), dtype=torch.uint8, generator=g
            )
            packed[at + name + "_scales"] = torch.full((4, rows, 1), 127, dtype=torch.uint8)
        packed[at + "gate_up_proj_bias"] = stacked[at + "gate_up_proj_bias"]
        packed[at + "down_proj_bias"] = stacked[at + "down_proj_bias"]
    loaded = unstack(packed, 2, "test")
    codes = dequantize_mxfp4(
        packed["model.layers.1.mlp.experts.gate_up_proj_blocks"],
        packed["model.layers.1.mlp.experts.gate_up_proj_scales"],
    )
    assert torch.equal(loaded["model.layers.1.mlp.experts.2.fc.weight"][:32], codes[2][0::2])
    assert torch.equal(loaded["model.layers.1.mlp.experts.2.fc.weight"][32:], codes[2][1::2])


def test_other_quantized_folders_are_refused_in_one_line(tmp_path):
    from attnlm.models import from_hf, save_hf

    save_hf(_randomized(Llama(LlamaConfig(**OSS))), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_hf(tmp_path)  # gpt-oss's own (the float experts it finds load as they are)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="quantization_config 'gptq' is not supported") as e:
        from_hf(tmp_path)
    assert "\n" not in str(e.value)


def test_config_refuses_gpt_oss_parts_without_experts():
    with pytest.raises(ConfigError, match="need model.n_expert"):
        LlamaConfig(**{**OSS, "n_expert": None, "n_expert_used": None})


@torch.inference_mode()
def test_trace_pattern_holds_the_sinks_share():
    """The traced pattern is the forward's weights (rows summing to less than one: the sink's
    share), and tracing leaves the logits bit-identical."""
    model = _randomized(Llama(LlamaConfig(**OSS)))
    ids = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(5))
    t = trace(model, ids, names=["blocks.1.attn.hook_pattern"])
    assert torch.equal(t.logits, model(ids).logits)
    pattern = t["blocks.1.attn.hook_pattern"]  # (B, H, T, S)
    sums = pattern.sum(-1)
    assert float(sums.max()) < 1.0 and float(sums.min()) > 0.0
    assert torch.equal(pattern.triu(1), torch.zeros_like(pattern))  # causal
