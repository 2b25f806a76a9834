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

The byte layouts (the 4-bit codes packed per 64 rows, the scales beside them) are
:mod:`attnlm.quant.blocks`', the one definition the C step and the C engine read too. The
value of every stored weight is defined by these formulas in float32:
:meth:`QuantLinear.dequantized` computes it, and that float32 matrix is the reference every
kernel is tested against.

Kernels (:func:`kernel_for`, a rule on the format and the device, fixed for a layer): on the
CPU bf16 runs its bfloat16 GEMM (with AMX or AVX512-BF16 about three times faster than float32
at 512 rows, and faster than widening the weights at one row too); q8 and q4, and every format
off the CPU, dequantize :data:`ROWS_AT_ONCE` output rows at a time to float32 and run one
float32 GEMM. PyTorch's weight-only kernels lose to that here: ``aten._weight_int4pack_mm_for_cpu``
(which reads this very 4-bit layout) measured 2.2 times slower at one row and 4 to 30 times
slower at 4 to 12 rows on SmolLM2's shapes (torch 2.13, one and two threads), and
``aten._weight_int8pack_mm`` takes one scale per output row only, not Q8_0's groups of 32.
Decoding on the CPU runs the C step (:mod:`attnlm.runtime.cstep`) anyway, which reads these
buffers as stored.

In q4 the LM head ``lm_head`` is stored q8 (unless a GGUF file stores it in 4 bits).
The token embedding is a row lookup, not a product: in q8 and q4 it is stored as q8 rows
(as llama.cpp keeps Q8_0 embeddings), in bf16 as bfloat16; a tied LM head in the same format
shares those codes (one :class:`QuantLinear` serves both, as llama.cpp reads one tensor).
:func:`weights_format` reads a model's format off its layers.

Shape legend
    M  rows of the input (tokens: B T), K  input features, N  output features
    G  groups per row (K / GROUP)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.base.errors import InputError
from attnlm.base.validate import WEIGHT_FORMATS
from attnlm.base.validate import weights_format as check_format
from attnlm.quant.blocks import BLOCK_N, GROUP, pack_q4

__all__ = [
    "FORMATS",
    "GROUP",
    "KERNELS",
    "QuantEmbedding",
    "QuantLinear",
    "kernel_for",
    "quantize_rows",
    "quantize_weights",
    "unpack_int4",
    "weights_format",
]

FORMATS = WEIGHT_FORMATS
ROWS_AT_ONCE = 4096  # rows quantized, or dequantized for a product, per step


def _half(scales: Tensor) -> Tensor:
    """Scales stored as float16 (ggml's blocks store them so); a one-line error for a value
    float16 cannot hold."""
    h = scales.to(torch.float16)
    if not torch.isfinite(h).all():
        raise InputError("a weight is too large for float16 scales (|w| > 8e6): use f32 or bf16")
    return h


def unpack_int4(packed: Tensor) -> Tensor:
    """The packed 4-bit codes (:func:`attnlm.quant.blocks.pack_int4`) read back: ``(N, K / 2)``
    bytes -> ``(N, K)`` uint8 values, on the tensor's device (the dequantizing kernel)."""
    n, half = packed.shape
    p = packed.view(n // BLOCK_N, 2 * half, 32)  # (N/64, K, 32)
    u = torch.stack([p & 0x0F, p >> 4], dim=1)  # (N/64, 2, K, 32)
    return u.permute(0, 1, 3, 2).reshape(n, 2 * half)


def quantize_rows(w: Tensor, fmt: str) -> dict[str, Tensor]:
    """Float ``w`` ``(N, K)`` by the rule of ``fmt``, on its device: q8 ``{"q": (N, K) int8,
    "s": (N, G)}``; q4 ``{"u": (N, K) uint8 0..15, "d": (N, G), "m": (N, G)}`` (see the module
    docstring; the scales float32 here, float16 once stored)."""
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
    ``(N, G)`` float16; q4 ``qweight`` ``(N', K / 2)`` uint8 (rows padded to a multiple of 64)
    and ``scales_mins`` ``(N' / 64, G, 64, 2)`` float16 (``d``, ``m`` per row and group, each
    64-row block's together: a product reads one block's codes and scales as two sequential
    streams), laid out by :func:`attnlm.quant.blocks.pack_q4`.
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
        layer = cls("q4", k, n)
        arrays = [t.cpu().numpy() for t in (u.to(torch.uint8), _half(d), _half(m))]
        packed, scales = pack_q4(*arrays)  # (N', K / 2), (N'/64, G, 64, 2): the one layout
        layer.register_buffer("qweight", torch.from_numpy(packed).to(u.device))
        layer.register_buffer("scales_mins", torch.from_numpy(scales).to(u.device))
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
        y = KERNELS[kernel_for(self)](self, x2)  # (M, N)
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


#: name -> ``fn(layer, x (M, K)) -> (M, N)``
KERNELS = {"dequant": _dequant_gemm, "bf16": _bf16_gemm}


def kernel_for(layer: QuantLinear) -> str:
    """The kernel of ``layer``'s products, by its format and device alone (the same for every
    row count; measurements in the module docstring): ``bf16`` for bfloat16 weights on the
    CPU, else ``dequant``."""
    return "bf16" if layer.fmt == "bf16" and layer.device_type() == "cpu" else "dequant"


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
    """The format ``model``'s weights are stored in, as its layers tell: the narrowest format
    among its :class:`QuantLinear` layers (in q4 the LM head and the embedding table are q8),
    ``f32`` where it has none."""
    held = {m.fmt for m in model.modules() if isinstance(m, QuantLinear)}
    return next((fmt for fmt in ("q4", "q8", "bf16") if fmt in held), "f32")


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
    return model.eval()
