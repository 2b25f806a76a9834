"""gpt-oss's stacked experts (``GptOssForCausalLM``) <-> one key per expert and matrix, the
names :func:`attnlm.models.hf.llama_family.block` maps onto our
:class:`~attnlm.nn.moe.SparseMoE` (``mlp.experts.{e}.fc`` / ``.proj``, weight and bias).

A gpt-oss layer stores its ``E`` experts as four tensors under ``mlp.experts.``:

``gate_up_proj``        ``(E, C, 2F)``  input rows; the gate's and up's output columns
                                        interleaved (gate at the even ones, up at the odd)
``gate_up_proj_bias``   ``(E, 2F)``     interleaved the same way
``down_proj``           ``(E, F, C)``   input rows
``down_proj_bias``      ``(E, C)``

Ours are ``nn.Linear`` s: ``fc`` ``(2F, C)`` with the gate's rows first, then up's; ``proj``
``(C, F)``. The released checkpoints (``quantization_config.quant_method = "mxfp4"``) hold
``gate_up_proj`` and ``down_proj`` in MXFP4 instead: ``<name>_blocks`` ``(E, R, K / 32, 16)``
uint8 and ``<name>_scales`` ``(E, R, K / 32)`` uint8, ``R`` the output features (``2F``
interleaved, or ``C``) and ``K`` the inputs; each byte holds two consecutive values (the low
nibble first), a nibble an E2M1 float (:data:`FP4_VALUES`), each 32 values of a row times
``2^(scale - 127)``. Those are dequantized to float32 on load (exactly: every value is a
float32).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlm.base.errors import ConfigError

#: the 16 values of an E2M1 code (sign bit, 2 exponent bits, 1 mantissa bit)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip
MATRICES = ("gate_up_proj", "down_proj")


def dequantize_mxfp4(blocks: Tensor, scales: Tensor) -> Tensor:
    """``(..., R, G, 16)`` uint8 codes and ``(..., R, G)`` uint8 exponents -> ``(..., R, 32
    G)`` float32 (each byte's low nibble first)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ConfigError("MXFP4 blocks and scales must be uint8")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ConfigError(f"MXFP4 blocks {tuple(blocks.shape)} do not fit scales "
                          f"{tuple(scales.shape)}")  # fmt: skip
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    pairs = torch.stack([lut[(blocks & 15).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = pairs.reshape(*blocks.shape[:-1], 32)  # (..., R, G, 32)
    values = torch.ldexp(values, scales.long()[..., None] - 127)
    return values.reshape(*scales.shape[:-1], -1)


def _matrix(state: dict[str, Tensor], key: str, where: str) -> Tensor:
    """A stacked matrix as ``(E, out, in)`` float: stored plain ``(E, in, out)``, or in MXFP4
    (``_blocks`` / ``_scales``, already ``(E, out, in)``)."""
    if key in state:
        return state.pop(key).float().transpose(1, 2)
    blocks, scales = state.pop(key + "_blocks", None), state.pop(key + "_scales", None)
    if blocks is None or scales is None:
        raise ConfigError(f"{where}: gpt-oss weights lack {key}")
    return dequantize_mxfp4(blocks, scales)


def unstack(state: dict[str, Tensor], n_layer: int, where: str) -> dict[str, Tensor]:
    """``state`` (a gpt-oss checkpoint's keys) with each layer's stacked experts replaced by
    ``layers.{i}.mlp.experts.{e}.fc`` / ``.proj`` weights and biases in our layout (keys with
    or without the ``model.`` prefix, as stored)."""
    out = dict(state)
    for i in range(n_layer):
        prefix = next((p for p in (f"model.layers.{i}.", f"layers.{i}.")
                       if any(k.startswith(p + "mlp.experts.") for k in out)), None)  # fmt: skip
        if prefix is None:
            raise ConfigError(f"{where}: gpt-oss layer {i} has no experts")
        at = prefix + "mlp.experts."
        gate_up = _matrix(out, at + "gate_up_proj", where)  # (E, 2F, C) interleaved rows
        down = _matrix(out, at + "down_proj", where)  # (E, C, F)
        gu_bias, down_bias = out.pop(at + "gate_up_proj_bias"), out.pop(at + "down_proj_bias")
        for e in range(gate_up.shape[0]):
            w, b = gate_up[e], gu_bias[e].float()
            out[f"{at}{e}.fc.weight"] = torch.cat([w[0::2], w[1::2]])  # gate rows, then up
            out[f"{at}{e}.fc.bias"] = torch.cat([b[0::2], b[1::2]])
            out[f"{at}{e}.proj.weight"] = down[e].contiguous()
            out[f"{at}{e}.proj.bias"] = down_bias[e].float()
    return out


def stack(state: dict[str, Tensor], n_layer: int, n_expert: int) -> dict[str, Tensor]:
    """The inverse of :func:`unstack` on an export's state (keys ``model.layers.{i}.``): each
    layer's experts stacked as ``transformers`` stores them (float, not MXFP4)."""
    out = dict(state)
    for i in range(n_layer):
        at = f"model.layers.{i}.mlp.experts."
        fc_w, fc_b, proj_w, proj_b = ([out.pop(f"{at}{e}.{name}") for e in range(n_expert)]
                                      for name in ("fc.weight", "fc.bias", "proj.weight",
                                                   "proj.bias"))  # fmt: skip
        out[at + "gate_up_proj"] = torch.stack([interleave(w).T for w in fc_w]).contiguous()
        out[at + "gate_up_proj_bias"] = torch.stack([interleave(b) for b in fc_b])
        out[at + "down_proj"] = torch.stack([w.T for w in proj_w]).contiguous()
        out[at + "down_proj_bias"] = torch.stack(proj_b)
    return out


def interleave(t: Tensor) -> Tensor:
    """Our gate rows, then up's ``(2F, ...)`` -> gpt-oss's alternating rows (gate first)."""
    half = t.shape[0] // 2
    return torch.stack([t[:half], t[half:]], dim=1).reshape(t.shape)


def check_quantization(hf: dict, where: str) -> None:
    """A ``quantization_config`` other than gpt-oss's own MXFP4 experts is refused."""
    q = hf.get("quantization_config")
    if q is not None and (not isinstance(q, dict) or q.get("quant_method") != "mxfp4"):
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise ConfigError(f"{where}: quantization_config {method!r} is not supported (a gpt-oss "
                          f"folder's mxfp4 experts are)")  # fmt: skip
