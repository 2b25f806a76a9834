"""GGUF architecture ``gpt2`` -> our GPT (:mod:`attnlm.models.gpt`) with GPT-2's settings
(learned positions, pre-norm LayerNorm with biases, GELU with the tanh approximation).

Metadata (``gpt2.`` keys): ``block_count`` -> ``n_layer``, ``embedding_length`` -> ``n_embd``,
``feed_forward_length`` -> ``d_ff``, ``attention.head_count`` -> ``n_head``,
``attention.layer_norm_epsilon`` -> ``layer_norm_eps``, ``context_length`` -> ``block_size``
(and the rows of ``position_embd``); any other ``gpt2.`` key is refused naming it.

Tensors: ``token_embd``, ``position_embd``, ``blk.N.attn_norm``, ``blk.N.attn_qkv`` (already our
fused ``(3C, C)``: llama.cpp's converter transposes GPT-2's ``Conv1D`` weights to the
``nn.Linear`` layout), ``blk.N.attn_output``, ``blk.N.ffn_norm``, ``blk.N.ffn_up``,
``blk.N.ffn_down`` (each with ``.weight`` and ``.bias``), ``output_norm``, and ``output``
(absent, or a copy of the embedding, when tied; older converters always wrote the copy).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.llama import vocab_size
from attnlm.models.gguf.parts import Part, check_block_count

ARCH = "gpt2"
READ = {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.layer_norm_epsilon", "context_length", "vocab_size"}  # fmt: skip


def _int(header: GGUFFile, key: str) -> int:
    value = header.get(f"{ARCH}.{key}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise InputError(f"{header.path}: {ARCH}.{key} is missing or not a positive integer")
    return int(value)


def tied(header: GGUFFile) -> bool:
    """Whether the LM head is the embedding: no ``output.weight``, or one with the same bytes."""
    out = header.tensors.get("output.weight")
    if out is None:
        return True
    emb = header.tensors.get("token_embd.weight")
    if emb is None or (out.type, out.shape) != (emb.type, emb.shape):
        return False
    return bool(np.array_equal(header.raw(out), header.raw(emb)))


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our GPT for this file."""
    for key in header:
        if key.startswith(f"{ARCH}.") and key[len(ARCH) + 1 :] not in READ:
            raise InputError(f"{header.path}: metadata key {key} is not supported")
    eps = header.get(f"{ARCH}.attention.layer_norm_epsilon")
    if not isinstance(eps, float) or not 0 < eps < math.inf:
        raise InputError(f"{header.path}: {ARCH}.attention.layer_norm_epsilon is missing")
    check_block_count(header, f"{ARCH}.block_count", _int(header, "block_count"))
    return {
        "type": "gpt",
        "vocab_size": vocab_size(header, ARCH),
        "block_size": _int(header, "context_length"),
        "n_layer": _int(header, "block_count"),
        "n_head": _int(header, "attention.head_count"),
        "n_embd": _int(header, "embedding_length"),
        "d_ff": _int(header, "feed_forward_length"),
        "positions": "learned",
        "norm": "pre",
        "bias": True,
        "activation": "gelu_tanh",
        "tie_embeddings": tied(header),
        "layer_norm_eps": float(str(np.float32(eps))),
    }


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor of the file goes in our GPT (a tied copy of the embedding is read
    as the LM head's source only when untied)."""
    both = ("weight", "bias")
    out = [Part("token_embd.weight", "tok_emb.weight"),
           Part("position_embd.weight", "pos_emb.weight")]  # fmt: skip
    out += [Part(f"output_norm.{p}", f"ln_f.{p}") for p in both]
    if not config.tie_embeddings:
        out.append(Part("output.weight", "lm_head.weight"))
    elif "output.weight" in header.tensors:
        out.append(Part("output.weight", ""))  # the embedding's bytes again: nothing to load
    names = {"attn_norm": "ln_1", "attn_qkv": "attn.qkv_proj", "attn_output": "attn.out_proj",
             "ffn_norm": "ln_2", "ffn_up": "mlp.fc", "ffn_down": "mlp.proj"}  # fmt: skip
    for i in range(config.n_layer):
        out += [Part(f"blk.{i}.{g}.{p}", f"blocks.{i}.{o}.{p}") for g, o in names.items()
                for p in both]  # fmt: skip
    return out
