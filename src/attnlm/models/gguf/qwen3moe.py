"""GGUF architecture ``qwen3moe`` (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B) ->
our Llama with per-head q/k norms and a mixture of experts in every block.

Metadata as :mod:`.qwen3`'s, plus ``expert_count``, ``expert_used_count`` and
``expert_feed_forward_length`` (each expert's width; :func:`~.common.moe_fields`). llama.cpp's
``qwen3moe`` graph renormalises the chosen experts' weights whatever the source model's
``norm_topk_prob`` said (true for every released Qwen3-MoE), and so do we.

Tensors as :mod:`.qwen3`'s, the feed-forward replaced by the router ``blk.N.ffn_gate_inp``
``(E, C)`` and the stacked experts ``blk.N.ffn_gate_exps`` / ``ffn_up_exps`` ``(E, F, C)`` and
``ffn_down_exps`` ``(E, C, F)`` (:func:`~.common.expert_parts`).
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import (
    BASE_KEYS,
    MOE_KEYS,
    YARN_KEYS,
    Meta,
    base_table,
    block_parts,
    has_tensor,
    moe_fields,
)
from attnlm.models.gguf.parts import Part

ARCH = "qwen3moe"
READ = BASE_KEYS | MOE_KEYS | YARN_KEYS


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, scalings=("linear", "yarn"))
    experts = moe_fields(meta, table)
    if not experts:
        meta.refuse("expert_count", "a qwen3moe model needs experts")
    table.update(experts, qk_norm=True, qkv_bias=has_tensor(header, "attn_q.bias"))
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored)."""
    return block_parts(config, header)
