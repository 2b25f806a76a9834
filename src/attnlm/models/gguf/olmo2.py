"""GGUF architecture ``olmo2`` (AllenAI OLMo 2) -> our Llama without pre-norms.

OLMo 2 keeps Llama's tensors and keys but moves the norms: no ``attn_norm`` or ``ffn_norm``
before the sublayers; ``post_attention_norm`` and ``post_ffw_norm`` normalise their outputs
before each residual add (``pre_norms = false``, ``post_norms``); and ``attn_q_norm``
``(H D,)`` / ``attn_k_norm`` ``(Hkv D,)`` normalise all heads' q and k at once, before the
rotation (``qk_norm_all``). The rotation is NEOX's (rows as stored), the heads ``n_embd /
n_head`` wide. OLMo 3's sliding windows (``olmo2.attention.sliding_window``) are refused.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import BASE_KEYS, Meta, base_table, block_parts
from attnlm.models.gguf.parts import Part

ARCH = "olmo2"
READ = BASE_KEYS


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, free_head=False)
    table.update(pre_norms=False, post_norms=True, qk_norm=True, qk_norm_all=True)
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored)."""
    return block_parts(config, header)
