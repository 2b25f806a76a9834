"""Transformer blocks: activations, the feed-forward network, blocks composed from their parts
in the pre-/post-norm arrangements written out by hand, dropout, and the cross-attention
sublayer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlm.base.errors import ConfigError
from attnlm.nn.attention import MultiHeadAttention, causal_mask, padding_mask
from attnlm.nn.blocks import (
    ACTIVATIONS,
    FeedForward,
    PostNormBlock,
    TransformerBlock,
    block_class,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_activations_by_formula():
    x = torch.linspace(-4, 4, 101)
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    tanh = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert torch.allclose(ACTIVATIONS["gelu"](x), exact, atol=1e-6)
    assert torch.allclose(ACTIVATIONS["gelu_tanh"](x), tanh, atol=1e-6)
    assert torch.equal(ACTIVATIONS["relu"](x), x.clamp(min=0))
    assert (ACTIVATIONS["gelu"](x) - ACTIVATIONS["gelu_tanh"](x)).abs().max() > 1e-5


def test_feed_forward_by_hand():
    ff = FeedForward(8, activation="relu")
    assert ff.fc.weight.shape == (32, 8) and ff.proj.weight.shape == (8, 32)
    x = torch.randn(2, 3, 8)
    expected = (x @ ff.fc.weight.T + ff.fc.bias).clamp(min=0) @ ff.proj.weight.T + ff.proj.bias
    assert torch.allclose(ff(x), expected, atol=1e-6)
    # position-wise: each position alone gives the same result
    assert torch.allclose(ff(x[:, 1:2]), ff(x)[:, 1:2], atol=1e-6)
    with pytest.raises(ConfigError, match="activation"):
        FeedForward(8, activation="swish")


def make_block(norm="pre", d=16, heads=4, dropout=0.0, cross=False):
    """A block composed as the family files compose theirs."""
    kind = TransformerBlock if norm == "pre" else PostNormBlock
    extra = {}
    if cross:
        extra = dict(
            cross_attn=MultiHeadAttention(d, heads, cross=True), cross_norm=nn.LayerNorm(d)
        )
    return kind(
        MultiHeadAttention(d, heads, dropout=dropout),
        FeedForward(d, activation="gelu", dropout=dropout),
        sa_norm=nn.LayerNorm(d),
        mlp_norm=nn.LayerNorm(d),
        dropout=dropout,
        **extra,
    )


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_arrangement_by_hand(norm):
    block = make_block(norm).eval()
    x = torch.randn(2, 5, 16)
    y, _, _ = block(x, is_causal=True)

    def attn(h):
        return block.attn(h, is_causal=True, need_weights=True)[0]

    if norm == "pre":  # x + f(LN(x))
        h = x + attn(block.ln_1(x))
        expected = h + block.mlp(block.ln_2(h))
    else:  # LN(x + f(x))
        h = block.ln_1(x + attn(x))
        expected = block.ln_2(h + block.mlp(h))
    assert (y - expected).abs().max() < 1e-5
    if norm == "post":  # every output position is normalised
        assert torch.allclose(y.mean(-1), torch.zeros(2, 5), atol=1e-5)


def test_block_keeps_the_checkpoint_names():
    """The parts sit under the names checkpoints (and the Hugging Face tables) use."""
    names = {k.split(".")[0] for k in make_block(cross=True).state_dict()}
    assert names == {"ln_1", "attn", "ln_cross", "cross_attn", "ln_2", "mlp"}
    assert [k.split(".")[0] for k, _ in make_block().named_parameters()][::2] == [
        "ln_1",
        "attn",
        "attn",
        "ln_2",
        "mlp",
        "mlp",
    ]


def test_unknown_norm_and_half_a_cross_sublayer():
    with pytest.raises(ConfigError, match="norm"):
        block_class("sandwich")
    assert block_class("pre") is TransformerBlock and block_class("post") is PostNormBlock
    with pytest.raises(ConfigError, match="cross"):
        TransformerBlock(
            MultiHeadAttention(8, 2), FeedForward(8), sa_norm=nn.LayerNorm(8),
            mlp_norm=nn.LayerNorm(8), cross_attn=MultiHeadAttention(8, 2, cross=True),
        )  # fmt: skip


def test_dropout_only_in_training():
    block = make_block(heads=2, dropout=0.5)
    x = torch.randn(2, 6, 16)
    block.train()
    a, b = block(x, is_causal=True)[0], block(x, is_causal=True)[0]
    assert not torch.allclose(a, b)
    block.eval()
    assert torch.equal(block(x, is_causal=True)[0], block(x, is_causal=True)[0])


def test_attention_weights_returned_with_mask():
    block = make_block(heads=2).eval()
    x = torch.randn(2, 4, 16)
    keep = torch.tensor([[True] * 4, [False, True, True, True]])
    _, w, _ = block(x, mask=padding_mask(keep), is_causal=True, need_weights=True)
    assert w.shape == (2, 2, 4, 4)
    assert w[1, :, 1:, 0].eq(0).all()  # padding key gets no weight
    assert torch.isinf(causal_mask(4)).eq(w[0, 0] == 0).all()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_cross_attention_block(norm):
    block = make_block(norm, heads=2, cross=True).eval()
    x, ctx = torch.randn(2, 4, 16), torch.randn(2, 9, 16)
    y, _, _ = block(x, is_causal=True, context=ctx)
    assert y.shape == (2, 4, 16)
    if norm == "pre":
        h = x + block.attn(block.ln_1(x), is_causal=True)[0]
        h = h + block.cross_attn(block.ln_cross(h), ctx)[0]
        expected = h + block.mlp(block.ln_2(h))
    else:
        h = block.ln_1(x + block.attn(x, is_causal=True)[0])
        h = block.ln_cross(h + block.cross_attn(h, ctx)[0])
        expected = block.ln_2(h + block.mlp(h))
    assert (y - expected).abs().max() < 1e-5
    # the output depends on the context
    y2, _, _ = block(x, is_causal=True, context=ctx.flip(1) + 1)
    assert not torch.allclose(y, y2)


def test_gelu_tanh_is_torch_approximation():
    x = torch.randn(100)
    assert torch.equal(ACTIVATIONS["gelu_tanh"](x), F.gelu(x, approximate="tanh"))
