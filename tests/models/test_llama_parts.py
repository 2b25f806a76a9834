"""The Llama family's optional parts (``attnlm.models.llama``), each against a hand computation:
the sliding window's band, the score's scale and soft-cap, the final soft-cap, the embedding
scale, linear rotary scaling, the head width, q/k norms, post-norms, GeGLU and layers without
positions (NoPE), Granite's residual and logit scales; a model with every
part decodes through the KV cache (dynamic, static, fixed), left-padded, and through
``attnlm.generate`` with the logits of its full forward; the defaults build today's Llama; bad
values are refused in one line naming the field; the C step refuses what it does not compute."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlm.base.errors import ConfigError
from attnlm.generate.loop import decode
from attnlm.generate.sampling import SamplingConfig
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.nn.attention import ScaledScore
from attnlm.nn.blocks import GeGLU, SandwichBlock, SwiGLU, TransformerBlock
from attnlm.nn.masks import window_mask
from attnlm.nn.positional import RotaryEmbedding
from attnlm.nn.score_functions import ScaledDotScore

SLIDE, FULL = "sliding_attention", "full_attention"
BASE = dict(vocab_size=37, block_size=32, n_layer=4, n_head=4, n_kv_head=2, n_embd=16, d_ff=24)
EVERY = dict(arch="gemma3", d_head=6, qkv_bias=True, qk_norm=True, sliding_window=3,
             layer_types=(SLIDE, SLIDE, FULL, SLIDE), rope_local_theta=100.0, rope_theta=1e4,
             rope_scaling={"rope_type": "linear", "factor": 2.0}, embed_scale=4.0,
             post_norms=True, mlp_act="gelu_tanh", attn_scale=0.3, attn_softcap=2.0,
             final_softcap=5.0, nope_layers=(1,))  # fmt: skip


def _random(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if "ln" in name else 0.2))
            if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(1.0)
    return model.eval()


def _every(**over) -> Llama:
    torch.manual_seed(0)
    return _random(Llama(LlamaConfig(**{**BASE, **EVERY, **over})))


def _ids(rows: int = 2, t: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 37, (rows, t), generator=torch.Generator().manual_seed(seed))


# -- each part by hand --------------------------------------------------------------------------


def test_window_mask_is_the_band_of_the_last_w_positions():
    m = window_mask(torch.arange(5), torch.arange(5), 2)
    allowed = [[int(i - j < 2) for j in range(5)] for i in range(5)]  # causal left to its mask
    assert (m == 0).int().tolist() == allowed
    assert torch.isneginf(m[4, 2]) and m[4, 3] == 0 and m[0, 4] == 0
    rows = window_mask(torch.tensor([[3, 4]]), torch.tensor([[-1, 0, 1, 2, 3, 4]]), 3)
    assert rows.shape == (1, 1, 2, 6)
    assert (rows[0, 0] == 0).int().tolist() == [[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]


def test_scaled_score_scale_and_softcap_by_hand():
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4)
    raw = q @ k.transpose(-2, -1)
    assert torch.allclose(ScaledScore(0.7)(q, k), raw * 0.7)
    assert torch.allclose(ScaledScore()(q, k), ScaledDotScore()(q, k))
    capped = ScaledScore(0.7, softcap=1.5)
    assert torch.allclose(capped(q, k), 1.5 * torch.tanh(raw * 0.7 / 1.5))
    assert not capped.supports_sdpa and ScaledScore(0.7).supports_sdpa
    assert float(capped(q * 100, k).abs().max()) <= 1.5


def test_final_softcap_and_embed_scale_by_hand():
    plain = _random(Llama(LlamaConfig(**BASE)))
    capped = Llama(LlamaConfig(**BASE, final_softcap=0.5, embed_scale=3.0))
    capped.load_state_dict(plain.state_dict())
    with torch.no_grad():
        plain.tok_emb.weight.mul_(3.0)  # an untied head: the scale moves into the embedding
    ids = _ids()
    with torch.no_grad():
        want = 0.5 * torch.tanh(plain(ids).logits / 0.5)
        assert torch.allclose(capped.eval()(ids).logits, want, atol=1e-6)


def test_linear_rope_scaling_divides_every_frequency():
    plain = RotaryEmbedding(8, base=100.0)
    linear = RotaryEmbedding(8, base=100.0, scaling={"rope_type": "linear", "factor": 4.0})
    assert torch.equal(linear.inv_freq, plain.inv_freq / 4.0)
    cos, _ = linear(torch.tensor([8]))
    assert torch.allclose(cos, plain(torch.tensor([2]))[0])  # position 8 / 4


def test_parts_are_named_modules_with_their_shapes():
    m = _every()
    b0, b2 = m.blocks[0], m.blocks[2]
    assert type(b0) is SandwichBlock and isinstance(b0.mlp, GeGLU)
    attn = b0.attn
    assert attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 6, 16) and attn.qkv_proj.bias is not None
    assert attn.out_proj.weight.shape == (16, 24) and attn.out_proj.bias is None
    assert attn.q_norm.weight.shape == (6,) and attn.k_norm.weight.shape == (6,)
    assert (b0.attn.window, b2.attn.window) == (3, None)
    assert m.rotary_local is not None and m.embed_scale == 4.0 and m.final_softcap == 5.0
    assert {"blocks.0.ln_post_attn.weight", "blocks.0.ln_post_mlp.weight"} <= set(m.state_dict())


def test_geglu_and_post_norms_by_hand():
    m = _every()
    block = m.blocks[2]  # a full layer
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        gate, up = block.mlp.fc(x).chunk(2, dim=-1)
        want = block.mlp.proj(F.gelu(gate, approximate="tanh") * up)
        assert torch.allclose(block.mlp(x), want, atol=1e-6)
        h, _ = block.attn(
            block.ln_1(x), is_causal=True, rotary=m._rotations(torch.arange(5), x.dtype)
        )
        mid = x + block.ln_post_attn(h)
        want = mid + block.ln_post_mlp(block.mlp(block.ln_2(mid)))
        got, _, _ = block(x, is_causal=True, rotary=m._rotations(torch.arange(5), x.dtype))
        assert torch.allclose(got, want, atol=1e-6)


def test_q_and_k_norms_come_before_the_rotation():
    m = _every()
    attn = m.blocks[2].attn
    x = torch.randn(1, 4, 16)
    cos, sin = m._rotations(torch.arange(4), x.dtype)
    with torch.no_grad():
        q, k, _ = attn._project(x, (cos, sin))
        raw = attn.qkv_proj(x)[..., :24].view(1, 4, 4, 6).transpose(1, 2)
        normed = raw / torch.sqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-6) * attn.q_norm.weight
        half = torch.cat([-normed[..., 3:], normed[..., :3]], -1)
        assert torch.allclose(q, normed * cos + half * sin, atol=1e-5)


@torch.no_grad()
def test_a_layer_without_positions_sees_its_prefix_as_a_set():
    """One NoPE layer: attention without positions, so the last position's logits do not
    change when the tokens before it are reversed (with more layers the earlier positions'
    own prefixes differ: causal NoPE models still learn order); rotated, they do."""
    ids = _ids(1, 8)
    shuffled = torch.cat([ids[:, :7].flip(1), ids[:, 7:]], 1)
    one = {**BASE, "n_layer": 1}
    nope = _random(Llama(LlamaConfig(**one, nope_layers=(0,))))
    assert nope.blocks[0].attn.nope
    assert torch.allclose(nope(ids).logits[0, -1], nope(shuffled).logits[0, -1], atol=1e-5)
    turned = _random(Llama(LlamaConfig(**one)))
    a, b = turned(ids).logits[0, -1], turned(shuffled).logits[0, -1]
    assert not torch.allclose(a, b, atol=1e-3)


def test_a_nope_layer_ignores_the_rotation_it_is_handed():
    m = _random(Llama(LlamaConfig(**BASE, nope_layers=(2,))))
    x = torch.randn(1, 5, 16)
    turn = m._rotations(torch.arange(5), x.dtype)
    with torch.no_grad():
        y, _ = m.blocks[2].attn(x, rotary=turn, is_causal=True)
        plain, _ = m.blocks[2].attn(x, is_causal=True)
        turned, _ = m.blocks[1].attn(x, rotary=turn, is_causal=True)
        unturned, _ = m.blocks[1].attn(x, is_causal=True)
    assert torch.equal(y, plain) and not torch.allclose(turned, unturned, atol=1e-4)


@torch.no_grad()
def test_residual_and_logit_scales_by_hand():
    """Granite's parts: ``x + r · attn(LN₁(x))``, ``x + r · mlp(LN₂(x))``, logits / s."""
    m = _random(Llama(LlamaConfig(**{**BASE, "n_layer": 1}, residual_scale=0.25,
                                  logit_scale=4.0)))  # fmt: skip
    x = torch.randn(1, 5, 16)
    block = m.blocks[0]
    got, _, _ = block(x, is_causal=True)
    h = x + 0.25 * block.attn(block.ln_1(x), is_causal=True)[0]
    assert torch.allclose(got, h + 0.25 * block.mlp(block.ln_2(h)), atol=1e-6)
    ids = _ids(1, 5)
    hidden = m(ids, return_hidden=True).hidden_states[-1]
    want = m.lm_head(m.ln_f(hidden)) / 4.0
    assert torch.allclose(m(ids).logits, want, atol=1e-6)


