"""Decode-time weight formats: linear layers whose weights stay compact (bfloat16, 8-bit or
4-bit) while the activations stay float32.

A decoding step multiplies one row per sequence by every weight matrix, so its time is the
time to stream the weights from memory; fewer bytes per weight is the way past that bound
(llama.cpp's formats). :func:`quantize_weights` swaps the ``nn.Linear`` layers and the token
embedding of a model in place:

=======  =====================================================================================
format   what a weight ``w[n, k]`` is stored as (groups ``g`` of :data:`GROUP` along ``k``)
=======  =====================================================================================
f32      unchanged (the float32 model)
bf16     bfloat16
q8       ``s[n, g] · q[n, k]``: ``q`` int8, ``s`` float16 (ggml's Q8_0: ``s = max|w| / 127``)
q4       ``d[n, g] · u[n, k] + m[n, g]``: ``u`` 4 bits, ``d`` and ``m`` float16 (ggml's Q4_1;
         Q4_0's ``d · (u - 8)`` is ``m = -8 d``; quantizing a float matrix uses Q4_1's rule:
         ``d = (max - min) / 15``, ``m = min``, ``u = round((w - min) / d)``)
=======  =====================================================================================

The value of every stored weight is defined by these formulas in float32:
:meth:`QuantLinear.dequantized` computes it, and that float32 matrix is the reference every
kernel is tested against.

Kernels (one per layer shape and row count, chosen by :func:`kernel_for`): for a few rows
(decoding) PyTorch's weight-only kernels where they exist (``aten._weight_int4pack_mm_for_cpu``
reads the 4-bit weights in the layout ``aten._convert_weight_to_int4pack_for_cpu`` writes,
which :class:`QuantLinear` stores), timed once per shape against "dequantize to float32, then
``F.linear``" and the faster one kept; for many rows (prefill) the dequantizing path, because
the weight-only kernels do not tile for many rows and run tens of times slower than one float32
GEMM (bf16: its bfloat16 GEMM, about three times faster than float32 at 512 rows where the CPU
has AMX). ``aten._weight_int8pack_mm`` takes one scale per output row only, so 8-bit
groups of 32 (ggml's Q8_0, loaded without a round trip) go through the dequantizing path.

In q4 the LM head ``lm_head`` is stored q8 (unless a GGUF file stores it in 4 bits).
The token embedding is a row lookup, not a product: in q8 and q4 it is stored as q8 rows
(as llama.cpp keeps Q8_0 embeddings), in bf16 as bfloat16; a tied LM head in the same format
shares those codes (one :class:`QuantLinear` serves both, as llama.cpp reads one tensor).

Shape legend
    M  rows of the input (tokens: B T), K  input features, N  output features
    G  groups per row (K / GROUP)
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.errors import InputError
from attnlm.validate import WEIGHT_FORMATS
from attnlm.validate import weights_format as check_format

__all__ = [
    "FORMATS",
    "GROUP",
    "QuantEmbedding",
    "QuantLinear",
    "kernel_for",
    "pack_int4",
    "quantize_weights",
    "unpack_int4",
    "weights_format",
]

FORMATS = WEIGHT_FORMATS
GROUP = 32  # elements per scale (ggml's Q8_0, Q4_0 and Q4_1 blocks)
BLOCK_N = 64  # output rows per block of the int4 CPU kernel's packed layout
ROWS_AT_ONCE = 4096  # rows quantized per step
MANY_ROWS = 16  # from this many input rows on, dequantize and use one float32 GEMM

# (format, N, K) -> the kernel chosen for few rows; measured once per process
_CHOICE: dict[tuple[str, int, int], str] = {}


def _half(scales: Tensor) -> Tensor:
    """Scales stored as float16 (ggml's blocks store them so); a one-line error for a value
    float16 cannot hold."""
    h = scales.to(torch.float16)
    if not torch.isfinite(h).all():
        raise InputError("a weight is too large for float16 scales (|w| > 8e6): use f32 or bf16")
    return h


# -- packing ---------------------------------------------------------------------------------


def pack_int4(u: Tensor) -> Tensor:
    """4-bit values ``u`` ``(N, K)`` (0..15, N a multiple of :data:`BLOCK_N`) -> the bytes
    ``(N, K / 2)`` uint8 of ``aten._convert_weight_to_int4pack_for_cpu``'s layout: per block
    of 64 rows and per column ``k``, 32 bytes; byte ``j`` holds row ``j`` (low nibble) and row
    ``j + 32`` (high nibble)."""
    n, k = u.shape
    b = u.to(torch.uint8).view(n // BLOCK_N, 2, 32, k).permute(0, 3, 1, 2)  # (N/64, K, 2, 32)
    # contiguous: the elementwise result may keep the permuted strides (a single block)
    return (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4(packed: Tensor) -> Tensor:
    """The inverse of :func:`pack_int4`: ``(N, K / 2)`` bytes -> ``(N, K)`` uint8 values."""
    n, half = packed.shape
    p = packed.view(n // BLOCK_N, 2 * half, 32)  # (N/64, K, 32)
    u = torch.stack([p & 0x0F, p >> 4], dim=1)  # (N/64, 2, K, 32)
    return u.permute(0, 1, 3, 2).reshape(n, 2 * half)


def quantize_rows(w: Tensor, fmt: str) -> dict[str, Tensor]:
    """Float ``w`` ``(N, K)`` by the rule of ``fmt``: q8 ``{"q": (N, K) int8, "s": (N, G)}``;
    q4 ``{"u": (N, K) uint8 0..15, "d": (N, G), "m": (N, G)}`` (see the module docstring; the
    scales float32 here, float16 once stored)."""
    n, k = w.shape
    g = w.detach().float().reshape(n, k // GROUP, GROUP)
    if fmt == "q8":
        s = g.abs().amax(-1) / 127  # (N, G)
        q = torch.round(g / torch.where(s > 0, s, 1).unsqueeze(-1)).clamp(-127, 127)
        return {"q": q.to(torch.int8).view(n, k), "s": s}
    lo, hi = g.amin(-1), g.amax(-1)
    d = (hi - lo) / 15  # (N, G)
    u = torch.round((g - lo.unsqueeze(-1)) / torch.where(d > 0, d, 1).unsqueeze(-1))
    return {"u": u.clamp(0, 15).to(torch.uint8).view(n, k), "d": d, "m": lo}


# -- the layers ------------------------------------------------------------------------------


class QuantLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` ``(N, K)`` stored in ``fmt`` (``bf16``, ``q8`` or ``q4``;
    see the module docstring); ``x`` ``(..., K)`` float32 -> ``y`` ``(..., N)`` float32.

    Buffers: bf16 ``weight`` ``(N, K)``; q8 ``qweight`` ``(N, K)`` int8 and ``scales``
    ``(N, G)`` float16; q4 ``qweight`` ``(N', K / 2)`` uint8 (rows padded to a multiple of 64,
    packed by :func:`pack_int4`) and ``scales_mins`` ``(N' / 64, G, 64, 2)`` float16 (``d``,
    ``m`` per row and group, each 64-row block's together: a product reads one block's codes
    and scales as two sequential streams).
    Build with :meth:`from_float` or :meth:`from_q8` / :meth:`from_q4`."""

    def __init__(self, fmt: str, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fmt, self.in_features, self.out_features = fmt, in_features, out_features
        self.register_buffer("bias", None)

    # construction

    @classmethod
    def from_float(cls, weight: Tensor, bias: Tensor | None, fmt: str) -> QuantLinear:
        """Quantize float ``weight`` ``(N, K)`` (K a multiple of :data:`GROUP` for q8/q4)."""
        n, k = weight.shape
        if fmt == "bf16":
            layer = cls("bf16", k, n)
            layer.register_buffer("weight", weight.detach().to(torch.bfloat16).contiguous())
        else:
            # a few thousand rows at a time: the temporaries stay small beside an LM head
            pieces = [quantize_rows(weight[i : i + ROWS_AT_ONCE], fmt)
                      for i in range(0, n, ROWS_AT_ONCE)]  # fmt: skip
            codes = {key: torch.cat([p[key] for p in pieces]) for key in pieces[0]}
            layer = cls.from_codes(codes, fmt)
        layer.set_bias(bias)
        return layer

    @classmethod
    def from_codes(cls, codes: dict[str, Tensor], fmt: str) -> QuantLinear:
        """From :func:`quantize_rows`' dictionary (``q``, ``s`` or ``u``, ``d``, ``m``)."""
        if fmt == "q8":
            return cls.from_q8(codes["q"], codes["s"])
        return cls.from_q4(codes["u"], codes["d"], codes["m"])

    @classmethod
    def from_q8(cls, q: Tensor, scales: Tensor) -> QuantLinear:
        """From int8 ``q`` ``(N, K)`` and float ``scales`` ``(N, K / GROUP)``."""
        layer = cls("q8", q.shape[1], q.shape[0])
        layer.register_buffer("qweight", q.to(torch.int8).contiguous())
        layer.register_buffer("scales", _half(scales).contiguous())
        return layer

    @classmethod
    def from_q4(cls, u: Tensor, d: Tensor, m: Tensor) -> QuantLinear:
        """From 4-bit values ``u`` ``(N, K)`` (0..15) with ``w = d u + m`` per group; ``d`` and
        ``m`` ``(N, K / GROUP)``."""
        n, k = u.shape
        pad = -n % BLOCK_N
        layer = cls("q4", k, n)
        u = F.pad(u.to(torch.uint8), (0, 0, 0, pad))
        dm = F.pad(torch.stack([_half(d), _half(m)], dim=-1), (0, 0, 0, 0, 0, pad))  # (N', G, 2)
        layer.register_buffer("qweight", pack_int4(u))
        blocks = dm.view(-1, BLOCK_N, k // GROUP, 2).transpose(1, 2)  # (N'/64, G, 64, 2)
        layer.register_buffer("scales_mins", blocks.contiguous())
        return layer

    def set_bias(self, bias: Tensor | None) -> None:
        self.bias = None if bias is None else bias.detach().float().clone()

    # the weights

    def dequantized(self, start: int = 0, stop: int | None = None) -> Tensor:
        """The float32 ``(N, K)`` matrix this layer multiplies by (the reference), or its rows
        ``start:stop`` (``start`` a multiple of 64)."""
        k = self.in_features
        stop = self.out_features if stop is None else min(stop, self.out_features)
        n = stop - start
        if self.fmt == "bf16":
            return self.weight[start:stop].float()
        if self.fmt == "q8":
            q = self.qweight[start:stop].view(n, k // GROUP, GROUP).float()
            return (q * self.scales[start:stop].float().unsqueeze(-1)).view(n, k)
        end = start + n + (-n % BLOCK_N)  # whole 64-row blocks of the packed layout
        u = unpack_int4(self.qweight[start:end])[:n].float().view(n, k // GROUP, GROUP)
        dm = self.scales_mins[start // BLOCK_N : end // BLOCK_N].float()  # (n'/64, G, 64, 2)
        dm = dm.transpose(1, 2).reshape(-1, k // GROUP, 2)[:n]  # (n, G, 2)
        d, m = dm[..., :1], dm[..., 1:]  # (n, G, 1)
        return (u.mul_(d).add_(m)).view(n, k)

    # the products

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (M, K)
        y = KERNELS[kernel_for(self, x2.shape[0])](self, x2)  # (M, N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def device_type(self) -> str:
        return next(self.buffers()).device.type

    def extra_repr(self) -> str:
        return f"{self.fmt}, in_features={self.in_features}, out_features={self.out_features}"


def _dequant_gemm(layer: QuantLinear, x: Tensor) -> Tensor:
    """Dequantize :data:`ROWS_AT_ONCE` output rows at a time (an LM head's float32 copy is
    never whole: a cache-sized piece, then its product)."""
    n, x = layer.out_features, x.float()
    if n <= ROWS_AT_ONCE:
        return F.linear(x, layer.dequantized())
    y = x.new_empty(x.shape[0], n)
    for start in range(0, n, ROWS_AT_ONCE):
        w = layer.dequantized(start, start + ROWS_AT_ONCE)
        torch.mm(x, w.t(), out=y[:, start : start + w.shape[0]])
    return y


def _bf16_gemm(layer: QuantLinear, x: Tensor) -> Tensor:
    return F.linear(x.to(torch.bfloat16), layer.weight).float()


def _int4_kernel(layer: QuantLinear, x: Tensor) -> Tensor:
    # the kernel's (scale, zero) with w = scale (u - 8) + zero: d and m + 8 d, in float32
    dm = layer.scales_mins.float().permute(1, 0, 2, 3).flatten(1, 2)  # (G, N', 2)
    sz = torch.stack([dm[..., 0], dm[..., 1] + 8 * dm[..., 0]], dim=-1)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.float().contiguous(), layer.qweight, GROUP, sz)
    return y[:, : layer.out_features]


#: name -> ``fn(layer, x (M, K)) -> (M, N)``
KERNELS = {"dequant": _dequant_gemm, "bf16": _bf16_gemm, "int4pack": _int4_kernel}
CANDIDATES = {"bf16": ("dequant", "bf16"), "q8": ("dequant",), "q4": ("dequant", "int4pack")}


def kernel_for(layer: QuantLinear, rows: int) -> str:
    """The kernel for ``rows`` input rows: from :data:`MANY_ROWS` on ``dequant`` (bf16: its
    bfloat16 GEMM); off the CPU ``dequant``; else the fastest of the format's
    :data:`CANDIDATES` at one row, timed once per ``(format, N, K)`` (alternating, best of 5)
    and remembered for the process."""
    options = CANDIDATES[layer.fmt]
    if layer.device_type() != "cpu":
        return "dequant"
    if rows >= MANY_ROWS:  # bf16: the bfloat16 GEMM (AMX, AVX512-BF16) beats float32 here
        return "bf16" if layer.fmt == "bf16" else "dequant"
    if len(options) == 1:
        return options[0]
    key = (layer.fmt, layer.out_features, layer.in_features)
    if key not in _CHOICE:
        _CHOICE[key] = _measure(layer, options)
    return _CHOICE[key]


def _measure(layer: QuantLinear, options: tuple[str, ...]) -> str:
    x = torch.randn(1, layer.in_features)
    best = dict.fromkeys(options, float("inf"))
    with torch.no_grad():
        for name in options:
            try:
                KERNELS[name](layer, x)  # warm up (and: does this build have it?)
            except (RuntimeError, NotImplementedError):
                best.pop(name)
        for _ in range(5):
            for name in best:
                start = time.perf_counter()
                KERNELS[name](layer, x)
                best[name] = min(best[name], time.perf_counter() - start)
    return min(best, key=best.get) if best else "dequant"


class QuantEmbedding(nn.Module):
    """A token embedding ``(V, C)`` stored as q8 rows (or bfloat16): ``ids`` ``(...)`` ->
    ``(..., C)`` float32, each looked-up row dequantized alone."""

    def __init__(self, table: QuantLinear) -> None:
        super().__init__()
        self.table = table  # a QuantLinear used for its storage: (V, C)
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, ids: Tensor) -> Tensor:
        t = self.table
        if t.fmt == "bf16":
            return t.weight[ids].float()
        q = t.qweight[ids].view(*ids.shape, -1, GROUP).float()  # (..., G, GROUP)
        return (q * t.scales[ids].float().unsqueeze(-1)).flatten(-2)


# -- the public call -------------------------------------------------------------------------


def weights_format(model: nn.Module) -> str:
    """The format :func:`quantize_weights` gave ``model`` (``f32`` if none)."""
    return getattr(model, "weights_format", "f32")


def quantize_weights(model: nn.Module, fmt: str) -> nn.Module:
    """Store the weights of ``model`` (a gpt or llama decoder, or any model with ``nn.Linear``
    layers) in ``fmt`` (:data:`FORMATS`), in place, for decoding; returns ``model``.

    Every ``nn.Linear`` whose input width is a multiple of :data:`GROUP` (every one for bf16)
    becomes a :class:`QuantLinear` (the LM head too, tied or not; in q4 the head is q8, as
    llama.cpp's quantizers keep the output matrix at a higher precision: on SmolLM2 a 4-bit
    head alone costs about 6% perplexity); the token embedding
    ``tok_emb`` becomes a :class:`QuantEmbedding` (q8 rows for q8 and q4, bfloat16 for
    bf16). The float32 weights are dropped. The model is for inference from then on (its
    weights are buffers, not parameters). ``f32`` changes nothing."""
    check_format(fmt)
    if fmt == "f32":
        return model
    if weights_format(model) != "f32":
        raise InputError(f"the model's weights are already {weights_format(model)}")
    emb = getattr(model, "tok_emb", None)
    head = getattr(model, "lm_head", None)
    tied = isinstance(emb, nn.Embedding) and getattr(head, "weight", None) is emb.weight
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and (
                    fmt == "bf16" or child.in_features % GROUP == 0
                ):
                    head = fmt == "q4" and parent is model and name == "lm_head"
                    layer = QuantLinear.from_float(child.weight, child.bias, "q8" if head else fmt)
                    setattr(parent, name, layer.to(child.weight.device))
        if isinstance(emb, nn.Embedding) and (fmt == "bf16" or emb.embedding_dim % GROUP == 0):
            table_fmt = "bf16" if fmt == "bf16" else "q8"
            if tied and getattr(model.lm_head, "fmt", None) == table_fmt:
                table = model.lm_head  # the same codes: stored once, as llama.cpp does
            else:
                table = QuantLinear.from_float(emb.weight, None, table_fmt).to(emb.weight.device)
            model.tok_emb = QuantEmbedding(table)
    model.weights_format = fmt
    return model.eval()
