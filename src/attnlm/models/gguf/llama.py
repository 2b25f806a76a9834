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
the head width; a rotary scaling other than ``none``, a sliding window, experts or any other
``llama.`` key are refused naming the key (nothing is guessed). Llama 3.1's frequency scaling is
stored as a ``rope_freqs`` tensor without its parameters, so it is refused too.

Tensors: ``token_embd``, ``blk.N.attn_norm``, ``blk.N.attn_q/k/v`` (fused into our
``qkv_proj``; q and k rows back from llama.cpp's interleaved rotary order, see
:func:`~attnlm.models.gguf.loader.unpermute_rows`), ``blk.N.attn_output``, ``blk.N.ffn_norm``,
``blk.N.ffn_gate/up`` (fused into ``mlp.fc``), ``blk.N.ffn_down``, ``output_norm``, ``output``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.parts import Part, check_block_count

ARCH = "llama"
# keys read into the config, and keys that carry nothing we need (checked where noted)
READ = {
    "block_count", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "context_length", "vocab_size", "rope.dimension_count", "attention.key_length",
    "attention.value_length", "rope.scaling.type",
}  # fmt: skip


def _float32(value: Any) -> float:
    """A float32 from the file as its shortest decimal (``1e-05``, not ``9.99999974e-06``)."""
    return float(str(np.float32(value)))


def _int(header: GGUFFile, key: str, default: int | None = None) -> int:
    full = f"{ARCH}.{key}"
    value = header.get(full, default)
    if value is None:
        raise InputError(f"{header.path}: the GGUF metadata has no {full}")
    if isinstance(value, (list, np.ndarray)):
        raise InputError(f"{header.path}: {full} is a per-layer list, which is not supported")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise InputError(f"{header.path}: {full} must be a positive integer, got {value!r}")
    return int(value)


def _check_keys(header: GGUFFile, head_dim: int) -> None:
    where = header.path
    for key in header:
        if key.startswith(f"{ARCH}.") and key[len(ARCH) + 1 :] not in READ:
            raise InputError(f"{where}: metadata key {key} is not supported")
    scaling = header.get(f"{ARCH}.rope.scaling.type", "none")
    if scaling != "none":
        raise InputError(f"{where}: {ARCH}.rope.scaling.type {scaling!r} is not supported (none)")
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if f"{ARCH}.{key}" in header and _int(header, key) != head_dim:
            raise InputError(
                f"{where}: {ARCH}.{key} = {header.get(f'{ARCH}.{key}')} differs from the head "
                f"width {head_dim} (not supported)"
            )
    if "rope_freqs.weight" in header.tensors:
        raise InputError(
            f"{where}: tensor 'rope_freqs.weight' (Llama 3.1 rotary frequency scaling) is not "
            "supported: the file does not carry the scaling's parameters"
        )


