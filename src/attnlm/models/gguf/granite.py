"""GGUF architecture ``granite`` (IBM Granite 3.x) -> our Llama with Granite's four multipliers.

Granite is Llama's layout (:mod:`.llama`: the same tensors, q and k rows in llama.cpp's
interleaved rotary order) with four scalars, as llama.cpp's ``granite`` graph applies them:

=========================================  ===========================================
``granite.embedding_scale``                ``embed_scale``: the embeddings times it
``granite.attention.scale``                ``attn_scale``: the score scale (absent: 1/sqrt(D))
``granite.residual_scale``                 ``residual_scale``: each sublayer's output times
                                           it before the residual add
``granite.logit_scale``                    ``logit_scale``: the logits divided by it (needed)
=========================================  ===========================================

A value of 1 (or an absent optional key) is the plain Llama's part: left out of the config.
Granite's mixtures of experts (``granitemoe``) and hybrids (``granitehybrid``) are other
architectures, refused.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import BASE_KEYS, Meta, base_table, block_parts
from attnlm.models.gguf.parts import Part

ARCH = "granite"
SCALES = ("embedding_scale", "attention.scale", "residual_scale", "logit_scale")
READ = BASE_KEYS | set(SCALES)


def _scale(meta: Meta, key: str) -> float | None:
    """A positive multiplier (None where absent or 1), else InputError naming the key
    (``logit_scale`` must be there: llama.cpp's granite graph requires it)."""
    if not meta.has(key) and key != "logit_scale":
        return None
    value = meta.float(key, what="missing or not a positive number")
    return None if value == 1.0 else value


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta)
    fields = ("embed_scale", "attn_scale", "residual_scale", "logit_scale")
    for field, key in zip(fields, SCALES, strict=True):
        value = _scale(meta, key)
        if value is not None:
            table[field] = value
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (llama.cpp's NORM rotary: q and k rows back from its order)."""
    return block_parts(config, header, permuted=True)
