"""GGUF architecture ``smollm3`` (SmolLM3-3B) -> our Llama with layers without positions.

SmolLM3 is Llama's layout (:mod:`.llama`: the same ``smollm3.`` keys, q and k rows in
llama.cpp's interleaved rotary order, a tied head) whose every fourth layer (3, 7, 11, ...)
rotates neither q nor k: NoPE (Kazemnejad et al., 2023), ``nope_layers`` in our config.
llama.cpp's converter writes no key for those layers, and its ``smollm3`` graph places them
every fourth layer whatever the source model's ``no_rope_layers`` said (every released
SmolLM3 has them there), and so do we.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import BASE_KEYS, Meta, base_table, block_parts
from attnlm.models.gguf.parts import Part

ARCH = "smollm3"
READ = BASE_KEYS
#: llama.cpp's smollm3 graph: layer i has no positions when (i + 1) is a multiple of this
NOPE_STEP = 4


def nope_layers(n_layer: int) -> list[int]:
    """The layers llama.cpp's ``smollm3`` graph leaves unrotated: every :data:`NOPE_STEP`-th."""
    return [i for i in range(n_layer) if (i + 1) % NOPE_STEP == 0]


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, free_head=False)
    layers = nope_layers(table["n_layer"])
    if layers:
        table["nope_layers"] = layers
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (llama.cpp's NORM rotary: q and k rows back from its order)."""
    return block_parts(config, header, permuted=True)