@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_the_flat_step_computes_granites_scales(static):
    from attnlm.runtime.eager import flat_step, flat_step_applies

    torch.manual_seed(0)
    m = _random(Llama(LlamaConfig(**BASE, residual_scale=0.5, logit_scale=3.0, embed_scale=2.0,
                                  attn_scale=0.2)))  # fmt: skip
    ids = _ids(2, 8)
    full = m(ids).logits
    state = m.new_state(max_len=16) if static else m.new_state()
    steps = [m(ids[:, :2], cache=state).logits]
    for t in range(2, 8):
        assert flat_step_applies(m, ids[:, t : t + 1], state)
        steps.append(flat_step(m, ids[:, t : t + 1], state))
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_sliding_layers_attend_within_their_window():
    m = _every()
    ids = _ids(1, 8)
    with torch.no_grad():
        out = m(ids, return_attention=True)
    for layer, w in enumerate(out.attentions):
        i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
        far = (i - j >= 3) if m.blocks[layer].attn.window else (j > i)
        assert float(w[0][:, far].abs().max()) == 0.0, layer
        assert float(w[0][:, ~far & (j <= i)].min()) > 0.0


# -- decoding equals the full forward -----------------------------------------------------------


def _cached(model, ids, state, prefix=3):
    steps = [model(ids[:, :prefix], cache=state).logits]
    steps += [model(ids[:, t : t + 1], cache=state).logits for t in range(prefix, ids.shape[1])]
    return torch.cat(steps, 1)


