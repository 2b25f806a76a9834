"""GGUF architecture ``olmo2`` (AllenAI OLMo 2) -> our Llama without pre-norms.

OLMo 2 keeps Llama's tensors and keys but moves the norms: no ``attn_norm`` or ``ffn_norm``
before the sublayers; ``post_attention_norm`` and ``post_ffw_norm`` normalise their outputs
before each residual add (``pre_norms = false``, ``post_norms``); and ``attn_q_norm``
``(H D,)`` / ``attn_k_norm`` ``(Hkv D,)`` normalise all heads' q and k at once, before the
rotation (``qk_norm_all``). The rotation is NEOX's (rows as stored), the heads ``n_embd /
n_head`` wide.

OLMo 3 (llama.cpp writes it as ``olmo2``) adds sliding windows: ``attention.sliding_window``
and ``attention.sliding_window_pattern`` (absent: every fourth layer global), the sliding
layers rotated by the global base without the rotary scaling (llama.cpp's ``olmo2`` graph
passes them no scale: ``rope_local_theta`` is the global base; a different
``rope.freq_base_swa`` is refused, since that graph does not read it). The rotary scaling,
``linear`` or YaRN (:func:`~.common.yarn_scaling`: OLMo 3's long-context files), is the
global layers' (every layer's without windows).
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
    swa_pattern,
)
from attnlm.models.gguf.parts import Part

ARCH = "olmo2"
READ = BASE_KEYS | YARN_KEYS | {"attention.sliding_window", "attention.sliding_window_pattern",
                               "rope.freq_base_swa"}  # fmt: skip


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, free_head=False, scalings=("linear", "yarn"))
    table.update(pre_norms=False, post_norms=True, qk_norm=True, qk_norm_all=True)
    window = meta.int("attention.sliding_window", 0, zero=True)
    if window:  # OLMo 3
        theta = table["rope_theta"]
        if meta.float("rope.freq_base_swa", theta) != theta:
            meta.refuse("rope.freq_base_swa", f"not the global base {theta:g} (llama.cpp's "
                        f"olmo2 graph rotates the sliding layers by that)")  # fmt: skip
        table.update(arch="olmo3", sliding_window=window, rope_local_theta=theta,
                     layer_types=list(swa_pattern(meta, table["n_layer"], 4)))  # fmt: skip
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored)."""
    return block_parts(config, header)
