"""Partial rotary (Phi-4 mini: 96 of each head's 128 features rotate, ``rotary_dim``): the first
``R`` features of q and k turn in rotate-half pairs ``(i, i + R/2)`` with frequencies
``base^(-2i/R)``, the rest pass as they are. By hand here; the trace and the training path
compute the same, the one-token flat step too (tests/runtime/test_eager.py). Against
``transformers``' Phi-3 with a ``partial_rotary_factor``: tests/models/hf/test_hf_archs.py;
against llama.cpp (a ``phi3`` file with ``rope.dimension_count`` 48 of 64, on the PyTorch path
and the C engine): tests/runtime/test_engine_llamacpp.py and tests/models/gguf/test_gguf_archs.py
(``phi4-mini``); the in-PyTorch C step: tests/runtime/test_cstep.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlm.base.errors import ConfigError
from attnlm.inspect.trace import trace
from attnlm.models.llama import Llama, LlamaConfig, describe_parts

CONFIG = dict(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
              d_ff=24, rotary_dim=6)  # fmt: skip


def _model(**kw) -> Llama:
    torch.manual_seed(0)
    m = Llama(LlamaConfig(**{**CONFIG, **kw})).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.3)
    return m


def _ids(rows: int = 2, t: int = 9) -> torch.Tensor:
    return torch.randint(0, 37, (rows, t), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def test_the_first_r_features_turn_and_the_rest_pass():
    m = _model()
    attn = m.blocks[0].attn
    x = torch.randn(1, 5, 32)
    positions = torch.arange(5)
    got, _, _ = m.blocks[0](x, is_causal=True, rotary=m.rotary(positions))
    inv = 1.0 / 10000.0 ** (torch.arange(0, 6, 2).float() / 6)  # R = 6: 3 pairs
    angle = positions[:, None].float() * inv  # (T, 3)
    cos, sin = angle.cos(), angle.sin()

    def turn(t):  # (1, H, T, 8): pairs (i, i + 3) of the first 6 features
        a, b, rest = t[..., :3], t[..., 3:6], t[..., 6:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], -1)

    h = F.rms_norm(x, (32,), m.blocks[0].ln_1.weight, 1e-6)
    q, k, v = attn.qkv_proj(h).split([32, 16, 16], dim=-1)
    heads = lambda t: t.view(1, 5, -1, 8).transpose(1, 2)  # noqa: E731
    q, k, v = turn(heads(q)), turn(heads(k)), heads(v)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    a = x + attn.out_proj(y.transpose(1, 2).reshape(1, 5, 32))
    want = a + m.blocks[0].mlp(F.rms_norm(a, (32,), m.blocks[0].ln_2.weight, 1e-6))
    assert torch.allclose(got, want, atol=1e-5)
    full = _model(rotary_dim=None)  # the same weights, every feature turned: other numbers
    assert not torch.allclose(full(_ids()).logits, m(_ids()).logits, atol=1e-3)


def test_training_takes_the_plain_path_with_the_same_gradients():
    """The fused rotary kernel turns whole heads: partial rotary takes apply_rotary, whose
    gradients equal a copy's computed in float64."""
    m = _model().train()
    ids = _ids()
    m(ids, targets=ids).loss.backward()
    ref = _model().double().train()
    ref(ids, targets=ids).loss.backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad.double(), q.grad, atol=1e-5), name


@torch.no_grad()
def test_the_trace_computes_the_forward():
    m = _model()
    ids = _ids()
    t = trace(m, ids)
    assert torch.equal(t.logits, m(ids).logits)
    q = t["blocks.0.attn.hook_rot_q"]  # (B, T, H, D): its last 2 features as projected
    plain = t["blocks.0.attn.hook_q"]
    assert torch.allclose(q[..., 6:], plain[..., 6:], atol=1e-6)
    assert not torch.allclose(q[:, 1:, :, :6], plain[:, 1:, :, :6], atol=1e-3)


def test_config_checks_and_description():
    assert "partial rotary (6 of 8 features)" in describe_parts(LlamaConfig(**CONFIG))
    for bad in (7, 10, 0):
        with pytest.raises(ConfigError, match="rotary_dim must be an even number"):
            LlamaConfig(**{**CONFIG, "rotary_dim": bad})
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
               "original_max_position_embeddings": 8, "factor": 4.0}  # fmt: skip
    with pytest.raises(ConfigError, match="short_factor must list 3 positive numbers"):
        LlamaConfig(**{**CONFIG, "rope_scaling": scaling})  # (3 pairs turn, not 4)
