"""``attnlm.inspect.trace``: every named activation against an independent computation from the
model's own modules, logits bit-identical with and without a trace, and interventions doing
what they say (a zero-ablated head equals its slice of the output projection zeroed by hand)."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.inspect.trace import (
    Intervention,
    add,
    hook,
    hook_names,
    mean_ablate,
    patch,
    scale,
    set_,
    trace,
    zero,
)
from attnlm.quant.layers import quantize_weights
from gguf_export_support import tiny_model

FAMILIES = ["gpt", "llama"]


def close(a, b) -> bool:
    """Equal up to float32 rounding of the other kernels (the reference runs the explicit
    attention formula; the tiny models' activations are of order 10)."""
    return torch.allclose(a, b, rtol=1e-4, atol=1e-4)


def _model(family):
    model, tok = tiny_model(family)
    rows = [tok.encode("the quick brown fox jumps"), tok.encode("hello world! the lazy dog")]
    n = min(map(len, rows))
    ids = torch.tensor([r[:n] for r in rows])
    return model, tok, ids


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("weights", ["f32", "q8", "q4"])
def test_logits_are_bit_identical_with_and_without_a_trace(family, weights):
    model, _, ids = _model(family)
    if weights != "f32":
        quantize_weights(model, weights)
    with torch.inference_mode():
        plain = model(ids).logits
    for names in (None, ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_result"], []):
        assert torch.equal(trace(model, ids, names=names).logits, plain)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_every_name_against_the_modules(family):
    model, _, ids = _model(family)
    t = trace(model, ids)
    assert list(t) == hook_names(model)  # every name, in the order of the pass
    with torch.inference_mode():
        out = model(ids, return_attention=True, return_hidden=True)
    B, T = ids.shape
    for layer, block in enumerate(model.blocks):
        p = f"blocks.{layer}"
        x = out.hidden_states[layer]
        assert close(t[f"{p}.hook_resid_pre"], x)
        assert close(t[f"{p}.hook_resid_post"], out.hidden_states[layer + 1])
        attn = block.attn
        with torch.inference_mode():
            h = block.ln_1(x)
            q, k, v = (t_.view(B, T, -1, attn.d_head)
                       for t_ in attn._split_qkv(attn.qkv_proj(h)))  # fmt: skip
            attn_out, _ = attn(h, is_causal=True, rotary=model._rotations(
                torch.arange(T), x.dtype), layer=layer)  # fmt: skip
        for name, want in (("q", q), ("k", k), ("v", v)):
            assert close(t[f"{p}.attn.hook_{name}"], want), name
        assert t[f"{p}.attn.hook_k"].shape[2] == attn.n_kv_head
        pattern = t[f"{p}.attn.hook_pattern"]
        assert close(pattern, out.attentions[layer])
        assert close(pattern.sum(-1), torch.ones(B, attn.n_head, T))
        scores = t[f"{p}.attn.hook_attn_scores"]
        assert scores[0, 0, 0, 1] == torch.finfo(scores.dtype).min  # a future key
        assert close(scores.softmax(-1), pattern)
        z = t[f"{p}.attn.hook_z"]  # each head's pattern-weighted values
        vs = attn._shared(v.transpose(1, 2))  # (B, H, T, D)
        assert close(z, (pattern @ vs).transpose(1, 2))
        result = t[f"{p}.attn.hook_result"]
        bias = attn.out_proj.bias if attn.out_proj.bias is not None else 0
        assert close(result.sum(2) + bias, t[f"{p}.hook_attn_out"])
        assert close(t[f"{p}.hook_attn_out"], attn_out)
        assert close(t[f"{p}.hook_resid_mid"], x + attn_out)
        # the norms: scale and normalized by hand, then the norm's weight gives its output
        xs = x - x.mean(-1, keepdim=True) if family == "gpt" else x
        s = (xs.pow(2).mean(-1, keepdim=True) + block.ln_1.eps).sqrt()
        assert close(t[f"{p}.ln1.hook_scale"], s)
        assert close(t[f"{p}.ln1.hook_normalized"], xs / s)
        mlp_in = block.ln_2(t[f"{p}.hook_resid_mid"])
        with torch.inference_mode():
            assert close(t[f"{p}.hook_mlp_out"], block.mlp(mlp_in))
            assert close(block.mlp.proj(t[f"{p}.mlp.hook_post"]),
                                  t[f"{p}.hook_mlp_out"])  # fmt: skip
    assert close(t["hook_logits"], out.logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_ablating_a_head_equals_zeroing_its_output_projection_slice(family):
    model, _, ids = _model(family)
    layer, head = 1, 2
    ablated = trace(model, ids, names=[], interventions=[zero(f"blocks.{layer}.attn.hook_z",
                                                               head=head)]).logits  # fmt: skip
    by_hand = copy.deepcopy(model)
    attn = by_hand.blocks[layer].attn
    with torch.no_grad():
        attn.out_proj.weight[:, head * attn.d_head : (head + 1) * attn.d_head] = 0
        plain_hand = by_hand(ids).logits
    assert torch.allclose(ablated, plain_hand, atol=1e-5)
    assert not torch.allclose(ablated, trace(model, ids, names=[]).logits, atol=1e-3)


def test_interventions_set_add_scale_mean_patch_and_hooks():
    model, tok, ids = _model("llama")
    name = "blocks.0.hook_resid_mid"
    base = trace(model, ids, names=[name])[name]
    got = trace(model, ids, names=[name], interventions=[scale(name, 2.0, position=3)])[name]
    assert torch.allclose(got[:, 3], 2 * base[:, 3]) and torch.equal(got[:, :3], base[:, :3])
    got = trace(model, ids, names=[name], interventions=[add(name, 1.0), set_(name, 0.5,
                                                          position=0)])[name]  # fmt: skip
    assert torch.allclose(got[:, 1:], base[:, 1:] + 1) and torch.all(got[:, 0] == 0.5)
    got = trace(model, ids, names=[name], interventions=[mean_ablate(name)])[name]
    assert torch.allclose(got, base.mean(dim=(0, 1), keepdim=True).expand_as(base), atol=1e-6)
    z = "blocks.1.attn.hook_z"
    zs = trace(model, ids, names=[z])[z]
    got = trace(model, ids, names=[z], interventions=[mean_ablate(z, head=1)])[z]
    assert torch.allclose(got[:, :, 1], zs[:, :, 1].mean(dim=(0, 1), keepdim=True).expand(
        zs.shape[0], zs.shape[1], -1), atol=1e-6)  # fmt: skip
    assert torch.equal(got[:, :, 0], zs[:, :, 0])
    # patching every layer's input from another run gives that run's logits
    other = torch.flip(ids, dims=[1])
    src = trace(model, other, names=["blocks.0.hook_resid_pre"])
    patched = trace(model, ids, names=[], interventions=[patch("blocks.0.hook_resid_pre", src)])
    assert torch.allclose(patched.logits, trace(model, other, names=[]).logits, atol=1e-5)
    # a TransformerLens-style hook function
    seen = []
    trace(model, ids, names=[], interventions=[hook(name, lambda t: seen.append(t.shape) or t)])
    assert seen == [base.shape]


def test_a_hook_that_edits_in_place_changes_only_what_follows():
    """TransformerLens's idiom: a hook edits its tensor in place and returns it. The captured
    activations before the hook (one tensor with the hooked one: the previous block's output)
    keep their values; the hooked point and the logits change."""
    model, tok, ids = _model("gpt")
    post, pre = "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"
    clean = trace(model, ids, names=[post, pre])

    def edit(t):
        t[:, 2] = 0.0
        return t

    got = trace(model, ids, names=[post, pre], interventions=[hook(pre, edit)])
    assert torch.equal(got[post], clean[post])
    assert torch.all(got[pre][:, 2] == 0) and torch.equal(got[pre][:, 3:], clean[pre][:, 3:])
    assert not torch.equal(got.logits, clean.logits)


def test_bad_names_heads_and_positions_are_one_line():
    model, tok, ids = _model("gpt")
    with pytest.raises(InputError, match="unknown hook name 'blocks.0.attn.hook_nope'"):
        trace(model, ids, names=["blocks.0.attn.hook_nope"])
    with pytest.raises(
        InputError, match=r"head 7 is out of range for blocks.0.attn.hook_z \(4 heads\)"
    ):
        trace(model, ids, interventions=[zero("blocks.0.attn.hook_z", head=7)])
    with pytest.raises(InputError, match="has no head axis"):
        trace(model, ids, interventions=[zero("blocks.0.hook_resid_pre", head=1)])
    with pytest.raises(InputError, match="position 99 is out of range"):
        trace(model, ids, interventions=[zero("blocks.0.hook_resid_pre", position=99)])
    with pytest.raises(InputError, match="not one of"):
        Intervention("hook_embed", "explode")
    with pytest.raises(InputError, match="a text needs the tokenizer"):
        trace(model, "the quick")
    assert "blocks.0.attn.hook_rot_q" not in hook_names(model)  # learned positions, no rotary
    assert "blocks.0.mlp.hook_pre_linear" not in hook_names(model)


def test_a_text_traces_like_its_ids():
    model, tok, _ = _model("llama")
    t = trace(model, "the quick", tokenizer=tok, names=["hook_embed"])
    assert t.tokens.tolist() == [tok.encode("the quick")]
    assert torch.equal(t.logits, trace(model, t.tokens, names=[]).logits)


def test_models_that_are_not_decoders_are_refused():
    from attnlm.models.registry import build

    bert, _, _ = build({"type": "bert", "vocab_size": 50, "block_size": 16, "n_layer": 1,
                        "n_head": 2, "n_embd": 8})  # fmt: skip
    with pytest.raises(InputError, match="tracing needs a causal decoder"):
        trace(bert, torch.tensor([[1, 2, 3]]))
