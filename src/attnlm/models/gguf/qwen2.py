"""GGUF architecture ``qwen2`` (Qwen2, Qwen2.5, Qwen2.5-Coder) -> our Llama with q/k/v biases.

Metadata (``qwen2.`` keys) as for :mod:`.llama` (:func:`~.common.base_table`): the head width
is ``attention.key_length`` where the file has it; ``rope.scaling.type`` ``none``,
``linear`` (``rope.scaling.factor``) or ``yarn`` (:func:`~.common.yarn_scaling`); any other
``qwen2.`` key is refused naming it. llama.cpp's ``qwen2`` graph has no sliding window (the
converter writes none), and neither do we.

Tensors as :mod:`.llama`'s, read as stored: llama.cpp runs ``qwen2`` with NEOX rotary pairs
``(i, i + D/2)``, ours, so q and k rows are not permuted. ``blk.N.attn_q/k/v.bias`` (present
in block 0: ``qkv_bias``, then required in every block) fill the bias of our fused
``qkv_proj``; ``output.weight`` absent: tied head.
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

ARCH = "qwen2"
READ = BASE_KEYS | YARN_KEYS


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    table = base_table(Meta(header, ARCH, READ), scalings=("linear", "yarn"))
    table["qkv_bias"] = has_tensor(header, "attn_q.bias")
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored)."""
    return block_parts(config, header)
