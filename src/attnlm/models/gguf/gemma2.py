"""GGUF architecture ``gemma2`` (Gemma 2) -> our Llama with Gemma's parts.

Metadata (``gemma2.`` keys) as for :mod:`.llama` (:func:`~.common.base_table`; the head
width is ``attention.key_length``), plus, each as llama.cpp's ``gemma2`` reads it:

==========================================  ================================================
``attention.sliding_window``                ``sliding_window`` (absent: 4096, llama.cpp's)
``attention.sliding_window_pattern``        ``layer_types`` (absent: period 2: even layers
                                            slide, odd layers are global)
``attn_logit_softcapping``                  ``attn_softcap`` (absent: 50)
``final_logit_softcapping``                 ``final_softcap`` (absent: 30)
``rope.freq_base_swa``                      ``rope_local_theta`` (absent: ``rope.freq_base``)
==========================================  ================================================

Fixed by the architecture, as llama.cpp fixes them: ``embed_scale`` = ``sqrtf(n_embd)``
(float32), GeGLU (``mlp_act = "gelu_tanh"``), ``post_norms``, and the score scale
``1/sqrt(D)``, except for the 46-layer model (Gemma 2 27B) where llama.cpp takes
``1/sqrt(n_embd / n_head)`` (the model's ``query_pre_attn_scalar``: the file does not carry it).
A rotary scaling is refused.

Tensors as :mod:`.llama`'s, NEOX rotary (rows as stored), plus ``blk.N.post_attention_norm``
and ``blk.N.post_ffw_norm`` -> ``ln_post_attn`` / ``ln_post_mlp``. Gemma's RMSNorm multiplies by
``1 + w``; llama.cpp's converter already stores ``1 + w``, which is our RMSNorm's weight, so
every norm loads as stored. The head is tied (``output.weight`` absent).
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import BASE_KEYS, Meta, base_table, block_parts, gemma_parts
from attnlm.models.gguf.parts import Part

ARCH = "gemma2"
READ = BASE_KEYS | {
    "attention.sliding_window", "attention.sliding_window_pattern", "attn_logit_softcapping",
    "final_logit_softcapping", "rope.freq_base_swa",
}  # fmt: skip


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta)
    table.update(gemma_parts(meta, table, scale_layers=46, period=2, local_default=None))
    table["sliding_window"] = meta.int("attention.sliding_window", 4096)
    table["attn_softcap"] = meta.float("attn_logit_softcapping", 50.0)
    table["final_softcap"] = meta.float("final_logit_softcapping", 30.0)
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored; norms as stored)."""
    return block_parts(config, header)
