"""A GGUF model loaded straight into a decode-time weight format (:mod:`attnlm.nn.quant`),
without building the float32 model first.

The model is built without initialisation (:func:`~attnlm.models.gguf.loader.no_init`: its
float32 matrices are allocated but never written, so the system gives them no memory), its
linear layers and token embedding are replaced by :class:`~attnlm.nn.quant.QuantLinear` /
:class:`~attnlm.nn.quant.QuantEmbedding` filled from the file (dropping those untouched
matrices), and only the small remaining parameters (norms, biases, positions) are dequantized
by :func:`~attnlm.models.gguf.loader.fill`. The peak is the quantized model plus one tensor.

Each file matrix becomes rows of its layer: a matrix whose ggml type is the format's own
(``Q8_0`` for q8; ``Q4_0`` and ``Q4_1`` for q4) is copied as codes and float16 scales (Q4_1's
``d · u + m`` as it is; Q4_0's ``d · (u - 8)`` as ``m = -8 d``, exact in float16); any other
type is dequantized (that tensor alone) and quantized by the format's rule.
Quantization works row by row, so the rows of q and k move back from llama.cpp's rotary order
(:func:`~attnlm.models.gguf.loader.unpermute_rows`) as codes and scales.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from attnlm.ggufio import GGUFFile
from attnlm.models.gguf.loader import build_empty, fill, unpermute_rows
from attnlm.models.gguf.parts import Part
from attnlm.models.gguf.quants import SUPPORTED, dequantize
from attnlm.nn.quant import GROUP, ROWS_AT_ONCE, QuantEmbedding, QuantLinear, quantize_rows

#: the ggml types each format takes as stored
NATIVE = {"q8": ("Q8_0",), "q4": ("Q4_0", "Q4_1")}
#: ggml tensor type -> the format that keeps its precision
PRECISION = {"F32": "f32", "F16": "bf16", "BF16": "bf16", "Q8_0": "q8", "Q6_K": "q8",
             "Q5_K": "q8", "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4"}  # fmt: skip


def precision_class(header: GGUFFile) -> str:
    """A GGUF file's own weights format: that of the ggml type holding most of its matrix
    elements (2-D tensors; the SmolLM2 file: Q4_1 -> ``q4``)."""
    counts: dict[str, int] = {}
    for info in header.tensors.values():
        if len(info.shape) == 2:
            counts[info.type_name] = counts.get(info.type_name, 0) + info.n_elements
    return PRECISION.get(max(counts, key=counts.get), "f32") if counts else "f32"


def _codes(raw, type_id: int, shape: tuple[int, int]) -> dict[str, Tensor]:
    """Codes and scales of a Q8_0 / Q4_0 / Q4_1 matrix ``(N, K)``: ``q`` int8 and ``s``, or
    ``u`` 0..15 and ``d``, ``m``; codes ``(N, K)``, scales ``(N, K / 32)`` float32."""
    n, k = shape
    _, _, size = SUPPORTED[type_id]
    b = torch.from_numpy(raw).view(-1, size)  # (N K / 32, bytes)
    d = b[:, :2].contiguous().view(torch.float16).float().view(n, k // GROUP)
    name = SUPPORTED[type_id][0]
    if name == "Q8_0":
        return {"q": b[:, 2:].contiguous().view(torch.int8).view(n, k), "s": d}
    qs = b[:, 4:] if name == "Q4_1" else b[:, 2:]  # byte j: element j (low), j + 16 (high)
    u = torch.cat([qs & 0x0F, qs >> 4], dim=1).view(n, k)
    if name == "Q4_0":
        return {"u": u, "d": d, "m": -8 * d}
    m = b[:, 2:4].contiguous().view(torch.float16).float().view(n, k // GROUP)
    return {"u": u, "d": d, "m": m}


def _float_codes(raw, info, fmt: str) -> dict[str, Tensor]:
    """A matrix of another type dequantized and quantized by the format's rule, a few
    thousand rows at a time (the float32 copy of an LM head is never whole)."""
    n, k = info.shape
    rows = raw.reshape(n, -1)  # bytes per row: whole blocks
    pieces = []
    for i in range(0, n, ROWS_AT_ONCE):
        piece = rows[i : i + ROWS_AT_ONCE]
        w = dequantize(piece.reshape(-1), info.type, (piece.shape[0], k), name=info.name)
        pieces.append(quantize_rows(w, fmt))
    return {key: torch.cat([p[key] for p in pieces]) for key in pieces[0]}


def _matrix(header: GGUFFile, part: Part, fmt: str, notes: set[str]) -> dict[str, Tensor]:
    info = header.tensors[part.gguf]
    raw = header.raw(info)
    if info.type_name in NATIVE[fmt]:
        codes = _codes(raw, info.type, tuple(info.shape))
    else:
        notes.add(info.type_name)
        codes = _float_codes(raw, info, fmt)
    if part.heads:
        for key, value in codes.items():
            dest = torch.empty_like(value)
            unpermute_rows(value, dest, part.heads)
            codes[key] = dest
    return codes


def _layer(pieces: list[dict[str, Tensor]], fmt: str) -> QuantLinear:
    rows = pieces[0] if len(pieces) == 1 else {key: torch.cat([p[key] for p in pieces])
                                               for key in pieces[0]}  # fmt: skip
    return QuantLinear.from_codes(rows, fmt)


def load_quantized(header: GGUFFile, model: nn.Module, parts: list[Part], fmt: str) -> set[str]:
    """Fill ``model`` (built under :func:`~attnlm.models.gguf.loader.no_init`) from
    ``header``, its linear layers and token embedding in ``fmt`` (``q8`` or ``q4``); returns
    the ggml types that were dequantized and re-quantized."""
    notes: set[str] = set()
    by_weight: dict[str, list[Part]] = {}
    for part in parts:
        by_weight.setdefault(part.ours, []).append(part)
    done: set[str] = set()
    tied = getattr(model.config, "tie_embeddings", False)
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            is_emb = name == "tok_emb" and isinstance(module, nn.Embedding)
            if not (isinstance(module, nn.Linear) or is_emb) or module.weight.shape[1] % GROUP:
                continue
            source = "tok_emb.weight" if name == "lm_head" and tied else f"{name}.weight"
            layer_parts = sorted(by_weight.get(source, []), key=lambda p: (p.rows or (0,))[0])
            if not layer_parts:
                continue
            stored = {header.tensors[p.gguf].type_name for p in layer_parts}
            head_q8 = name == "lm_head" and not stored <= set(NATIVE["q4"])  # see quantize_weights
            layer_fmt = "q8" if is_emb or (fmt == "q4" and head_q8) else fmt
            emb = model.tok_emb
            if source == "tok_emb.weight" and not is_emb and isinstance(emb, QuantEmbedding):
                if emb.table.fmt == layer_fmt:  # a tied head: the embedding's codes, shared
                    model.lm_head = emb.table
                    continue
            layer = _layer([_matrix(header, p, layer_fmt, notes) for p in layer_parts], layer_fmt)
            bias = by_weight.get(f"{name}.bias")
            if bias:
                b = header.tensors[bias[0].gguf]
                layer.set_bias(dequantize(header.raw(b), b.type, b.shape, name=bias[0].gguf))
                done.add(bias[0].gguf)
            parent, _, attr = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, attr, QuantEmbedding(layer) if is_emb else layer)
            done.update(p.gguf for p in layer_parts)
        rest = [p for p in parts if p.gguf not in done]
        fill(model, header, rest, consumed=done)
    model.weights_format = fmt
    return notes


def load_model(path: str | Path | GGUFFile, weights: str = "f32") -> nn.Module:
    """Our model (eval mode) from a GGUF file (a path or an opened header), its weights in
    ``weights`` (:mod:`attnlm.nn.quant`): ``f32`` dequantizes every tensor
    (:func:`~attnlm.models.gguf.loader.load_model`); ``q8``/``q4`` load the matrices straight
    into that format (:func:`load_quantized`; ``model.requantized`` names the ggml types that
    went through float32); ``bf16`` rounds the float32 model."""
    from attnlm.models.gguf import loader
    from attnlm.nn.quant import quantize_weights
    from attnlm.validate import weights_format as check_format

    check_format(weights)
    header = path if isinstance(path, GGUFFile) else GGUFFile(path)
    if weights not in ("q8", "q4"):
        return quantize_weights(loader.load_model(header), weights).eval()
    model, config, module = build_empty(header)
    model.requantized = sorted(load_quantized(header, model, module.parts(config, header), weights))
    return model.eval()