def vocab_size(header: GGUFFile, arch: str = ARCH) -> int:
    """Rows of ``token_embd``, checked against the token list and ``<arch>.vocab_size``."""
    info = header.tensors.get("token_embd.weight")
    if info is None or len(info.shape) != 2:
        raise InputError(f"{header.path}: tensor 'token_embd.weight' is missing or not 2-D")
    rows = info.shape[0]
    tokens = header.get("tokenizer.ggml.tokens")
    for what, n in (("tokenizer.ggml.tokens", len(tokens) if tokens is not None else None),
                    (f"{arch}.vocab_size", header.get(f"{arch}.vocab_size"))):  # fmt: skip
        if n is not None and n != rows:
            raise InputError(
                f"{header.path}: {what} gives {n} tokens but token_embd.weight has {rows} rows"
            )
    return rows


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    n_embd, n_head = _int(header, "embedding_length"), _int(header, "attention.head_count")
    if n_embd % n_head:
        raise InputError(
            f"{header.path}: {ARCH}.embedding_length {n_embd} is not a multiple of "
            f"{ARCH}.attention.head_count {n_head}"
        )
    _check_keys(header, n_embd // n_head)
    eps = header.get(f"{ARCH}.attention.layer_norm_rms_epsilon")
    if not isinstance(eps, float) or not 0 < eps < math.inf:
        raise InputError(
            f"{header.path}: {ARCH}.attention.layer_norm_rms_epsilon is missing or invalid"
        )
    theta = header.get(f"{ARCH}.rope.freq_base", 10000.0)
    if not isinstance(theta, float) or not 0 < theta < math.inf:
        raise InputError(f"{header.path}: {ARCH}.rope.freq_base {theta!r} is invalid")
    n_kv_head = _int(header, "attention.head_count_kv", n_head)
    if n_head % n_kv_head:
        raise InputError(
            f"{header.path}: {ARCH}.attention.head_count_kv {n_kv_head} does not divide "
            f"{ARCH}.attention.head_count {n_head}"
        )
    n_layer = _int(header, "block_count")
    check_block_count(header, f"{ARCH}.block_count", n_layer)
    return {
        "type": "llama",
        "vocab_size": vocab_size(header),
        "block_size": _context(header),
        "n_layer": n_layer,
        "n_head": n_head,
        "n_kv_head": n_kv_head,
        "n_embd": n_embd,
        "d_ff": _int(header, "feed_forward_length"),
        "rope_theta": _float32(theta),
        "rms_norm_eps": _float32(eps),
        "tie_embeddings": "output.weight" not in header.tensors,
        "bos_id": _token_id(header, "bos"),
        "eos_id": _token_id(header, "eos"),
    }


#: the longest context a file may declare (2^27 tokens, ten times the longest of today's models:
#: the model's position limits are sized from it)
MAX_CONTEXT = 1 << 27


def _context(header: GGUFFile) -> int:
    n = _int(header, "context_length")
    if n > MAX_CONTEXT:
        raise InputError(
            f"{header.path}: {ARCH}.context_length {n:,} is beyond any model's (at most "
            f"{MAX_CONTEXT:,})"
        )
    return n


def _token_id(header: GGUFFile, which: str) -> int | None:
    value = header.get(f"tokenizer.ggml.{which}_token_id")
    return int(value) if isinstance(value, (int, np.integer)) else None


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor of the file goes in our Llama, with the shape the config implies
    (checked by :func:`~attnlm.models.gguf.parts.check_parts` before the C engine or the
    PyTorch loader reads a byte)."""
    c, kv, f = config.n_embd, config.n_kv_head * config.head_dim, config.ffn_width
    v = config.vocab_size
    out = [Part("token_embd.weight", "tok_emb.weight", shape=(v, c)),
           Part("output_norm.weight", "ln_f.weight", shape=(c,))]  # fmt: skip
    if not config.tie_embeddings:
        out.append(Part("output.weight", "lm_head.weight", shape=(v, c)))
    for i in range(config.n_layer):
        blk, ours = f"blk.{i}.", f"blocks.{i}."
        qkv, fc = ours + "attn.qkv_proj.weight", ours + "mlp.fc.weight"
        out += [
            Part(blk + "attn_norm.weight", ours + "ln_1.weight", shape=(c,)),
            Part(blk + "attn_q.weight", qkv, (0, c), heads=config.n_head, shape=(c, c)),
            Part(blk + "attn_k.weight", qkv, (c, c + kv), heads=config.n_kv_head, shape=(kv, c)),
            Part(blk + "attn_v.weight", qkv, (c + kv, c + 2 * kv), shape=(kv, c)),
            Part(blk + "attn_output.weight", ours + "attn.out_proj.weight", shape=(c, c)),
            Part(blk + "ffn_norm.weight", ours + "ln_2.weight", shape=(c,)),
            Part(blk + "ffn_gate.weight", fc, (0, f), shape=(f, c)),
            Part(blk + "ffn_up.weight", fc, (f, 2 * f), shape=(f, c)),
            Part(blk + "ffn_down.weight", ours + "mlp.proj.weight", shape=(c, f)),
        ]
    return out
