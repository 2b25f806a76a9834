"""GGUF architecture ``gemma3`` (Gemma 3 text models: 270M, 1B; the text tower of the larger
ones) -> our Llama with Gemma's parts and per-head q/k norms.

Metadata (``gemma3.`` keys) as for :mod:`.llama` (:func:`~.common.base_table`; the head
width is ``attention.key_length``), plus, each as llama.cpp's ``gemma3`` reads it:

==========================================  ================================================
``attention.sliding_window``                ``sliding_window``; absent or 0: no sliding
                                            layer (every layer global, one rotary base)
``attention.sliding_window_pattern``        ``layer_types`` (absent: period 6: layers
                                            5, 11, ... are global, the others slide)
``rope.freq_base_swa``                      ``rope_local_theta`` of the sliding layers
                                            (absent: 10000, llama.cpp's default)
``rope.freq_base``                          ``rope_theta`` of the global layers
``rope.scaling.type`` = ``linear``          ``rope_scaling`` linear with
``rope.scaling.factor``                     ``rope.scaling.factor``: global layers only
``final_logit_softcapping``                 ``final_softcap`` (absent or 0: none)
==========================================  ================================================

Fixed by the architecture: ``embed_scale`` = ``sqrtf(n_embd)`` (float32), GeGLU, ``post_norms``,
``qk_norm``, and the score scale ``1/sqrt(D)``, except for the 62-layer model (27B) where
llama.cpp takes ``1/sqrt(n_embd / n_head)``. Vision towers are separate files (mmproj) and
never reach this module.

Tensors as :mod:`.gemma2`'s plus ``blk.N.attn_q_norm`` / ``attn_k_norm`` (``(D,)``, stored as
``1 + w`` like every Gemma norm, loaded as stored). NEOX rotary: rows as stored.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import BASE_KEYS, Meta, base_table, block_parts, gemma_parts
from attnlm.models.gguf.parts import Part

ARCH = "gemma3"
READ = BASE_KEYS | {
    "attention.sliding_window", "attention.sliding_window_pattern", "final_logit_softcapping",
    "rope.freq_base_swa", "rope.scaling.factor",
}  # fmt: skip


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, scalings=("linear",))
    window = meta.int("attention.sliding_window", 0, zero=True)
    if window:
        table.update(gemma_parts(meta, table, scale_layers=62, period=6, local_default=10000.0))
        table["sliding_window"] = window
    else:
        table.update(gemma_parts(meta, table, scale_layers=62, period=None, local_default=None))
    table["qk_norm"] = True
    cap = meta.get("final_logit_softcapping", 0.0)
    if cap:
        table["final_softcap"] = meta.float("final_logit_softcapping")
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored; norms as stored)."""
    return block_parts(config, header)
