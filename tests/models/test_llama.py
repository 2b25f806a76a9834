"""The Llama family against ``transformers``' ``LlamaForCausalLM`` itself: random models of
several shapes (MHA, GQA, MQA; tied and untied; plain and Llama-3-scaled RoPE) saved offline
with ``save_pretrained`` load into our Llama with the same logits, attention weights, loss,
greedy and beam-search outputs; our export (single file or sharded) loads back into
``transformers``; the KV cache of grouped-query attention is measured in bytes."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.generate.options import DecodeOptions
from attnlm.inspect.params import kv_cache_bytes_per_token
from attnlm.models import from_hf, save_hf
from attnlm.models.hf import llama as hf_llama
from attnlm.models.llama import Llama, LlamaConfig, llama_ffn_width

transformers = pytest.importorskip("transformers", reason="transformers is the Llama reference")
transformers.logging.set_verbosity_error()

V = 61
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}  # fmt: skip
SHAPES = {
    "mha-untied": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4),
    "gqa-tied": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                     tie_word_embeddings=True),
    "mqa": dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=1, rope_theta=500.0),
    "gqa-llama3": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                       rope_theta=500000.0, rope_scaling=LLAMA3, rms_norm_eps=1e-5),
}  # fmt: skip


def make_hf(eager=True, layers=2, ffn=72, **shape):
    shape = copy.deepcopy(shape)  # transformers writes into a rope_scaling dict it is given
    shape.setdefault("tie_word_embeddings", False)
    cfg = transformers.LlamaConfig(
        vocab_size=V, intermediate_size=ffn, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=0, eos_token_id=1, **shape,
    )  # fmt: skip
    if eager:
        cfg._attn_implementation = "eager"  # the SDPA default returns no attention weights
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights, so a swapped key would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.set_num_threads(1)


@pytest.mark.parametrize("name", SHAPES)
def test_logits_attention_and_export_equal_transformers(tmp_path, name):
    shape = SHAPES[name]
    hf = make_hf(**shape)
    hf.save_pretrained(tmp_path / "hf")
    ours = hf_llama.load(tmp_path / "hf")
    c = ours.config
    assert not ours.training
    assert (c.n_head, c.n_kv_head) == (shape["num_attention_heads"],
                                       shape["num_key_value_heads"])  # fmt: skip
    assert c.tie_embeddings == shape.get("tie_word_embeddings", False)
    assert (ours.lm_head.weight is ours.tok_emb.weight) == c.tie_embeddings
    ids = torch.randint(0, V, (3, 40))  # 40 > original context 16: the scaled band is used
    with torch.no_grad():
        ref = hf(ids, output_attentions=True, output_hidden_states=True)
        out = ours(ids, return_attention=True, return_hidden=True)
        fast = ours(ids)
    assert (ref.logits - out.logits).abs().max() < 1e-5
    assert (ref.logits - fast.logits).abs().max() < 1e-5
    for a, b in zip(ref.attentions, out.attentions, strict=True):
        assert a.shape == b.shape == (3, c.n_head, 40, 40)
        assert (a - b).abs().max() < 1e-5
    for a, b in zip(ref.hidden_states[:-1], out.hidden_states[:-1], strict=True):
        assert (a - b).abs().max() < 1e-5
    assert (ref.hidden_states[-1] - ours.ln_f(out.hidden_states[-1])).abs().max() < 1e-5

    save_hf(ours, tmp_path / "ours")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert (back(ids).logits - out.logits).abs().max() < 1e-5
    tied = back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    assert tied == c.tie_embeddings
    again = hf_llama.load(tmp_path / "ours")
    assert again.config == c
    for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_loss_and_padded_batches_equal_transformers(tmp_path):
    hf = make_hf(eager=False, **SHAPES["gqa-tied"])
    hf.save_pretrained(tmp_path)
    ours = hf_llama.load(tmp_path)
    ids = torch.randint(2, V, (2, 16))
    keep = torch.ones(2, 16, dtype=torch.bool)
    keep[1, :5] = False  # left padding
    with torch.no_grad():
        ref = hf(ids, labels=ids).loss  # HF shifts labels inside
        loss = ours(ids[:, :-1], targets=ids[:, 1:]).loss
        assert abs(ref.item() - loss.item()) < 1e-5
        pos = (keep.long().cumsum(-1) - 1).clamp(min=0)
        ref = hf(ids, attention_mask=keep.long(), position_ids=pos).logits
        mine = ours(ids, attention_mask=keep).logits
    assert (ref[0] - mine[0]).abs().max() < 1e-5
    assert (ref[1, 5:] - mine[1, 5:]).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["gqa-tied", "mha-untied"])
def test_training_gradients_equal_transformers(tmp_path, name):
    """The training step's kernels (attnlm.nn.fused: oneDNN linear layers, RMSNorm, SwiGLU
    and rotary backward) give HF's loss and every parameter's gradient; 4 x 24 tokens, so
    the linear layers take the oneDNN path where PyTorch has it."""
    from attnlm.models.hf import llama as hf_llama
    from attnlm.models.hf.mapping import to_hf

    hf = make_hf(eager=False, **SHAPES[name]).train()
    hf.save_pretrained(tmp_path)
    ours = hf_llama.load(tmp_path).train()
    ids = torch.randint(2, V, (4, 25))
    hf(ids, labels=ids).loss.backward()  # HF shifts labels inside
    loss = ours(ids[:, :-1], targets=ids[:, 1:]).loss
    loss.backward()
    named = dict(ours.named_parameters(remove_duplicate=False))
    mine = to_hf(hf_llama.layout(ours.config), {k: p.grad for k, p in named.items()})
    ref = {k: p.grad for k, p in hf.named_parameters()}
    assert set(ref) <= set(mine)
    for k, g in ref.items():
        torch.testing.assert_close(mine[k], g, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("name", ["gqa-tied", "mqa", "gqa-llama3"])
def test_greedy_decoding_equals_transformers_generate(tmp_path, name):
    from attnlm.generate import SamplingConfig, decode

    hf = make_hf(eager=False, **SHAPES[name])
    hf.save_pretrained(tmp_path)
    ours = hf_llama.load(tmp_path)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    with torch.no_grad():
        ref = hf.generate(torch.tensor(prompts), max_new_tokens=30, do_sample=False,
                          eos_token_id=None, pad_token_id=0)  # fmt: skip
    for lookahead in (0, 8):  # plain cached steps, and the draft-and-verify path
        mine = decode(
            ours,
            prompts,
            SamplingConfig(temperature=0, max_new_tokens=30),
            DecodeOptions(lookahead=lookahead),
        )
        assert mine == [r[4:] for r in ref.tolist()]
    one = decode(
        ours,
        prompts[:1],
        SamplingConfig(temperature=0, max_new_tokens=30),
        DecodeOptions(lookahead=8),
    )
    assert one[0] == ref[0, 4:].tolist()


@pytest.mark.parametrize("name", ["gqa-tied", "mqa"])
def test_beam_search_equals_transformers(tmp_path, name):
    from attnlm.generate import SamplingConfig, beam_search, decode

    hf = make_hf(eager=False, **SHAPES[name])
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(8)  # peaked distributions: hypotheses end early
    hf.save_pretrained(tmp_path)
    ours = hf_llama.load(tmp_path).double()
    hf = hf.double()
    prompts = [[5, 6, 7], [9, 3, 2]]
    eos = decode(
        ours,
        prompts[:1],
        SamplingConfig(temperature=0, max_new_tokens=3),
        DecodeOptions(lookahead=0),
    )[0][2]
    ended_early = 0
    for k, lp, es in itertools.product([2, 4], [1.0, 0.0], [False, True]):
        with torch.no_grad():
            ref = hf.generate(torch.tensor(prompts), num_beams=k, length_penalty=lp,
                              early_stopping=es, max_new_tokens=10, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)  # fmt: skip
        mine = beam_search(ours, prompts, k, lp, es, 10, eos_id=eos)
        for r, p in enumerate(prompts):
            expected = ref[r, len(p) :].tolist()
            if eos in expected:
                expected = expected[: expected.index(eos) + 1]
                ended_early += len(expected) < 10
            assert mine[r] == expected, (k, lp, es, r)
    assert ended_early > 2  # the end-token paths were exercised


def test_sharded_folders_both_ways(tmp_path):
    hf = make_hf(eager=False, **SHAPES["gqa-tied"])
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    ours = from_hf(tmp_path / "hf")  # dispatch on model_type
    assert isinstance(ours, Llama)
    ids = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids).logits).abs().max() < 1e-5

    save_hf(ours, tmp_path / "ours", max_shard_size=20_000)
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / "ours" / "model.safetensors").exists()
    total = sum(t.nbytes for t in hf.state_dict().values()) - hf.lm_head.weight.nbytes  # tied
    assert index["metadata"]["total_size"] == total
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert (back(ids).logits - ours(ids).logits).abs().max() < 1e-5
    save_hf(ours, tmp_path / "ours")  # unsharded over it: the index goes
    assert not (tmp_path / "ours" / "model.safetensors.index.json").exists()
    assert (hf_llama.load(tmp_path / "ours")(ids).logits == ours(ids).logits).all()


def test_llama3_frequencies_equal_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attnlm.nn.positional import RotaryEmbedding

    cfg = transformers.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA3, original_max_position_embeddings=8192),
    )
    ref, scale = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    scaling = {k: v for k, v in LLAMA3.items() if k != "rope_type"}
    scaling["original_max_position_embeddings"] = 8192
    ours = RotaryEmbedding(64, base=500000.0, scaling=scaling).inv_freq
    assert scale == 1.0
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    plain = RotaryEmbedding(64, base=500000.0).inv_freq
    assert (ours <= plain).all() and (ours < plain).any() and ours[0] == plain[0]


@pytest.mark.parametrize(
    "yarn",
    [
        {"factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen3's 128K setting
        {"factor": 8.0, "original_max_position_embeddings": 8192, "beta_fast": 16.0,
         "beta_slow": 2.0, "attention_factor": 1.5},
        {"factor": 2.0, "original_max_position_embeddings": 64},  # a ramp of equal ends
    ],
)  # fmt: skip
def test_yarn_frequencies_and_scale_equal_transformers(yarn):
    """YaRN: the frequencies (extrapolated, interpolated, the ramp between) and the scale of
    cos and sin as ``transformers`` computes them, and the cos / sin the rotary gives."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attnlm.nn.positional import RotaryEmbedding

    cfg = transformers.Qwen3Config(
        hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=131072,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, **yarn},
    )  # fmt: skip
    ref, scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    rotary = RotaryEmbedding(128, base=1e6, scaling={"rope_type": "yarn", **yarn})
    torch.testing.assert_close(rotary.inv_freq, ref, rtol=0, atol=0)
    assert rotary.attention_scaling == pytest.approx(scale, rel=1e-12)
    cos, sin = rotary(torch.arange(5))
    angles = torch.arange(5).float()[:, None] * ref
    torch.testing.assert_close(cos[:, :64], angles.cos() * scale, rtol=0, atol=0)
    torch.testing.assert_close(sin[:, 64:], angles.sin() * scale, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="rope_scaling.factor"):
        LlamaConfig(vocab_size=V, block_size=32, n_layer=1, n_head=2, n_embd=16,
                    rope_scaling={"rope_type": "yarn", "factor": 0,
                                  "original_max_position_embeddings": 8})  # fmt: skip


