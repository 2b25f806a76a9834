"""OLMo 2's two parts of the Llama family, by hand: blocks without pre-norms whose sublayer
outputs are normalised (``pre_norms = false``, ``post_norms``), and q/k norms over all heads
at once (``qk_norm_all``); the one-token flat step and the trace compute them too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from attnlm.base.errors import ConfigError
from attnlm.inspect.params import llama_count
from attnlm.inspect.trace import Intervention, hook_names, trace
from attnlm.models.llama import Llama, LlamaConfig

OLMO = dict(vocab_size=37, block_size=32, n_layer=3, n_head=4, n_kv_head=2, n_embd=16, d_ff=24,
            arch="olmo2", pre_norms=False, post_norms=True, qk_norm=True,
            qk_norm_all=True)  # fmt: skip


def _model(seed: int = 0) -> Llama:
    m = Llama(LlamaConfig(**OLMO)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            scale = 0.3 if "norm" in name or "ln" in name else 0.2
            p.copy_((1.0 if "norm" in name or "ln" in name else 0.0)
                    + torch.randn(p.shape, generator=g) * scale)  # fmt: skip
    return m


def _ids(rows: int = 2, t: int = 9) -> torch.Tensor:
    return torch.randint(0, 37, (rows, t), generator=torch.Generator().manual_seed(1))


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@torch.no_grad()
def test_a_block_by_hand():
    """``h = x + N_attn(attn(x))``, ``h + N_mlp(mlp(h))``; q and k each RMS-normalised over
    all their heads' features (H D and Hkv D) before the rotation."""
    m = _model()
    block, attn = m.blocks[0], m.blocks[0].attn
    assert isinstance(block.ln_1, torch.nn.Identity) and isinstance(block.ln_2, torch.nn.Identity)
    assert attn.q_norm.weight.shape == (16,) and attn.k_norm.weight.shape == (8,)
    x = torch.randn(1, 6, 16)
    cos, sin = m.rotary(torch.arange(6))
    got, _, _ = block(x, is_causal=True, rotary=(cos, sin))
    q, k, v = attn.qkv_proj(x).split([16, 8, 8], dim=-1)
    q, k = _rms(q, attn.q_norm.weight), _rms(k, attn.k_norm.weight)  # over all heads
    heads = lambda t: t.view(1, 6, -1, 4).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    half = lambda t: torch.cat([-t[..., 2:], t[..., :2]], -1)  # noqa: E731 (rotate-half)
    q, k = q * cos + half(q) * sin, k * cos + half(k) * sin
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    a = attn.out_proj(y.transpose(1, 2).reshape(1, 6, 16))
    h = x + _rms(a, block.ln_post_attn.weight)
    want = h + _rms(block.mlp(h), block.ln_post_mlp.weight)
    assert torch.allclose(got, want, atol=1e-5)


def test_parameters_and_config_checks():
    m = _model()
    assert llama_count(m.config) == sum(p.numel() for p in m.parameters())
    with pytest.raises(ConfigError, match="pre_norms"):
        LlamaConfig(**{**OLMO, "post_norms": False})
    with pytest.raises(ConfigError, match="qk_norm_all needs"):
        LlamaConfig(**{**OLMO, "qk_norm": False})


@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_the_flat_step_equals_the_forward(static):
    from attnlm.runtime.eager import flat_step, flat_step_applies

    m = _model()
    ids = _ids()
    full = m(ids).logits
    state = m.new_state(max_len=16) if static else m.new_state()
    steps = [m(ids[:, :2], cache=state).logits]
    for t in range(2, ids.shape[1]):
        assert flat_step_applies(m, ids[:, t : t + 1], state)
        steps.append(flat_step(m, ids[:, t : t + 1], state))
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


@torch.no_grad()
def test_the_trace_has_the_wide_norms_points_and_no_pre_norm_points():
    m = _model()
    ids = _ids()
    names = hook_names(m)
    assert not [n for n in names if ".ln1." in n or ".ln2." in n]
    t = trace(m, ids)
    assert torch.equal(t.logits, m(ids).logits)
    scale, normed = t["blocks.0.attn.q_norm.hook_scale"], t["blocks.0.attn.q_norm.hook_normalized"]
    assert scale.shape == (2, 9, 1, 1) and normed.shape == (2, 9, 4, 4)
    q = t["blocks.0.attn.hook_q"].reshape(2, 9, 16)  # (B, T, H, D) -> all heads' features
    assert torch.allclose(scale[..., 0, 0], torch.sqrt(q.pow(2).mean(-1) + 1e-6), atol=1e-6)
    assert torch.allclose(normed.reshape(2, 9, 16), q / scale[..., 0], atol=1e-6)
    # doubling the scale halves the normalised q: the model with half the q norm's gains
    edited = trace(m, ids, names=[], interventions=[
        Intervention("blocks.0.attn.q_norm.hook_scale", "scale", 2.0)])  # fmt: skip
    halved = copy.deepcopy(m)
    halved.blocks[0].attn.q_norm.weight.mul_(0.5)
    assert torch.allclose(edited.logits, halved(ids).logits, atol=1e-5)
    assert not torch.allclose(edited.logits, t.logits, atol=1e-3)
