"""GGUF architecture ``phi3`` (Phi-3 mini / medium, Phi-4 mini) -> our Llama.

Metadata (``phi3.`` keys) as :mod:`.llama`'s, plus:

==========================================  ===========================================
``rope.scaling.original_context_length``    LongRoPE's original context (else checked)
``attention.sliding_window``                read, not applied: llama.cpp disables Phi-3's
                                            sliding window ("Phi SWA is currently
                                            disabled"), so a file with one runs every
                                            layer global there, and here
``rope.scaling.attn_factor``                LongRoPE's scale of cos and sin
==========================================  ===========================================

``rope.dimension_count`` below the head width is partial rotary (``rotary_dim``: Phi-4 mini
rotates 96 of 128 features); LongRoPE (the 128k models: ``rope_factors_short`` /
``rope_factors_long`` tensors) is read by :func:`longrope_scaling`; any other ``phi3.`` key is
refused naming it.

Tensors: NEOX rotary (rows as stored); ``blk.N.attn_qkv`` ``(H·D + 2·Hkv·D, C)`` is already our
fused ``qkv_proj`` (separate ``attn_q/k/v`` are read too); ``blk.N.ffn_up`` ``(2F, C)`` is
Phi-3's fused gate-up projection, gate rows first (llama.cpp's SwiGLU takes the first half
through SiLU), already our ``mlp.fc``; the rest as :mod:`.llama`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import (
    BASE_KEYS,
    LONGROPE,
    Meta,
    base_table,
    block_parts,
)
from attnlm.models.gguf.parts import Part

ARCH = "phi3"
READ = BASE_KEYS | {"rope.scaling.original_context_length", "attention.sliding_window",
                   "rope.scaling.attn_factor"}  # fmt: skip


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, partial=True)
    d = table.get("d_head") or table["n_embd"] // table["n_head"]
    r = meta.int("rope.dimension_count", d)
    if r != d:  # partial rotary (Phi-4 mini: 96 of 128)
        if r % 2 or not 0 < r < d:
            meta.refuse("rope.dimension_count", f"not an even width up to the head's {d}")
        table["rotary_dim"] = r
    if any(name in header.tensors for name in LONGROPE):
        table["rope_scaling"] = longrope_scaling(meta, table["block_size"], r)
    elif meta.has("rope.scaling.original_context_length"):
        meta.int("rope.scaling.original_context_length")
    if meta.has("attention.sliding_window"):
        meta.int("attention.sliding_window", zero=True)  # checked; llama.cpp ignores it
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (fused qkv and gate-up as stored)."""
    return block_parts(config, header)


def longrope_scaling(meta: Meta, context: int, d: int) -> dict[str, Any]:
    """LongRoPE's ``rope_scaling`` as llama.cpp applies it to a file: the factors of the two
    tensors (F32, one per pair; the long ones where the context passes the original), the
    original context ``rope.scaling.original_context_length``, the context factor (the file's
    context over the original) and cos and sin times ``rope.scaling.attn_factor`` (absent: 1,
    as llama.cpp takes it; kept as ``attention_factor`` where it is not LongRoPE's default)."""
    from attnlm.nn.yarn import longrope_scale

    header, path, sets = meta.header, meta.path, []
    for name in LONGROPE:
        info = header.tensors.get(name)
        if info is None or info.type_name != "F32" or tuple(info.shape) != (d // 2,):
            got = "none" if info is None else f"{info.type_name} {list(info.shape)}"
            raise InputError(
                f"{path}: LongRoPE needs tensors {LONGROPE[0]!r} and "
                f"{LONGROPE[1]!r}, F32 with {d // 2} values, got {name!r}: {got}"
            )
        values = np.frombuffer(header.raw(info), dtype=np.float32)
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise InputError(f"{path}: tensor {name!r} holds factors that are not positive")
        sets.append([float(v) for v in values])
    n = meta.int("rope.scaling.original_context_length")
    scaling = {"rope_type": "longrope", "short_factor": sets[0], "long_factor": sets[1],
               "original_max_position_embeddings": n, "factor": context / n}  # fmt: skip
    given = meta.float("rope.scaling.attn_factor", 1.0)
    if abs(given - longrope_scale(context / n, n)) > 1e-6 * given:
        scaling["attention_factor"] = given
    return scaling