def test_gqa_equals_mha_with_repeated_key_value_heads():
    """Independent check of grouped-query attention: a multi-head model whose key/value
    projections repeat each GQA head for its group of query heads gives the same logits."""
    cfg = LlamaConfig(vocab_size=V, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    gqa = Llama(cfg).eval()
    mha = Llama(LlamaConfig(**{**cfg.__dict__, "n_kv_head": 4})).eval()
    state = gqa.state_dict()
    D, C = cfg.head_dim, cfg.n_embd
    for i in range(cfg.n_layer):
        w = state[f"blocks.{i}.attn.qkv_proj.weight"]
        q, k, v = w.split([C, 2 * D, 2 * D])
        rep = [t.view(2, D, C).repeat_interleave(2, dim=0).reshape(4 * D, C) for t in (k, v)]
        state[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat([q, *rep])
    mha.load_state_dict(state)
    ids = torch.randint(0, V, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gqa(ids).logits, mha(ids).logits, rtol=1e-5, atol=1e-5)
        a = gqa(ids, return_attention=True).attentions
        b = mha(ids, return_attention=True).attentions
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_gqa_kv_cache_is_a_quarter_of_mha_measured_in_bytes():
    base = dict(vocab_size=V, block_size=64, n_layer=3, n_head=8, n_embd=64)
    sizes = {}
    for kv in (8, 2, 1):
        model = Llama(LlamaConfig(**base, n_kv_head=kv)).eval()
        state = model.new_state()
        with torch.no_grad():
            model.step(torch.randint(0, V, (2, 10)), state)
            model.step(torch.randint(0, V, (2, 1)), state)  # one decoding step more
        sizes[kv] = state.nbytes
        assert state.nbytes == 2 * 11 * kv_cache_bytes_per_token(model.config)  # B=2, 11 tokens
        assert state.keys[0].shape == (2, kv, 11, 8)
    assert sizes[2] * 4 == sizes[8]  # n_head / n_kv_head = 4: a quarter of the MHA cache
    assert sizes[1] * 8 == sizes[8]


def test_incremental_decoding_equals_the_full_forward():
    cfg = LlamaConfig(vocab_size=V, block_size=32, n_layer=2, n_head=4, n_kv_head=1, n_embd=32,
                      rope_scaling=dict(LLAMA3, original_max_position_embeddings=4))  # fmt: skip
    model = Llama(cfg).eval()
    ids = torch.randint(0, V, (3, 12))
    state = model.new_state()
    with torch.no_grad():
        parts = [model.step(ids[:, :5], state), model.step(ids[:, 5:6], state),
                 model.step(ids[:, 6:], state)]  # fmt: skip
        full = model(ids).logits
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_config_defaults_and_errors(tmp_path):
    assert llama_ffn_width(4096) == 11008  # Llama 7B
    assert llama_ffn_width(128) == 512
    cfg = LlamaConfig(vocab_size=10, block_size=8, n_layer=1, n_head=4, n_embd=16)
    assert cfg.n_kv_head == 4 and cfg.ffn_width == 256
    for bad, message in [
        ({"n_kv_head": 3}, "n_kv_head"),
        ({"n_kv_head": 0}, "n_kv_head"),
        ({"n_embd": 12, "n_head": 4}, "even head width"),
        ({"rope_scaling": {"rope_type": "dynamic"}}, "rope_type"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "original_max_position_embeddings must be a positive number",
        ),
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "mscale": 1.0,
                    "original_max_position_embeddings": 8,
                }
            },
            "unknown key",
        ),
        ({"rope_scaling": {**LLAMA3, "factor": -1}}, "factor"),
        ({"rope_theta": 0.0}, "rope_theta"),
    ]:
        with pytest.raises(ConfigError, match=message):
            LlamaConfig(**{**cfg.__dict__, **bad})
    hf = make_hf(**SHAPES["gqa-tied"])
    hf.save_pretrained(tmp_path)
    base = json.loads((tmp_path / "config.json").read_text())
    for change, message in [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"head_dim": 0}, "head_dim must be a positive integer"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "lacks a numeric 'factor'"),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "lacks a list 'short_factor'",
        ),
        ({"model_type": "gpt2"}, "expected 'llama'"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(ConfigError, match=message):
            hf_llama.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**base, "num_key_value_heads": 4}))
    with pytest.raises(InputError, match="shape"):
        hf_llama.load(tmp_path)
    # a head width of its own is read (d_head): weights of the other width do not fit it
    (tmp_path / "config.json").write_text(json.dumps({**base, "head_dim": 16}))
    with pytest.raises(InputError, match="shape"):
        hf_llama.load(tmp_path)
