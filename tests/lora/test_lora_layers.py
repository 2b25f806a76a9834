"""LoRA adapters (:mod:`attnlm.lora.layers`) against the formula written out by hand: a zero ``B``
leaves the base model's logits untouched, merging gives the unmerged numbers, training moves the
adapters only, and the target names land on the rows they name in each family."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.lora.layers import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    available_targets,
    load_lora_state_dict,
    lora_state_dict,
    merge_lora,
    parse_targets,
)
from attnlm.models import registry

V = 40
TABLES = {
    "llama": dict(type="llama", vocab_size=V, block_size=48, n_layer=2, n_head=4, n_kv_head=2,
                  n_embd=32, d_ff=48),
    "gpt": dict(type="gpt", vocab_size=V, block_size=48, n_layer=2, n_head=4, n_embd=32),
    "bert": dict(type="bert", vocab_size=V, block_size=48, n_layer=2, n_head=4, n_embd=32),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def build(family):
    model, _, _ = registry.build(dict(TABLES[family]))
    return model.eval()


def randomize_b(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.2)


def logits(model, ids):
    return model(ids).logits


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_zero_b_gives_the_base_logits(family):
    model = build(family)
    ids = torch.randint(0, V, (2, 40))  # enough rows for the fused CPU kernel
    with torch.no_grad():
        base = logits(model, ids)
        apply_lora(model, 4, targets="all")
        assert torch.equal(logits(model, ids), base)


@pytest.mark.parametrize("family", ["llama", "gpt", "bert"])
def test_merged_equals_unmerged(family):
    model = build(family)
    apply_lora(model, 4, alpha=12, targets="all")
    randomize_b(model)
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        unmerged = logits(model, ids)
        merge_lora(model)
        merged = logits(model, ids)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert (merged - unmerged).abs().max() < 1e-5
    assert all(p.requires_grad for p in model.parameters())


def test_layer_is_the_formula():
    """``x Wᵀ + b + (α/r) x Aᵀ Bᵀ`` on each slice's rows, by hand."""
    base = nn.Linear(6, 10)
    layer = LoRALinear(base, {"a": (0, 4), "b": (7, 10)}, r=2, alpha=3.0)
    randomize_b(nn.ModuleDict({"x": layer}))
    x = torch.randn(5, 6)
    want = x @ base.weight.T + base.bias
    for name, (start, stop) in layer.slices.items():
        a, b = layer.lora_A[name], layer.lora_B[name]
        want[:, start:stop] += 1.5 * (x @ a.T @ b.T)
    assert torch.allclose(layer(x), want, atol=1e-6)
    assert torch.allclose(layer.merged()(x), want, atol=1e-6)


def test_only_adapters_train():
    model = build("llama")
    model.train()
    apply_lora(model, 4, targets="q,v,down")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.randint(0, V, (4, 33))
    for _ in range(3):
        model(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    for key, value in before.items():
        if ".lora_" in key and ".lora_A." not in key:  # B moved (A may too)
            assert not torch.equal(after[key], value), key
        elif ".lora_" not in key:
            assert torch.equal(after[key], value), key  # bit-identical base
    assert all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)


def test_targets_map_to_rows_per_family():
    llama = build("llama")  # C = 32, Hkv = 2 of 4 heads: C_kv = 16; F = 48
    assert available_targets(llama) == ("q", "k", "v", "qkv", "o", "gate", "up", "down")
    apply_lora(llama, 2, targets="q,v,gate,down")
    attn, mlp = llama.blocks[0].attn, llama.blocks[0].mlp
    assert attn.qkv_proj.slices == {"q": (0, 32), "v": (48, 64)}
    assert not isinstance(attn.out_proj, LoRALinear)
    assert mlp.fc.slices == {"gate": (0, 48)} and mlp.proj.slices == {"down": (0, 32)}

    gpt = build("gpt")  # no gate: "all" takes what there is
    assert "gate" not in available_targets(gpt)
    apply_lora(gpt, 2, targets="all")
    block = gpt.blocks[1]
    assert block.attn.qkv_proj.slices == {"q": (0, 32), "k": (32, 64), "v": (64, 96)}
    assert block.mlp.fc.slices == {"up": (0, 128)} and block.attn.out_proj.slices == {"o": (0, 32)}
    assert not isinstance(gpt.lm_head, LoRALinear)

    gpt2 = build("gpt")
    apply_lora(gpt2, 2, targets="qkv")
    assert gpt2.blocks[0].attn.qkv_proj.slices == {"qkv": (0, 96)}
    with pytest.raises(ConfigError, match="gate matches no layer"):
        apply_lora(build("gpt"), 2, targets="gate")


