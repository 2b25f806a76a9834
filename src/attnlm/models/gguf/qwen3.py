"""GGUF architecture ``qwen3`` (Qwen3 dense models) -> our Llama with per-head q/k norms.

Metadata (``qwen3.`` keys) as :mod:`.qwen2`'s: the head width is ``attention.key_length``
(Qwen3 0.6B: 128 with ``n_embd / n_head`` = 64), ``rope.scaling.type`` ``none``, ``linear``
or ``yarn``; any other ``qwen3.`` key is refused naming it (mixtures of experts are architecture
``qwen3moe``: :mod:`.qwen3moe`).

Tensors as :mod:`.qwen2`'s (NEOX rotary: rows as stored; biases where the file has them),
plus ``blk.N.attn_q_norm`` / ``attn_k_norm`` (``(D,)``, llama.cpp requires them) -> our
``attn.q_norm`` / ``attn.k_norm`` (``qk_norm``), applied to each head before the rotation.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import (
    BASE_KEYS,
    YARN_KEYS,
    Meta,
    base_table,
    block_parts,
    has_tensor,
)  # fmt: skip
from attnlm.models.gguf.parts import Part

ARCH = "qwen3"
READ = BASE_KEYS | YARN_KEYS


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    table = base_table(Meta(header, ARCH, READ), scalings=("linear", "yarn"))
    table["qk_norm"] = True
    table["qkv_bias"] = has_tensor(header, "attn_q.bias")
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored)."""
    return block_parts(config, header)