@torch.no_grad()
def test_every_cache_and_left_padding_equal_the_full_forward():
    m = _every()
    ids = _ids()
    full = m(ids).logits
    assert torch.allclose(_cached(m, ids, m.new_state()), full, atol=1e-5)
    assert torch.allclose(_cached(m, ids, m.new_state(max_len=16)), full, atol=1e-5)
    fixed = m.new_state(max_len=16)  # fixed mode, as a compiled step runs it
    steps = [m(ids[:, :3], cache=fixed).logits]
    fixed.fix()
    for t in range(3, ids.shape[1]):
        steps.append(m(ids[:, t : t + 1], cache=fixed).logits)
        fixed.commit(1)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    pad = torch.cat([torch.zeros(2, 4, dtype=torch.long), ids], 1)
    keep = torch.ones_like(pad, dtype=torch.bool)
    keep[0, :4] = False  # row 0 padded, row 1 not
    padded = m(pad, attention_mask=keep).logits
    assert torch.allclose(padded[0, 4:], full[0], atol=1e-5)


@pytest.mark.parametrize(
    "parts",
    [EVERY, dict(arch="qwen2", qkv_bias=True, d_head=6), dict(qkv_bias=True)],
    ids=["every-part", "biases-and-head-width", "biases-c-step"],
)
def test_generate_gives_the_forwards_greedy_tokens(parts):
    torch.manual_seed(0)
    m = _random(Llama(LlamaConfig(**{**BASE, **parts})))
    prompt = _ids(1, 5)[0].tolist()
    got = decode(m, [prompt], SamplingConfig(temperature=0, max_new_tokens=8))[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(8):
            ids.append(int(m(torch.tensor([ids])).logits[0, -1].argmax()))
    assert list(got) == ids[5:]


def test_a_batch_of_prompts_of_different_lengths_decodes_as_each_alone():
    m = _every()
    prompts = [_ids(1, 7, seed=2)[0].tolist(), _ids(1, 3, seed=3)[0].tolist()]
    sampling = SamplingConfig(temperature=0, max_new_tokens=6)
    together = decode(m, prompts, sampling)
    assert [list(r) for r in together] == [list(decode(m, [p], sampling)[0]) for p in prompts]


@pytest.mark.slow
def test_the_compiled_step_gives_the_same_tokens():
    from attnlm.generate.options import DecodeOptions

    m = _every()
    prompt = _ids(1, 5)[0].tolist()
    sampling = SamplingConfig(temperature=0, max_new_tokens=8)
    want = decode(m, [prompt], sampling)[0]
    assert decode(m, [prompt], sampling, DecodeOptions(compile=True))[0] == want


def test_training_reaches_every_parameter():
    m = _every(dropout=0.1).train()
    ids = _ids()
    m(ids, targets=ids).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


# -- defaults, validation, refusals ---------------------------------------------------------------


def test_defaults_build_todays_llama():
    m = Llama(LlamaConfig(**BASE))
    assert all(type(b) is TransformerBlock and type(b.mlp) is SwiGLU for b in m.blocks)
    attn = m.blocks[0].attn
    assert type(attn.score) is ScaledDotScore and attn.q_norm is None and attn.window is None
    assert attn.qkv_proj.bias is None and attn.d_head * attn.n_head == 16
    assert m.rotary_local is None and m.embed_scale is None and m.final_softcap is None
    keys = {k.split(".", 2)[-1] for k in m.state_dict() if k.startswith("blocks.0.")}
    assert keys == {"ln_1.weight", "attn.qkv_proj.weight", "attn.out_proj.weight",
                    "ln_2.weight", "mlp.fc.weight", "mlp.proj.weight"}  # fmt: skip


@pytest.mark.parametrize(
    ("over", "field"),
    [(dict(arch="gpt9"), "model.arch"), (dict(mlp_act="relu"), "model.mlp_act"),
     (dict(attn_softcap=0.0), "model.attn_softcap"), (dict(final_softcap=-1.0), "model.final"),
     (dict(layer_types=(FULL,)), "model.layer_types"), (dict(d_head=0), "model.d_head"),
     (dict(layer_types=(SLIDE,) * 4), "model.sliding_window"),
     (dict(layer_types=("local",) * 4, sliding_window=2), "model.layer_types"),
     (dict(rope_scaling={"rope_type": "linear", "factor": 0}), "model.rope_scaling.factor"),
     (dict(embed_scale=math.nan), "model.embed_scale"),
     (dict(nope_layers=(4,)), "model.nope_layers"), (dict(nope_layers=(1, 1)), "model.nope"),
     (dict(nope_layers="3"), "model.nope_layers"), (dict(nope_layers=(True,)), "model.nope"),
     (dict(residual_scale=0.0), "model.residual_scale"), (dict(logit_scale=-1.0), "model.logit")],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_field(over, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as e:
        LlamaConfig(**{**BASE, **over})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("over", "phrase"),
    [(dict(sliding_window=4), "sliding-window"), (dict(qk_norm=True), "q/k norms"),
     (dict(post_norms=True), "post-norms"), (dict(mlp_act="gelu_tanh"), "GELU-gated"),
     (dict(attn_softcap=3.0), "soft-capping"), (dict(final_softcap=3.0), "soft-capping"),
     (dict(embed_scale=2.0), "embedding scale"), (dict(d_head=6), "head width"),
     (dict(residual_scale=0.5), "residual scale"), (dict(logit_scale=2.0), "logit scale")],
)  # fmt: skip
def test_the_c_step_refuses_the_parts_the_flat_step_computes_them(over, phrase):
    from attnlm.runtime.cstep import why_not_supported
    from attnlm.runtime.eager import flat_model

    m = Llama(LlamaConfig(**{**BASE, **over}))
    assert phrase in why_not_supported(m)
    assert flat_model(m)


@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_the_flat_step_equals_the_forward_with_every_part(static):
    from attnlm.runtime.eager import flat_step, flat_step_applies

    m = _every()
    ids = _ids(2, 12)
    full = m(ids).logits
    state = m.new_state(max_len=16) if static else m.new_state()
    steps = [m(ids[:, :2], cache=state).logits]
    for t in range(2, 12):  # well past the window of 3
        assert flat_step_applies(m, ids[:, t : t + 1], state)
        steps.append(flat_step(m, ids[:, t : t + 1], state))
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_lora_targets_follow_the_head_width():
    from attnlm.lora.layers import apply_lora

    m = Llama(LlamaConfig(**BASE, d_head=6, mlp_act="gelu_tanh"))  # q rows 24, k/v rows 12
    apply_lora(m, 2, targets="k,gate")
    layer = m.blocks[0].attn.qkv_proj
    with torch.no_grad():
        for b in layer.lora_B.values():
            b.normal_()
        x = torch.randn(3, 16)
        moved = (layer(x) - F.linear(x, layer.weight, layer.bias)).abs().sum(0) > 0
    assert moved.nonzero().flatten().tolist() == list(range(24, 36))  # k's rows only


@pytest.mark.parametrize("over", [EVERY, dict(d_head=6), dict(qkv_bias=True, post_norms=True)])
def test_params_formula_counts_the_parts(over):
    from attnlm.inspect.params import kv_cache_bytes_per_token, llama_count
    from attnlm.models.base import count_params

    m = Llama(LlamaConfig(**{**BASE, **over}))
    assert llama_count(m.config) == count_params(m)
    assert kv_cache_bytes_per_token(m.config) == 2 * 4 * 2 * m.config.head_dim * 4


def test_attention_panels_label_local_and_global_layers():
    from attnlm.cli.inspect import layer_labels, select_panels

    m = _every()
    assert layer_labels(m) == ["local", "local", "global", "local"]
    assert layer_labels(Llama(LlamaConfig(**BASE))) is None
    with torch.no_grad():
        maps = [w[0] for w in m(_ids(1, 5), return_attention=True).attentions]
    panels = select_panels(maps, None, 1, layer_labels(m))
    assert [row[0][0] for row in panels][1:3] == [
        "layer 1 (local) head 1",
        "layer 2 (global) head 1",
    ]


def test_the_lens_last_layer_is_the_models_prediction_with_the_final_cap():
    from attnlm.inspect.lens import logit_lens_ids

    m = _every(final_softcap=0.5)  # a cap that moves the probabilities
    ids = _ids(1, 6)[0].tolist()
    probs, top = logit_lens_ids(m, ids, k=3)
    with torch.no_grad():
        want = torch.softmax(m(torch.tensor([ids])).logits[0], -1).topk(3)
    assert torch.equal(top[-1], want.indices)
    assert torch.allclose(probs[-1], want.values, atol=1e-6)
