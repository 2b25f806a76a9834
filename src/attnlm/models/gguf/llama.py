"""GGUF architecture ``llama`` (Llama 2 and 3, SmolLM, TinyLlama, Mistral without a sliding
window) -> our Llama (:mod:`attnlm.models.llama`).

Metadata (``llama.`` keys, as llama.cpp's converter writes them) -> ``LlamaConfig``:

=========================================  ===========================================
``block_count``                            ``n_layer``
``embedding_length``                       ``n_embd``
``feed_forward_length``                    ``d_ff``
``attention.head_count``                   ``n_head``
``attention.head_count_kv``                ``n_kv_head`` (absent: ``n_head``)
``attention.layer_norm_rms_epsilon``       ``rms_norm_eps``
``rope.freq_base``                         ``rope_theta`` (absent: 10000, llama.cpp's default)
``context_length``                         ``block_size``
``tokenizer.ggml.tokens`` (its length)     ``vocab_size`` (also ``llama.vocab_size``)
no ``output.weight`` tensor                ``tie_embeddings``
``tokenizer.ggml.bos/eos_token_id``        ``bos_id`` / ``eos_id``
=========================================  ===========================================

``rope.dimension_count``, ``attention.key_length`` and ``attention.value_length`` must equal
the head width; a rotary scaling other than ``none``, a sliding window or any other
``llama.`` key are refused naming the key (nothing is guessed). Llama 3.1's frequency scaling
(Llama 3.1, 3.2, 3.3) is stored as a ``rope_freqs`` tensor of one factor per rotary pair,
without its parameters: the scaling whose factors it holds, every one within float32
rounding, becomes ``rope_scaling`` (:func:`~.common.llama3_scaling`); other factors are refused.

The readers are shared with the other members of the family (:mod:`.common`). The head width
is ``attention.key_length`` where the file has it (Mistral Nemo and Mistral Small 3: 128 with
``n_embd / n_head`` = 160), else ``n_embd / n_head``.

Tensors: ``token_embd``, ``blk.N.attn_norm``, ``blk.N.attn_q/k/v`` (fused into our
``qkv_proj``; q and k rows back from llama.cpp's interleaved rotary order, see
:func:`~attnlm.models.gguf.loader.unpermute_rows`), ``blk.N.attn_output``, ``blk.N.ffn_norm``,
``blk.N.ffn_gate/up`` (fused into ``mlp.fc``), ``blk.N.ffn_down``, ``output_norm``, ``output``.

Mixtral is this architecture with a mixture of experts: ``expert_count`` and
``expert_used_count`` (:func:`~.common.moe_fields`; each expert ``feed_forward_length``
wide, the label ``mixtral``), the router ``blk.N.ffn_gate_inp`` and the stacked experts
``blk.N.ffn_{gate,up,down}_exps`` in place of the feed-forward (:func:`~.common.expert_parts`).
"""

from __future__ import annotations

from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import (
    BASE_KEYS,
    MAX_CONTEXT,
    MOE_KEYS,
    Meta,
    base_table,
    block_parts,
    moe_fields,
)
from attnlm.models.gguf.common import vocab_size as _vocab_size
from attnlm.models.gguf.parts import Part

__all__ = ["ARCH", "MAX_CONTEXT", "READ", "config_table", "parts", "vocab_size"]

ARCH = "llama"
#: keys read into the config, and keys that carry nothing we need (checked where noted)
READ = BASE_KEYS | MOE_KEYS


def vocab_size(header: GGUFFile, arch: str = ARCH) -> int:
    """Rows of ``token_embd``, checked against the token list and ``<arch>.vocab_size``."""
    return _vocab_size(header, arch)


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta)
    del table["arch"]  # the default: a plain Llama's table stays as it was
    experts = moe_fields(meta, table)
    if experts:  # Mixtral: llama's layers with a mixture of experts
        table.update(experts, arch="mixtral")
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor of the file goes in our Llama, with the shape the config implies
    (checked by :func:`~attnlm.models.gguf.parts.check_parts` before the C engine or the
    PyTorch loader reads a byte); q and k rows back from llama.cpp's interleaved order."""
    return block_parts(config, header, permuted=True)
