"""GPT model: config validation, forward outputs and loss, causality end to end, the KV cache
against full recompute (every positional scheme), sliding windows for relative schemes,
left padding against one-at-a-time, initialisation and parameter counts."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from attnlm.base.config import from_dict, load_preset
from attnlm.base.errors import ConfigError, InputError
from attnlm.models.gpt import GPT, GPTConfig, GPTOutput

SCHEMES = ["learned", "sinusoidal", "rope", "alibi", "none"]


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32)
    return GPTConfig(**{**base, **kw})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(n_embd=30, n_head=4), "model.n_embd"),
        (dict(positions="xpos"), "model.positions"),
        (dict(norm="sandwich"), "model.norm"),
        (dict(activation="swish"), "model.activation"),
        (dict(attention_score="cosine"), "model.attention_score"),
        (dict(n_layer=0), "model.n_layer"),
        (dict(dropout=1.0), "model.dropout"),
        (dict(positions="rope", n_embd=12, n_head=4), "model.positions"),
    ],
)
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        tiny(**kw)


def test_config_from_dict_and_preset():
    table = dict(load_preset("gpt2-small")["model"])
    assert table.pop("type") == "gpt"
    cfg = from_dict(GPTConfig, table, where="model")
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size) == (12, 12, 768, 50257)
    with pytest.raises(ConfigError, match="model.n_heads"):
        from_dict(GPTConfig, {"n_heads": 4}, where="model")
    with pytest.raises(ConfigError, match="model.n_embd"):
        GPT.from_config_dict(dict(vocab_size=5, block_size=4, n_layer=1, n_head=3, n_embd=8))
    with pytest.raises(ConfigError, match="model.dropout"):
        from_dict(GPTConfig, {**tiny().__dict__, "dropout": "high"}, where="model")
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny().n_layer = 3


def test_bad_inputs_are_input_errors():
    model = GPT(tiny()).eval()
    with pytest.raises(InputError, match="vocab_size"):
        model(torch.tensor([[1, 2, 37]]))
    with pytest.raises(InputError, match="vocab_size"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(InputError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(InputError, match=r"\(B, T\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(InputError, match="targets"):
        model(torch.zeros(1, 4, dtype=torch.long), targets=torch.zeros(1, 3, dtype=torch.long))
    # relative and fixed schemes have no length limit
    out = GPT(tiny(positions="rope")).eval()(torch.zeros(1, 20, dtype=torch.long))
    assert out.logits.shape == (1, 20, 37)


# -- forward ------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", SCHEMES)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_forward_outputs(positions, norm):
    model = GPT(tiny(positions=positions, norm=norm)).eval()
    ids = torch.randint(0, 37, (3, 10))
    out = model(ids, return_attention=True, return_hidden=True)
    assert isinstance(out, GPTOutput) and out.loss is None
    assert out.logits.shape == (3, 10, 37)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (3, 4, 10, 10)
    for w in out.attentions:
        assert torch.allclose(w.sum(-1), torch.ones(3, 4, 10), atol=1e-5)
        assert torch.triu(w, 1).eq(0).all()
    assert len(out.hidden_states) == 3 and out.hidden_states[0].shape == (3, 10, 32)
    plain = model(ids)
    assert plain.attentions is None and plain.hidden_states is None
    assert (plain.logits - out.logits).abs().max() < 1e-5  # fast path == explicit path


def test_loss_is_mean_cross_entropy_ignoring_minus_100():
    model = GPT(tiny()).eval()
    ids = torch.randint(0, 37, (2, 8))
    targets = torch.randint(0, 37, (2, 8))
    out = model(ids, targets=targets)
    flat = out.logits.reshape(-1, 37)
    manual = -flat.log_softmax(-1)[torch.arange(16), targets.reshape(-1)].mean()
    assert torch.isclose(out.loss, manual, atol=1e-6)
    targets[0, :5] = -100
    keep = targets.reshape(-1) != -100
    manual = -flat.log_softmax(-1)[keep][torch.arange(int(keep.sum())), targets.reshape(-1)[keep]]
    assert torch.isclose(model(ids, targets=targets).loss, manual.mean(), atol=1e-6)
    # at initialisation the model is close to uniform
    assert abs(out.loss.item() - math.log(37)) < 0.3


def test_training_step_reduces_loss():
    model = GPT(tiny(dropout=0.1))
    ids = torch.randint(0, 37, (4, 12))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = model(ids[:, :-1], targets=ids[:, 1:]).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 1.0


@pytest.mark.parametrize("positions", SCHEMES)
def test_gpt_is_causal(positions):
    """d logits[t] / d embedding of the token at position > t is exactly zero."""
    model = GPT(tiny(positions=positions, tie_embeddings=False)).eval()
    ids = torch.randperm(37)[:10][None]  # distinct tokens: one embedding row per position
    for t in (0, 4, 8):
        model.zero_grad()
        model(ids).logits[0, t].sum().backward()
        g = model.tok_emb.weight.grad[ids[0]]  # (T, C), row i = position i
        assert g[t + 1 :].eq(0).all()
        assert g[: t + 1].abs().sum(-1).gt(0).all()


# -- KV cache -----------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", SCHEMES)
def test_kv_cache_equals_full_recompute(positions):
    model = GPT(tiny(positions=positions)).eval()
    ids = torch.randint(0, 37, (2, 12))
    full = model(ids).logits
    cache = model.new_state()
    chunks = [model(ids[:, :5], cache=cache).logits]  # prefill
    assert cache.length == 5 and cache.position == 5
    chunks.append(model(ids[:, 5:8], cache=cache).logits)  # a chunk on top of a cache
    for t in range(8, 12):  # one token at a time
        chunks.append(model(ids[:, t : t + 1], cache=cache).logits)
    assert (torch.cat(chunks, 1) - full).abs().max() < 1e-5
    assert cache.length == 12


def _greedy(model, prompt, steps, use_cache):
    ids, cache = prompt, model.new_state() if use_cache else None
    logits = model(ids, cache=cache).logits[:, -1]
    for _ in range(steps):
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        logits = model(nxt if use_cache else ids, cache=cache).logits[:, -1]
    return ids, logits


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_greedy_with_cache_identical(positions):
    model = GPT(tiny(positions=positions, block_size=32)).eval()
    prompt = torch.randint(0, 37, (2, 4))
    a, la = _greedy(model, prompt, 12, use_cache=True)
    b, lb = _greedy(model, prompt, 12, use_cache=False)
    assert torch.equal(a, b) and (la - lb).abs().max() < 1e-5


@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_trimmed_cache_equals_window_recompute_for_one_layer(positions):
    """Relative schemes, one layer: sliding the cache past block_size equals recomputing the
    last window. With more layers it does not (the cached keys of layer 2 were computed from
    tokens that have left the window), which the second half shows."""
    block = 8
    for n_layer in (1, 2):
        model = GPT(tiny(positions=positions, block_size=block, n_layer=n_layer)).eval()
        ids = torch.randint(0, 37, (2, 20))
        cache = model.new_state()
        model(ids[:, :block], cache=cache)
        diffs = []
        for t in range(block, 20):
            cache.trim(block - 1)
            step = model(ids[:, t : t + 1], cache=cache).logits[:, -1]
            window = model(ids[:, t + 1 - block : t + 1]).logits[:, -1]
            diffs.append((step - window).abs().max().item())
            assert cache.length == block and cache.position == t + 1
        if n_layer == 1:
            assert max(diffs) < 1e-5
        else:
            assert max(diffs) > 1e-4  # a sliding window, not a cropped recompute


@pytest.mark.parametrize("positions", SCHEMES)
def test_left_padding_equals_one_at_a_time(positions):
    model = GPT(tiny(positions=positions)).eval()
    long, short = torch.randint(0, 37, (1, 7)), torch.randint(0, 37, (1, 4))
    pad = 3
    batch = torch.cat([long, torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1)])
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :pad] = False
    out = model(batch, attention_mask=mask).logits
    assert torch.isfinite(out).all()
    assert (out[0] - model(long).logits[0]).abs().max() < 1e-5
    assert (out[1, pad:] - model(short).logits[0]).abs().max() < 1e-5
    # and incremental decoding of the padded batch
    cache = model.new_state()
    model(batch, cache=cache, attention_mask=mask)
    nxt = torch.tensor([[5], [6]])
    mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], 1)
    step = model(nxt, cache=cache, attention_mask=mask).logits[:, -1]
    assert (step[0] - model(torch.cat([long, nxt[:1]], 1)).logits[0, -1]).abs().max() < 1e-5
    assert (step[1] - model(torch.cat([short, nxt[1:]], 1)).logits[0, -1]).abs().max() < 1e-5
    with pytest.raises(InputError, match="attention_mask"):
        model(nxt, cache=cache, attention_mask=mask)  # mask no longer covers cache + new


def test_cache_and_learned_positions_limit():
    model = GPT(tiny(block_size=6)).eval()
    cache = model.new_state()
    model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(InputError, match="block_size"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


# -- initialisation and parameters --------------------------------------------------------------


def test_gpt2_initialisation():
    cfg = tiny(n_layer=4, n_embd=128, vocab_size=500, block_size=64)
    model = GPT(cfg)
    assert model.lm_head.weight is model.tok_emb.weight
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 0.002
    assert abs(model.blocks[0].attn.qkv_proj.weight.std().item() - 0.02) < 0.002
    assert model.blocks[0].attn.qkv_proj.bias.eq(0).all()
    proj_std = 0.02 / math.sqrt(2 * 4)
    assert abs(model.blocks[1].mlp.proj.weight.std().item() - proj_std) < 0.001
    assert abs(model.blocks[1].attn.out_proj.weight.std().item() - proj_std) < 0.001
    assert model.blocks[0].ln_1.weight.eq(1).all()


def test_gpt2_small_parameter_count():
    cfg = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    with torch.device("meta"):
        model = GPT(cfg)
        untied = GPT(GPTConfig(**{**cfg.__dict__, "tie_embeddings": False}))
    assert model.num_params() == 124_439_808
    assert untied.num_params() == 124_439_808 + 50257 * 768
    assert model.num_params(non_embedding=True) == 124_439_808 - 50257 * 768 - 1024 * 768
    assert untied.num_params(non_embedding=True) == model.num_params(non_embedding=True)


def test_no_bias_and_post_norm_shapes():
    model = GPT(tiny(bias=False, norm="post"))
    assert all(not n.endswith("bias") for n, _ in model.named_parameters())
    assert isinstance(model.ln_f, torch.nn.Identity)
    assert model(torch.zeros(1, 3, dtype=torch.long)).logits.shape == (1, 3, 37)


def test_dropout_train_vs_eval():
    model = GPT(tiny(dropout=0.2))
    ids = torch.randint(0, 37, (2, 8))
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)
    assert F.softmax(model(ids).logits, -1).sum(-1).allclose(torch.ones(2, 8))


@pytest.mark.parametrize("positions", SCHEMES)
def test_low_precision_forward_stays_in_dtype(positions):
    """bfloat16 weights: positions, rotary tables and masks follow the model's dtype."""
    model = GPT(tiny(positions=positions)).eval()
    ids = torch.randint(0, 37, (2, 9))
    ref = model(ids).logits
    half = model.to(torch.bfloat16)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :2] = False
    for kwargs in ({}, {"attention_mask": keep}, {"return_attention": True}):
        logits = half(ids, **kwargs).logits
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert (half(ids).logits.float() - ref).abs().max() < 0.1


@pytest.mark.parametrize("positions", SCHEMES)
def test_decoding_slides_past_the_window_unless_positions_are_a_learned_table(positions):
    """What the decoding plan reads from the family record: a learned table ends at
    block_size (the loop recomputes a cropped context), every other scheme extends (the cache
    slides)."""
    from attnlm.models.llama import LlamaConfig
    from attnlm.models.registry import get

    assert get("gpt").decoding.slides(tiny(positions=positions)) == (positions != "learned")
    llama = LlamaConfig(vocab_size=37, block_size=16, n_layer=1, n_head=2, n_embd=16)
    assert get("llama").decoding.slides(llama)  # rotary positions