def test_cross_attention_targets():
    model, _, _ = registry.build(dict(type="transformer", src_vocab_size=30, vocab_size=30,
                                      d_model=32, n_head=4, n_encoder_layers=1,
                                      n_decoder_layers=1, d_ff=40))  # fmt: skip
    apply_lora(model, 2, targets="q,v")
    cross = [m for m in model.modules() if getattr(m, "cross", False)]
    assert cross and cross[0].q_proj.slices == {"q": (0, 32)}
    assert cross[0].kv_proj.slices == {"v": (32, 64)}


def test_state_dict_round_trip_and_refusals():
    model = build("llama")
    apply_lora(model, 4, targets="q,v")
    randomize_b(model)
    state = lora_state_dict(model)
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    other = build("llama")
    apply_lora(other, 4, targets="q,v")
    load_lora_state_dict(other, state)
    for key, value in lora_state_dict(other).items():
        assert torch.equal(value, state[key])
    wrong = build("llama")
    apply_lora(wrong, 4, targets="q,k")
    with pytest.raises(InputError, match="do not fit"):
        load_lora_state_dict(wrong, state)
    with pytest.raises(ConfigError, match="already has"):
        apply_lora(model, 4)


@pytest.mark.parametrize("fmt", ["q8", "q4", "bf16"])
def test_a_model_with_decode_time_weights_is_refused_in_one_line(fmt):
    """``--weights q4/q8``: the linear layers are QuantLinear (no float ``weight``), so
    adapters have nothing to add to: one line saying so, not an AttributeError."""
    from attnlm.quant.layers import quantize_weights

    model = quantize_weights(build("llama"), fmt)
    with pytest.raises(InputError, match=f"need float32 weights and this model's are {fmt}") as e:
        apply_lora(model, 4)
    assert "\n" not in str(e.value)


def test_a_rank_above_the_layers_it_adapts_is_refused():
    """r = min(d_in, rows) is the highest rank ``B A`` can have; above it the adapters only
    cost memory (``--lora 99999999`` tried to allocate 25 GB). Width 32 with 2 of 4 heads for
    keys and values: q and o have 32 rows, v has 16."""
    ok = build("llama")
    apply_lora(ok, 32, targets="q,o")
    assert {tuple(v.shape) for k, v in lora_state_dict(ok).items() if ".lora_A." in k} == {(32, 32)}
    for targets, limit in (("q,o", 32), ("q,v", 16)):
        model = build("llama")
        keys = set(model.state_dict())
        with pytest.raises(ConfigError, match=f"--lora {limit + 1}: the rank can be at most "
                           f"{limit} ") as e:  # fmt: skip
            apply_lora(model, limit + 1, targets=targets)
        assert "\n" not in str(e.value)
        assert set(model.state_dict()) == keys  # untouched: no adapter was put on


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(r=0), "--lora must be a positive"),
        (dict(r=2.5), "--lora must be a positive"),
        (dict(r=4, alpha=0), "--lora-alpha"),
        (dict(r=4, alpha=float("nan")), "--lora-alpha"),
        (dict(r=4, dropout=1.0), "--lora-dropout"),
        (dict(r=4, targets=("q", "w")), "unknown target 'w'"),
        (dict(r=4, targets=("qkv", "q")), "qkv already covers"),
    ],
)
def test_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LoRAConfig(**kwargs)


