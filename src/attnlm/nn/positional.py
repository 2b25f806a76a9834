"""Positional information: sinusoidal, learned absolute, rotary (RoPE), ALiBi, and none.

Self-attention by itself is permutation-equivariant: shuffle the tokens and the outputs are
shuffled the same way. Each scheme breaks that symmetry at a different place:

* **absolute** schemes add a vector per position to the token embeddings:
  :class:`SinusoidalPositionalEncoding` (Vaswani et al., 2017) and
  :class:`LearnedPositionalEmbedding` (GPT-2);
* **rotary** (:class:`RotaryEmbedding`, Su et al., 2021, "RoFormer") rotates queries and keys
  by angles proportional to their positions, so ``q_mᵀ k_n`` depends only on ``m - n``;
* **ALiBi** (:class:`ALiBi`, Press et al., 2022, "Train Short, Test Long") adds a per-head
  linear penalty ``-m_h (i - j)`` to the scores.

Shape legend
    B  batch size
    T  number of positions (query length)
    S  key length
    H  heads
    D  head width (rotary works per head)
    C  model width
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.base.errors import InputError
from attnlm.nn.yarn import longrope_scale, yarn_range, yarn_scale

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


def sinusoidal_encoding(
    positions: Tensor, d_model: int, base: float = 10000.0, layout: str = "interleaved"
) -> Tensor:
    """``PE(pos, 2i) = sin(pos / base^(2i/d))``, ``PE(pos, 2i+1) = cos(pos / base^(2i/d))``.

    ``positions`` is any integer tensor ``(...)``; returns ``(..., d_model)`` float32.
    ``layout="split"`` puts all sines first and all cosines after them (the same features in
    another order: Marian / fairseq / tensor2tensor); ``"interleaved"`` is the paper's order.
    """
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device)
    angles = positions.to(torch.float32)[..., None] / base ** (two_i / d_model)  # (..., d/2)
    if layout == "split":
        half = (d_model + 1) // 2  # sines take the extra feature of an odd width (as Marian)
        return torch.cat(
            [torch.sin(angles[..., :half]), torch.cos(angles[..., : d_model - half])], -1
        )
    pe = torch.zeros(*positions.shape, d_model, device=positions.device)
    pe[..., 0::2] = torch.sin(angles)
    pe[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return pe


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal position vectors added to the embeddings (Vaswani et al., 2017, 3.5).

    No parameters and no length limit; ``forward(positions (...)) -> (..., C)``.
    """

    def __init__(self, d_model: int, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        if layout not in ("interleaved", "split"):
            raise ValueError(f"unknown sinusoid layout {layout!r} (known: interleaved, split)")
        self.d_model, self.base, self.layout = d_model, base, layout

    def forward(self, positions: Tensor) -> Tensor:
        return sinusoidal_encoding(positions, self.d_model, self.base, self.layout)

    def span(self, start: int, length: int, device: torch.device | str) -> Tensor:
        """``forward(arange(start, start + length))`` ``(length, C)`` as a slice of a table
        kept per device and grown by doubling (not recomputed at every call; not saved)."""
        end = start + length
        table = getattr(self, "_table", None)
        if table is None or table.shape[0] < end or table.device != torch.device(device):
            n = max(64, 2 * end)
            table = self.forward(torch.arange(n, device=device))
            self._table = table
        return table[start:end]


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position ``0 .. max_len-1`` (GPT, GPT-2: ``wpe``).

    ``forward(positions (...)) -> (..., C)``; a position ``>= max_len`` is an
    :class:`~attnlm.base.errors.InputError` naming ``model.block_size``.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        # the range check needs the value on the host: skipped inside torch.compile (a graph
        # break every step); out-of-range positions then fail in the indexing itself
        if (
            not torch.compiler.is_compiling()
            and positions.numel()
            and int(positions.max()) >= self.max_len
        ):
            raise InputError(
                f"sequence reaches position {int(positions.max())} but learned positions only "
                f"cover model.block_size={self.max_len}; crop the input to the last "
                f"{self.max_len} tokens"
            )
        return self.weight[positions]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, RoPE (Su et al., 2021).

    Feature pairs of each head are rotated by angle ``pos * θ_i`` with
    ``θ_i = base^(-2i/D)``. Pairs are ``(x_i, x_{i + D/2})`` ("rotate half", as in GPT-NeoX
    and LLaMA), a fixed permutation of the paper's ``(x_{2i}, x_{2i+1})``: the same rotation
    on renamed features. ``forward(positions)`` returns ``(cos, sin)`` for
    :func:`attnlm.nn.attention.apply_rotary`: ``(T, D)`` for positions ``(T,)``, or
    ``(B, 1, T, D)`` for positions ``(B, T)``.

    Meta's original Llama checkpoints rotate interleaved pairs; Hugging Face's
    ``LlamaForCausalLM`` (and so :mod:`attnlm.models.hf.llama`) stores q/k weights with their
    rows permuted to the rotate-half order used here, so no permutation is needed on import.

    ``base`` is ``θ`` of the frequencies (Llama's ``rope_theta``); ``scaling`` optionally
    rescales them for longer contexts: Llama 3.1's (:func:`llama3_frequencies`, the default
    ``rope_type``), ``{"rope_type": "linear", "factor": f}``, positions divided by ``f``
    (every frequency divided by ``f``), YaRN's (:func:`yarn_frequencies`), whose
    ``attention_scaling`` multiplies cos and sin (so each score by its square), or LongRoPE's
    (:func:`longrope_frequencies`: Phi-3's 128k models), which keeps two sets of frequencies
    and takes the long one in a call whose sequence reaches past the original context (the
    largest position of each row, as ``transformers`` decides per call: a cache filled before
    that point keeps its keys' short rotations).
    """

    def __init__(
        self, d_head: int, base: float = 10000.0, scaling: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary embedding needs an even head width, got {d_head}")
        # 1 / base^(2i/D), written as Hugging Face computes it (the same float32 values)
        inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head)
        scaling = dict(scaling or {})
        kind = scaling.pop("rope_type", "llama3")
        self.attention_scaling = 1.0
        self.long_from: int | None = None  # LongRoPE: the original context
        self.reach: int | None = None  # LongRoPE: where the sequence reaches (see reaching)
        if kind == "longrope":
            inv_freq, long_freq, self.attention_scaling = longrope_frequencies(
                d_head, base, **scaling
            )
            self.long_from = int(scaling["original_max_position_embeddings"])
            self.register_buffer("long_inv_freq", long_freq, persistent=False)
        elif kind == "linear":  # positions divided by the factor
            inv_freq = inv_freq / scaling.pop("factor")
        elif kind == "yarn":
            inv_freq, self.attention_scaling = yarn_frequencies(d_head, base, **scaling)
        elif scaling:
            inv_freq = llama3_frequencies(inv_freq, **scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq
        if self.long_from is not None and self.reach is not None:  # (a prompt in pieces)
            inv_freq = self.long_inv_freq if self.reach > self.long_from else inv_freq
        elif self.long_from is not None:  # LongRoPE: the long set in rows past the context
            reach = positions.amax(dim=-1, keepdim=True)[..., None] + 1  # (..., 1, 1)
            inv_freq = torch.where(reach > self.long_from, self.long_inv_freq, inv_freq)
        angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., T, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., T, D)
        if positions.dim() == 2:
            angles = angles[:, None]  # (B, 1, T, D): broadcast over heads
        if self.attention_scaling != 1.0:  # (YaRN)
            return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return angles.cos(), angles.sin()


@contextmanager
def reaching(model: nn.Module, reach: int | None) -> Iterator[None]:
    """Within it, ``model``'s LongRoPE rotaries take the set of a sequence that reaches
    ``reach`` positions, whatever positions a call holds: a prompt fed in pieces rotates as one
    forward over all of it would (None: each call decides)."""
    rotaries = [m for m in model.modules()
                if isinstance(m, RotaryEmbedding) and m.long_from is not None]  # fmt: skip
    for r in rotaries:
        r.reach = reach
    try:
        yield
    finally:
        for r in rotaries:
            r.reach = None


ROPE_SCALING_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


#: YaRN's keys (Peng et al., 2023; Hugging Face's names): ``factor`` and
#: ``original_max_position_embeddings`` needed, the others optional
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "truncate")  # fmt: skip


def yarn_frequencies(
    d_head: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float | None = None,
    beta_slow: float | None = None,
    attention_factor: float | None = None,
    truncate: bool | None = None,
) -> tuple[Tensor, float]:
    """YaRN's frequencies and attention scaling ``(inv_freq (D/2,), scale)``, as Hugging
    Face computes them. With ``N`` the original context, pair ``i`` makes ``N ω_i / 2π``
    turns over it: pairs below the dimension that turns ``beta_fast`` times (default 32) keep
    their frequency (extrapolated), pairs past the one that turns ``beta_slow`` times
    (default 1) are divided by ``factor`` (interpolated), with a linear ramp between
    (its ends rounded down and up, unless ``truncate`` is False: gpt-oss's;
    :func:`~attnlm.nn.yarn.yarn_range`); cos and sin are multiplied by ``attention_factor``
    (default :func:`~attnlm.nn.yarn.yarn_mscale`)."""
    pos_freqs = base ** (torch.arange(0, d_head, 2).float() / d_head)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low, high = yarn_range(d_head, base, original_max_position_embeddings, beta_fast, beta_slow,
                           truncate)  # fmt: skip
    ramp = ((torch.arange(d_head // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the pair keeps its frequency
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, yarn_scale(factor, attention_factor)


def longrope_frequencies(
    d_head: int,
    base: float,
    short_factor: list[float],
    long_factor: list[float],
    original_max_position_embeddings: int,
    factor: float,
    attention_factor: float | None = None,
) -> tuple[Tensor, Tensor, float]:
    """LongRoPE's short and long frequencies and attention scaling ``(short (D/2,), long
    (D/2,), scale)``, as Hugging Face computes them: pair ``i``'s frequency ``base^(-2i/D)``
    divided by the set's factor ``i``; cos and sin times :func:`~attnlm.nn.yarn.longrope_scale`
    (``factor``: the model's context over the original one)."""
    for name, values in (("short_factor", short_factor), ("long_factor", long_factor)):
        if len(values) != d_head // 2:
            raise ValueError(f"longrope {name} has {len(values)} values for {d_head // 2} pairs")
    shape = torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head
    short, long = (1.0 / (torch.tensor(f, dtype=torch.float32) * base**shape)
                   for f in (short_factor, long_factor))  # fmt: skip
    return short, long, longrope_scale(factor, original_max_position_embeddings, attention_factor)


def llama3_frequencies(
    inv_freq: Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> Tensor:
    """Llama 3.1's RoPE frequency scaling (``rope_scaling = {"rope_type": "llama3", ...}``).

    Each frequency ``ω`` has a wavelength ``λ = 2π / ω`` in positions. With ``N`` the
    original context (``original_max_position_embeddings``): wavelengths shorter than
    ``N / high_freq_factor`` (the fast, local rotations) are kept; those longer than
    ``N / low_freq_factor`` (slow rotations that a longer context would take past angles
    never seen in training) are slowed down by ``factor``; in between, the frequency is
    interpolated ``(1 - s) ω / factor + s ω`` with ``s = (N / λ - low) / (high - low)``.
    """
    if factor <= 0 or high_freq_factor == low_freq_factor:
        raise ValueError("rope_scaling needs factor > 0 and high_freq_factor != low_freq_factor")
    n = original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq  # (D/2,)
    slow = wavelength > n / low_freq_factor
    fast = wavelength < n / high_freq_factor
    smooth = (n / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    between = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(slow, inv_freq / factor, torch.where(fast, inv_freq, between))


def alibi_slopes(n_head: int) -> Tensor:
    """Head slopes ``m_h`` of ALiBi: the geometric sequence ``2^(-8/n), 2^(-16/n), ...`` for
    ``n`` heads; when ``n`` is not a power of two, the slopes of the closest smaller power of
    two followed by every other slope of the next one (Press et al., 2022, section 3)."""

    def powers(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_head).is_integer():
        slopes = powers(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        slopes = powers(closest) + powers(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(nn.Module):
    """Attention with Linear Biases (Press et al., 2022): no position vectors; head ``h``
    adds ``-m_h (i - j)`` to the score of query ``i`` and key ``j``.

    ``forward(t, s)`` returns the ``(H, T, S)`` bias for the last ``T`` of ``S`` positions
    (query ``i`` at ``S - T + i``). Keys after the query get a positive bias, which the causal
    mask removes; ``symmetric=True`` uses ``-m_h |i - j|`` for encoders instead.
    """

    def __init__(self, n_head: int, symmetric: bool = False) -> None:
        super().__init__()
        self.symmetric = symmetric
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)  # (H,)

    def forward(self, t: int, s: int) -> Tensor:
        q_pos = torch.arange(s - t, s, device=self.slopes.device)[:, None]  # (T, 1)
        k_pos = torch.arange(s, device=self.slopes.device)[None, :]  # (1, S)
        distance = (k_pos - q_pos).to(torch.float32)  # j - i, (T, S)
        if self.symmetric:
            distance = -distance.abs()
        return self.slopes[:, None, None] * distance  # (H, T, S)
