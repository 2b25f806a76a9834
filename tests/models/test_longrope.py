"""LongRoPE (Phi-3's and Phi-3.5's 128k models): two sets of per-pair frequency factors, the
long one taken by a forward call that reaches past the original context, cos and sin scaled.

References: ``transformers``' ``ROPE_INIT_FUNCTIONS["longrope"]`` (the frequencies and scale)
and its ``Phi3ForCausalLM`` (the choice per call, with a KV cache across the original
context); the GGUF side is tested against llama.cpp in ``tests/runtime`` and
``tests/models/gguf`` (the ``phi3-longrope`` fixture).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from attnlm.base.errors import ConfigError
from attnlm.models.hf import from_hf
from attnlm.models.llama import LlamaConfig
from attnlm.nn.positional import RotaryEmbedding
from attnlm.nn.yarn import longrope_scale

D, N = 64, 32  # head width, original context
_G = np.random.default_rng(0)
SHORT = [round(float(v), 4) for v in 1 + 0.3 * _G.random(D // 2)]
LONG = [round(float(v), 4) for v in 1 + 40 * _G.random(D // 2) ** 2]


def _phi3(original: int = N, context: int = 8 * N, **extra) -> transformers.Phi3Config:
    return transformers.Phi3Config(
        vocab_size=61, hidden_size=4 * D, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=context,
        original_max_position_embeddings=original, pad_token_id=None, sliding_window=None,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": SHORT,
                         "long_factor": LONG, **extra},
    )  # fmt: skip


def _ours(original: int = N, factor: float = 8.0, **extra) -> RotaryEmbedding:
    scaling = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
               "original_max_position_embeddings": original, "factor": factor, **extra}  # fmt: skip
    return RotaryEmbedding(D, base=1e4, scaling=scaling)


@pytest.mark.parametrize("length", [5, N, N + 1, 3 * N])
def test_frequencies_and_scale_equal_transformers(length):
    """Up to the original context the short set, past it the long one; both scaled."""
    ref, scale = ROPE_INIT_FUNCTIONS["longrope"](_phi3(), "cpu", seq_len=length)
    assert scale == pytest.approx(math.sqrt(1 + math.log(8) / math.log(N)), rel=1e-12)
    positions = torch.arange(length)
    cos, sin = _ours()(positions)
    angles = positions.float()[:, None] * ref
    angles = torch.cat([angles, angles], -1)
    assert torch.equal(cos, angles.cos() * scale) and torch.equal(sin, angles.sin() * scale)


def test_an_attention_factor_given_replaces_the_scale():
    ref, scale = ROPE_INIT_FUNCTIONS["longrope"](_phi3(attention_factor=1.25), "cpu")
    rotary = _ours(attention_factor=1.25)
    assert scale == rotary.attention_scaling == 1.25 == longrope_scale(8.0, N, 1.25)
    assert longrope_scale(1.0, N) == 1.0  # no context gained, no scale


def test_each_row_of_a_batch_chooses_its_own_set():
    rotary = _ours()
    rows = torch.stack([torch.arange(10), torch.arange(N - 5, N + 5)])  # short, long
    cos, _ = rotary(rows)
    assert torch.equal(cos[0, 0], rotary(rows[0])[0]) and torch.equal(cos[1, 0], rotary(rows[1])[0])
    assert not torch.equal(rotary(torch.arange(N - 5, N))[0], cos[1, 0, :5])  # the set differs


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    config = _phi3(original=8, context=64)
    config._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 0.15)
    folder = tmp_path_factory.mktemp("phi3-longrope")
    hf.eval().save_pretrained(folder)
    return hf, from_hf(folder)


def test_a_forward_past_the_original_context_equals_transformers(pair):
    hf, ours = pair
    assert ours.config.rope_scaling["original_max_position_embeddings"] == 8
    assert ours.config.rope_scaling["factor"] == 8.0  # 64 / 8, as transformers derives it
    ids = torch.randint(3, 61, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        for t in (6, 20):  # within the original context (short), past it (long)
            got = ours(ids[:, :t]).logits
            assert torch.allclose(got, hf(ids[:, :t]).logits, atol=2e-5, rtol=0), t
        assert torch.allclose(ours(ids).logits, want, atol=2e-5, rtol=0)


def test_a_cache_across_the_original_context_follows_transformers(pair):
    """A prompt of 6 cached with short rotations, then one token at a time past position 8:
    each later step rotates with the long set, as ``transformers`` does (the cache keeps its
    short keys); the logits differ from one forward over all 12 (long everywhere)."""
    hf, ours = pair
    ids = torch.randint(3, 61, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = hf(ids[:, :6], use_cache=True)
        want, past = [out.logits], out.past_key_values
        for t in range(6, 12):
            out = hf(ids[:, t : t + 1], cache=past, use_cache=True)
            want.append(out.logits)
            past = out.past_key_values
        state = ours.new_state()
        got = [ours(ids[:, :6], cache=state).logits]
        got += [ours(ids[:, t : t + 1], cache=state).logits for t in range(6, 12)]
        got, want = torch.cat(got, 1), torch.cat(want, 1)
        assert torch.allclose(got, want, atol=2e-5, rtol=0)
        assert not torch.allclose(got, ours(ids).logits, atol=1e-3)  # (the choice matters)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"short_factor": [1.0]}, "short_factor must list 32 positive numbers"),
        ({"long_factor": [1.0] * 31 + [0.0]}, "long_factor must list 32 positive"),
        ({"factor": None}, "factor must be a positive number"),
        ({"original_max_position_embeddings": 0}, "original_max_position_embeddings must be"),
        ({"mscale": 1.0}, "unknown key model.rope_scaling.mscale"),
    ],
)
def test_a_bad_table_is_refused_naming_the_key(change, message):
    scaling = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
               "original_max_position_embeddings": N, "factor": 8.0, **change}  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        LlamaConfig(vocab_size=61, block_size=256, n_layer=1, n_head=4, n_embd=4 * D,
                    rope_scaling=scaling)  # fmt: skip
