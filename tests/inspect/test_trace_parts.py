"""Tracing a Llama with the family's optional parts (``attnlm.inspect.trace``): q/k norms,
post-norms, GeGLU, sliding windows with a local rotary base, scaled and soft-capped scores,
the embedding scale, the final soft-cap and a layer without positions (NoPE). The logits are
bit-identical with and without a trace, every name is captured in the order of the pass, and
the parts' points hold what the modules compute (checked by hand)."""

from __future__ import annotations

import torch

from attnlm.inspect.trace import hook, hook_names, trace, zero
from attnlm.models.llama import Llama, LlamaConfig

SLIDE, FULL = "sliding_attention", "full_attention"
CONFIG = dict(vocab_size=37, block_size=32, n_layer=3, n_head=4, n_kv_head=2, n_embd=16, d_ff=24,
              arch="gemma3", d_head=6, qk_norm=True, sliding_window=3,
              layer_types=(SLIDE, FULL, SLIDE), rope_local_theta=100.0, embed_scale=4.0,
              post_norms=True, mlp_act="gelu_tanh", attn_scale=0.3, attn_softcap=2.0,
              final_softcap=5.0, qkv_bias=True, nope_layers=(2,))  # fmt: skip


def _model() -> Llama:
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**CONFIG))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(3))


def test_logits_are_bit_identical_with_and_without_a_trace():
    model, ids = _model(), _ids()
    with torch.inference_mode():
        plain = model(ids).logits
    for names in (None, ["blocks.0.attn.hook_pattern", "blocks.1.attn.q_norm.hook_normalized"], []):
        assert torch.equal(trace(model, ids, names=names).logits, plain)
    identity = [hook("blocks.0.attn.hook_q", lambda t: t)]  # the explicit formula: same numbers
    assert torch.allclose(trace(model, ids, interventions=identity).logits, plain, atol=1e-5)


@torch.inference_mode()
def test_a_layer_without_positions_has_no_rotated_points():
    """Layer 2 (NoPE) has q/k norms but no rotation: its scores are the normed q and k's."""
    model, ids = _model(), _ids()
    names = hook_names(model)
    assert "blocks.0.attn.hook_rot_q" in names and "blocks.2.attn.hook_rot_q" not in names
    p = "blocks.2.attn"
    t = trace(model, ids, names=[f"{p}.q_norm.hook_normalized", f"{p}.k_norm.hook_normalized",
                                 f"{p}.hook_attn_scores"])  # fmt: skip
    q = t[f"{p}.q_norm.hook_normalized"] * model.blocks[2].attn.q_norm.weight  # (B, T, H, D)
    k = t[f"{p}.k_norm.hook_normalized"] * model.blocks[2].attn.k_norm.weight  # (B, T, Hkv, D)
    k = k.repeat_interleave(2, dim=2)  # each key head serves 2 query heads
    raw = torch.einsum("bthd,bshd->bhts", q, k) * 0.3
    capped = 2.0 * torch.tanh(raw / 2.0)
    got = t[f"{p}.hook_attn_scores"]
    i, j = torch.arange(9)[:, None], torch.arange(9)
    seen = (j <= i) & (i - j < 3)  # causal, within the sliding layer's window of 3
    assert torch.allclose(got[..., seen], capped[..., seen], atol=1e-5)


@torch.inference_mode()
def test_the_parts_points_in_order_and_by_hand():
    model, ids = _model(), _ids()
    names = hook_names(model)
    t = trace(model, ids)
    assert list(t) == names
    p = "blocks.0"
    order = [names.index(f"{p}.{n}") for n in ("attn.hook_q", "attn.q_norm.hook_normalized",
             "attn.k_norm.hook_normalized", "attn.hook_rot_q", "ln1_post.hook_normalized",
             "hook_attn_out", "ln2_post.hook_normalized", "hook_mlp_out")]  # fmt: skip
    assert order == sorted(order)
    block = model.blocks[0]
    q = t[f"{p}.attn.hook_q"]  # (B, T, H, D) before the norm
    normed = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(t[f"{p}.attn.q_norm.hook_normalized"], normed, atol=1e-5)
    assert t[f"{p}.attn.q_norm.hook_scale"].shape == (2, 9, 4, 1)
    out = t[f"{p}.ln1_post.hook_normalized"] * block.ln_post_attn.weight
    assert torch.allclose(t[f"{p}.hook_attn_out"], out, atol=1e-5)
    assert torch.allclose(t[f"{p}.hook_resid_mid"] - t[f"{p}.hook_resid_pre"],
                          t[f"{p}.hook_attn_out"], atol=1e-5)  # fmt: skip
    emb = model.tok_emb(ids) * 4.0
    assert torch.allclose(t["hook_embed"], emb)
    assert float(t["hook_logits"].abs().max()) <= 5.0  # soft-capped
    pattern = t[f"{p}.attn.hook_pattern"]  # a sliding layer: nothing 3 or more positions back
    i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    assert float(pattern[:, :, (i - j) >= 3].abs().max()) == 0.0
    scores = t[f"{p}.attn.hook_attn_scores"]
    assert float(scores[:, :, ((i - j) < 3) & (j <= i)].abs().max()) <= 2.0  # capped at 2


def test_an_intervention_on_a_post_norm_changes_the_output():
    model, ids = _model(), _ids()
    plain = trace(model, ids, names=[]).logits
    edited = trace(model, ids, names=[], interventions=[zero("blocks.1.ln2_post.hook_normalized")])
    assert not torch.allclose(edited.logits, plain)
