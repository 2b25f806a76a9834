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

``rope.dimension_count`` must be the head width (partial rotary, Phi-4 mini's 0.75, is
refused); LongRoPE (the 128k models: ``rope_factors_short`` / ``rope_factors_long`` tensors) is
read by :func:`~.common.longrope_scaling`; any other ``phi3.`` key is refused naming it.

Tensors: NEOX rotary (rows as stored); ``blk.N.attn_qkv`` ``(H·D + 2·Hkv·D, C)`` is already our
fused ``qkv_proj`` (separate ``attn_q/k/v`` are read too); ``blk.N.ffn_up`` ``(2F, C)`` is
Phi-3's fused gate-up projection, gate rows first (llama.cpp's SwiGLU takes the first half
through SiLU), already our ``mlp.fc``; the rest as :mod:`.llama`'s.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import (
    BASE_KEYS,
    LONGROPE,
    Meta,
    base_table,
    block_parts,
    longrope_scaling,
)
from attnlm.models.gguf.parts import Part

ARCH = "phi3"
READ = BASE_KEYS | {"rope.scaling.original_context_length", "attention.sliding_window",
                   "rope.scaling.attn_factor"}  # fmt: skip


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta)
    if any(name in header.tensors for name in LONGROPE):
        d = table.get("d_head") or table["n_embd"] // table["n_head"]
        table["rope_scaling"] = longrope_scaling(meta, table["block_size"], d)
    elif meta.has("rope.scaling.original_context_length"):
        meta.int("rope.scaling.original_context_length")
    if meta.has("attention.sliding_window"):
        meta.int("attention.sliding_window", zero=True)  # checked; llama.cpp ignores it
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (fused qkv and gate-up as stored)."""
    return block_parts(config, header)