def test_parse_targets():
    assert parse_targets("q, v") == ("q", "v")
    assert parse_targets("all") == ("q", "k", "v", "o", "gate", "up", "down")
    with pytest.raises(ConfigError):
        parse_targets(" , ")


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_chunked_training_loss_equals_the_plain_head(family):
    """An adapted decoder computes its training loss a chunk of rows at a time: the same loss
    and adapter gradients as the full logits."""
    model = build(family)
    apply_lora(model, 4, targets="all")
    randomize_b(model)
    assert model.loss_chunk > 0
    ids = torch.randint(0, V, (3, 41))
    x, y = ids[:, :-1], ids[:, 1:].clone()
    y[0, :5] = -100
    params = [p for p in model.parameters() if p.requires_grad]
    model.loss_chunk = 7  # several chunks, the last one short
    chunked = model(x, targets=y)
    assert chunked.logits is None
    got = torch.autograd.grad(chunked.loss, params)
    model.loss_chunk = 0
    plain = model(x, targets=y)
    want = torch.autograd.grad(plain.loss, params)
    assert torch.allclose(chunked.loss, plain.loss, atol=1e-6)
    assert int(chunked.n_targets) == int(plain.n_targets) == 3 * 40 - 5
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


SPANS = {  # layer shape and adapters: whole rows, one slice, several slices
    "o": (24, 24, ["o"]),
    "q": (24, 40, ["q"]),
    "qkv": (24, 40, ["q", "k", "v"]),
    "gate,up": (24, 64, ["gate", "up"]),
}
ROWS = {"o": (0, 24), "q": (0, 24), "k": (24, 32), "v": (32, 40), "gate": (0, 32), "up": (32, 64)}


def lora_layer(case, bias, dtype=torch.float32):
    from attnlm.nn import fused

    k_in, out, names = SPANS[case]
    base = fused.Linear(k_in, out, bias=bias, dtype=dtype)
    layer = LoRALinear(base, {n: ROWS[n] for n in names}, r=3, alpha=6.0)
    layer.requires_grad_(False)
    with torch.no_grad():
        for p in layer.lora_B.values():
            p.normal_(0, 0.5)
    for n in names:
        layer.lora_A[n].requires_grad_(True), layer.lora_B[n].requires_grad_(True)
    return layer


@pytest.mark.parametrize("case", list(SPANS))
@pytest.mark.parametrize("bias", [True, False])
def test_fused_lora_path_equals_the_plain_path(case, bias, monkeypatch):
    """The one-Function training path (lora_linear) against the plain path (stacked A,
    zero-padded B, addmm; the formula test above checks that one): outputs and the gradients
    of x and of every adapter within 1e-5."""
    layer = lora_layer(case, bias)
    x = torch.randn(2, 20, SPANS[case][0], requires_grad=True)  # 40 rows: the oneDNN sizes too
    cot = torch.randn(2, 20, SPANS[case][1])
    params = list(layer.lora_A.values()) + list(layer.lora_B.values())
    runs = []
    for fast in (True, False):
        if not fast:  # the plain path: what runs with dropout, autocast or a trainable base
            monkeypatch.setattr(layer, "_fast", lambda _x: False)
        else:
            assert layer._fast(x)
        y = layer(x)
        grads = torch.autograd.grad(y, [x, *params], cot)
        runs.append((y.detach(), grads))
    (y1, g1), (y2, g2) = runs
    assert torch.allclose(y1, y2, atol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("case", ["q", "qkv", "gate,up"])
def test_fused_lora_backward_gradcheck(case):
    from torch.autograd import gradcheck

    from attnlm.lora.layers import lora_linear

    layer = lora_layer(case, True, torch.float64)
    names = list(layer.slices)
    x = torch.randn(2, 5, SPANS[case][0], dtype=torch.float64, requires_grad=True)
    a = [layer.lora_A[n].detach().clone().requires_grad_() for n in names]
    b = [layer.lora_B[n].detach().clone().requires_grad_() for n in names]
    spans = [layer.slices[n] for n in names]

    def fn(x, *ab):
        return lora_linear(x, layer.weight, layer.bias, list(ab[: len(a)]), list(ab[len(a) :]),
                           spans, layer.scale)  # fmt: skip

    assert gradcheck(fn, (x, *a, *b))


def test_fused_lora_path_only_where_it_applies():
    layer = lora_layer("qkv", True)
    x = torch.randn(2, 20, 24)
    assert layer._fast(x)
    with torch.no_grad():
        assert not layer._fast(x)
    layer.weight.requires_grad_(True)  # a trainable base: the plain path
    assert not layer._fast(x)
    layer.weight.requires_grad_(False)
    layer.lora_dropout = nn.Dropout(0.1)
    assert not layer._fast(x)
    layer.eval()  # dropout off
    assert layer._fast(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not layer._fast(x)
