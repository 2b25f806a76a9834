"""Positional schemes: sinusoidal values by hand, learned range errors, RoPE's relative
property, ALiBi slopes and biases."""

from __future__ import annotations

import math

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.nn.attention import apply_rotary
from attnlm.nn.positional import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    sinusoidal_encoding,
)


def test_sinusoidal_by_hand():
    pe = SinusoidalPositionalEncoding(4)(torch.arange(3))
    assert pe.shape == (3, 4)
    for pos in range(3):
        # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), d = 4
        expected = [math.sin(pos), math.cos(pos), math.sin(pos / 100), math.cos(pos / 100)]
        assert torch.allclose(pe[pos], torch.tensor(expected), atol=1e-6)
    odd = sinusoidal_encoding(torch.arange(5), 5)
    assert odd.shape == (5, 5) and torch.allclose(
        odd[:, 4], torch.sin(torch.arange(5) / 10000**0.8)
    )
    batched = sinusoidal_encoding(torch.tensor([[0, 1], [5, 6]]), 8)
    assert torch.equal(batched[1, 0], sinusoidal_encoding(torch.tensor([5]), 8)[0])


def test_sinusoidal_relative_position_is_linear():
    """PE(pos + k) is a fixed rotation of PE(pos) per frequency (Vaswani et al., 3.5)."""
    d, k = 8, 3
    pe = sinusoidal_encoding(torch.arange(20), d)
    for i in range(d // 2):
        w = 1 / 10000 ** (2 * i / d)
        c, s = math.cos(k * w), math.sin(k * w)
        rot = torch.tensor([[c, -s], [s, c]])  # [sin, cos](pos) @ rot = [sin, cos](pos + k)
        pair = pe[:, 2 * i : 2 * i + 2]  # (sin, cos)
        assert torch.allclose(pair[:-k] @ rot, pair[k:], atol=1e-5)


def test_learned_positions_range():
    emb = LearnedPositionalEmbedding(8, 4)
    assert emb(torch.arange(8)).shape == (8, 4)
    with pytest.raises(InputError, match="block_size"):
        emb(torch.arange(9))


def test_rope_depends_only_on_offset():
    torch.manual_seed(0)
    D = 16
    rope = RotaryEmbedding(D)
    q, k = torch.randn(D), torch.randn(D)

    def score(m, n):
        cos, sin = rope(torch.tensor([m, n]))
        rq = apply_rotary(q.view(1, 1, 1, D), cos[0], sin[0])
        rk = apply_rotary(k.view(1, 1, 1, D), cos[1], sin[1])
        return (rq * rk).sum().item()

    for m, n in [(0, 0), (5, 2), (2, 5), (40, 33)]:
        for shift in (1, 7, 100):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)  # different offsets differ
    # rotation keeps lengths
    cos, sin = rope(torch.arange(10))
    x = torch.randn(1, 2, 10, D)
    assert torch.allclose(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    # position 0 is the identity; batched positions broadcast over heads
    assert torch.allclose(apply_rotary(x, cos, sin)[:, :, 0], x[:, :, 0])
    cb, sb = rope(torch.arange(10).expand(3, 10))
    assert cb.shape == (3, 1, 10, D)


def test_rope_matches_pairwise_rotation():
    """The rotate-half layout rotates feature pair (i, i + D/2) by pos * base^(-2i/D)."""
    D, pos = 8, 3
    cos, sin = RotaryEmbedding(D)(torch.tensor([pos]))
    x = torch.randn(1, 1, 1, D)
    y = apply_rotary(x, cos, sin)[0, 0, 0]
    for i in range(D // 2):
        a = pos * 10000 ** (-2 * i / D)
        x1, x2 = x[0, 0, 0, i], x[0, 0, 0, i + D // 2]
        assert y[i] == pytest.approx(float(x1 * math.cos(a) - x2 * math.sin(a)), abs=1e-5)
        assert y[i + D // 2] == pytest.approx(float(x1 * math.sin(a) + x2 * math.cos(a)), abs=1e-5)


def test_alibi_slopes():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (h + 1)) for h in range(4)]))
    # 6 heads: the 4 slopes of 4 heads, then slopes 1 and 3 of 8 heads (2^-1, 2^-3)
    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    assert torch.allclose(alibi_slopes(6), torch.tensor(expected))


def test_alibi_bias():
    bias = ALiBi(2)(3, 3)  # slopes 1/16, 1/256
    assert bias.shape == (2, 3, 3)
    assert bias[0, 2, 0] == pytest.approx(-2 / 16) and bias[0, 2, 2] == 0
    assert bias[1, 1, 0] == pytest.approx(-1 / 256)
    # the last 2 of 5 positions: query 0 sits at position 3
    tail = ALiBi(2)(2, 5)
    assert torch.allclose(tail, ALiBi(2)(5, 5)[:, 3:])
    sym = ALiBi(2, symmetric=True)(3, 3)
    assert sym[0, 0, 2] == sym[0, 2, 0] == pytest.approx(-2 / 16)
