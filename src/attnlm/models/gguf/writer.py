"""Our Llama and GPT -> a GGUF file llama.cpp runs (``general.architecture`` ``llama`` /
``gpt2``): the inverse of :mod:`.llama` and :mod:`.gpt2`, laid out as llama.cpp's converter
(``convert_hf_to_gguf.py``) lays out a Hugging Face model.

* Metadata: ``<arch>.context_length`` (``block_size``), ``embedding_length``, ``block_count``,
  ``feed_forward_length``, ``attention.head_count`` (and ``head_count_kv``,
  ``rope.freq_base``, ``rope.dimension_count``, ``attention.layer_norm_rms_epsilon`` for
  llama; ``attention.layer_norm_epsilon`` for gpt2), ``vocab_size``, ``general.file_type``,
  and the tokenizer (:mod:`.vocab`).
* Tensors: our fused ``qkv_proj`` is split into ``attn_q/k/v`` for llama, whose q and k rows
  go to llama.cpp's interleaved rotary order (:func:`~attnlm.models.gguf.parts.permute_rows`,
  the inverse of the loader's :func:`~attnlm.models.gguf.parts.unpermute_rows`); ``mlp.fc`` is
  split into
  ``ffn_gate/up``. gpt2's fused ``attn_qkv`` is stored as is. A tied LM head is not stored
  (llama.cpp then uses ``token_embd``); a GPT without biases gets zero biases, which
  llama.cpp's gpt2 graph requires.
* A mixture of experts (``qwen3moe``; Mixtral as ``llama``) gets ``expert_count``,
  ``expert_used_count`` (and ``expert_feed_forward_length``), its router ``ffn_gate_inp`` and
  its experts stacked into ``ffn_{gate,up,down}_exps`` (:func:`_experts`).
* Types: 1-D tensors (norms, biases) and a router stay F32 as in llama.cpp's converter;
  matrices take ``--type`` (F32, F16, Q8_0, Q4_0: :func:`encode`, with llama.cpp's reference
  quantizers from :mod:`attnlm.quant.blocks`). A matrix whose rows are not a multiple of 32
  long cannot be cut into Q8_0 / Q4_0 blocks and is stored F16 instead (the converter's
  fallback).

The file is written through ``gguf.GGUFWriter`` (the format's reference writer) into a
temporary file renamed into place (:func:`attnlm.base.fileio.atomic_path`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlm.base.errors import InputError
from attnlm.models.gguf.common import (
    FACTORS_ARCHS,
    LONGROPE,
    LONGROPE_ARCHS,
    PERMUTED,
    ROPE_FREQS,
    llama3_factors,
)
from attnlm.models.gguf.parts import permute_rows
from attnlm.quant.blocks import GROUP, quantize_q4_0, quantize_q8_0

#: llama.cpp's ``general.file_type`` (``llama_ftype``) per --type
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}


def encode(x: Tensor, kind: str) -> np.ndarray:
    """``x`` ``(rows, cols)`` or ``(n,)`` stored as ``kind`` (``f32``, ``f16``, ``q8_0``,
    ``q4_0``): the floats, or the blocks' bytes ``(rows, bytes per row)``, a GGUF file holds."""
    a = x.detach().to(torch.float32).contiguous().numpy()
    if kind == "f32":
        return a
    if kind == "f16":
        return a.astype(np.float16)
    return {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}[kind](a)


def _need(config: Any, field: str, want: Any, arch: str) -> None:
    have = getattr(config, field)
    if have != want:
        raise InputError(
            f"model.{field} = {have!r} cannot be exported to GGUF {arch} (llama.cpp's {arch} "
            f"needs {want!r})"
        )


#: our Llama config's ``arch`` -> the GGUF architecture written (Mistral: llama.cpp's converter
#: writes ``llama``, without a window)
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "phi3": "phi3", "gemma2": "gemma2", "gemma3": "gemma3", "qwen3moe": "qwen3moe",
             "mixtral": "llama", "smollm3": "smollm3", "granite": "granite",
             "olmo2": "olmo2", "olmo3": "olmo2", "gptoss": "gpt-oss"}  # fmt: skip


#: the GGUF architectures whose adapters read YaRN (:func:`~.common.yarn_scaling`)
YARN_ARCHS = ("qwen2", "qwen3", "qwen3moe", "olmo2", "gpt-oss")


def _yarn_meta(scaling: dict[str, Any]) -> dict[str, Any]:
    """YaRN's keys as llama.cpp's converter writes them; betas other than 32 and 1, which
    llama.cpp's graphs of these architectures do not read, are refused."""
    from attnlm.nn.yarn import yarn_mscale

    for key, value in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        if scaling.get(key, value) != value:
            raise InputError(f"model.rope_scaling.{key} = {scaling[key]!r} cannot be exported "
                             f"to GGUF (llama.cpp takes {value:g})")  # fmt: skip
    factor = float(scaling["factor"])
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": factor,
            "rope.scaling.original_context_length": int(
                scaling["original_max_position_embeddings"])}  # fmt: skip
    extra = scaling.get("attention_factor", yarn_mscale(factor)) / yarn_mscale(factor)
    if abs(extra - 1.0) > 1e-6:
        meta["rope.scaling.attn_factor"] = float(extra)
    return meta


def _llama_meta(c: Any, arch: str) -> dict[str, Any]:
    """The ``<arch>.`` keys of a Llama-family config, as llama.cpp's converter writes them."""
    hd = c.head_dim
    meta = {
        "context_length": c.block_size, "embedding_length": c.n_embd, "block_count": c.n_layer,
        "feed_forward_length": c.ffn_width, "attention.head_count": c.n_head,
        "attention.head_count_kv": c.n_kv_head, "rope.freq_base": float(c.rope_theta),
        "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
    }  # fmt: skip
    if c.n_expert is not None:  # a mixture of experts (Mixtral: llama with experts)
        meta["expert_count"], meta["expert_used_count"] = c.n_expert, c.n_expert_used
        if arch != "llama":
            meta["expert_feed_forward_length"] = c.ffn_width
    if c.rotary_dim is not None and arch != "phi3":
        raise InputError(f"model.rotary_dim = {c.rotary_dim} cannot be exported to GGUF {arch} "
                         f"(partial rotary: phi3 files only)")  # fmt: skip
    if arch in (*PERMUTED, "phi3"):
        meta["rope.dimension_count"] = c.rotary_width
    if arch == "granite":  # its four multipliers, as llama.cpp's converter writes them
        meta["attention.scale"] = float(c.attn_scale or hd**-0.5)
        meta["embedding_scale"] = float(c.embed_scale or 1.0)
        meta["residual_scale"] = float(c.residual_scale or 1.0)
        meta["logit_scale"] = float(c.logit_scale or 1.0)
    if arch in PERMUTED:
        meta["vocab_size"] = c.vocab_size
    if arch not in PERMUTED or hd * c.n_head != c.n_embd:  # (Mistral Nemo: a head of its own)
        meta["attention.key_length"] = meta["attention.value_length"] = hd
    if (c.rope_scaling or {}).get("rope_type") == "yarn" and arch in YARN_ARCHS:
        meta.update(_yarn_meta(c.rope_scaling))
    elif _longrope(c, arch):
        meta.update(_longrope_meta(c))
    elif c.rope_scaling and not _llama3(c, arch):  # (Llama 3.1's is a tensor: _llama)
        if c.rope_scaling.get("rope_type") != "linear" or arch in (*PERMUTED, "phi3", "gemma2"):
            raise InputError(
                f"model.rope_scaling {c.rope_scaling.get('rope_type')!r} cannot be exported to "
                f"GGUF {arch} (not supported)"
            )
        meta["rope.scaling.type"] = "linear"
        meta["rope.scaling.factor"] = float(c.rope_scaling["factor"])
    if arch == "olmo2" and "sliding_attention" in c.layer_kinds:  # OLMo 3, as the converter
        if c.rope_local_theta != c.rope_theta:
            raise InputError(f"model.rope_local_theta = {c.rope_local_theta!r} cannot be "
                             f"exported to GGUF olmo2 (its sliding layers turn by the global "
                             f"base)")  # fmt: skip
        meta["attention.sliding_window"] = c.sliding_window
        meta["attention.sliding_window_pattern"] = [k != "full_attention" for k in c.layer_kinds]
    if arch == "gpt-oss" and "sliding_attention" in c.layer_kinds:  # (default: even layers)
        meta["attention.sliding_window"] = c.sliding_window
        if list(c.layer_kinds) != [("sliding_attention", "full_attention")[i % 2]
                                   for i in range(c.n_layer)]:  # fmt: skip
            meta["attention.sliding_window_pattern"] = [k != "full_attention"
                                                        for k in c.layer_kinds]  # fmt: skip
    if arch.startswith("gemma"):
        kinds = c.layer_kinds
        if "sliding_attention" in kinds:
            meta["attention.sliding_window"] = c.sliding_window
            period = 2 if arch == "gemma2" else 6
            if list(kinds) != [("sliding_attention", "full_attention")[i % period == period - 1]
                               for i in range(c.n_layer)]:  # fmt: skip
                meta["attention.sliding_window_pattern"] = [k != "full_attention" for k in kinds]
            if c.rope_local_theta is not None:
                meta["rope.freq_base_swa"] = float(c.rope_local_theta)
        if c.attn_softcap is not None:
            meta["attn_logit_softcapping"] = float(c.attn_softcap)
        if c.final_softcap is not None:
            meta["final_logit_softcapping"] = float(c.final_softcap)
    return meta


def _longrope(c: Any, arch: str) -> bool:
    """Whether ``c`` has LongRoPE in a file that holds it (Phi-3's: two factor tensors)."""
    return arch in LONGROPE_ARCHS and (c.rope_scaling or {}).get("rope_type") == "longrope"


def _longrope_meta(c: Any) -> dict[str, Any]:
    """LongRoPE's keys as llama.cpp's converter writes them: the original context and the
    scale of cos and sin (llama.cpp reads no context factor: it must be the file's context over
    the original one, as the converter takes it)."""
    from attnlm.nn.yarn import longrope_scale

    scaling = c.rope_scaling
    n, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    if abs(factor - c.block_size / n) > 1e-9 * factor:
        raise InputError(f"model.rope_scaling.factor = {factor!r} cannot be exported to GGUF "
                         f"(it must be model.block_size / the original context = "
                         f"{c.block_size / n:g})")  # fmt: skip
    scale = longrope_scale(factor, n, scaling.get("attention_factor"))
    return {"rope.scaling.original_context_length": int(n), "rope.scaling.attn_factor": scale}


def _llama3(c: Any, arch: str) -> bool:
    """Whether ``c`` has Llama 3.1's rotary scaling in a file that holds it: llama.cpp's
    converter writes it as the :data:`~.common.ROPE_FREQS` tensor
    (:func:`~.common.llama3_factors`)."""
    return arch in FACTORS_ARCHS and (c.rope_scaling or {}).get("rope_type") == "llama3"


def _llama(model: Any) -> tuple[str, dict[str, Any], dict[str, Tensor]]:
    """A Llama-family model -> its GGUF architecture, keys and tensors; the written file is
    read back and must give the same config (:func:`export_gguf`), so a part the architecture
    cannot carry is refused there, naming the field."""
    c = model.config
    arch = GGUF_ARCH[c.arch]
    n, kv, f = c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.ffn_width
    sd = model.state_dict()
    permute = arch in PERMUTED  # llama.cpp's NORM rotary; every other architecture is NEOX
    meta = _llama_meta(c, arch)
    t = {"token_embd.weight": sd["tok_emb.weight"], "output_norm.weight": sd["ln_f.weight"]}
    if not c.tie_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    if _llama3(c, arch):
        factors = llama3_factors(c.rope_theta, c.head_dim, c.rope_scaling)
        t[ROPE_FREQS] = torch.from_numpy(factors)
    if _longrope(c, arch):
        for name, key in zip(LONGROPE, ("short_factor", "long_factor"), strict=True):
            t[name] = torch.tensor(c.rope_scaling[key], dtype=torch.float32)
    for i in range(c.n_layer):
        b, o = f"blk.{i}.", f"blocks.{i}."
        qkv = sd[o + "attn.qkv_proj.weight"]
        bias = sd.get(o + "attn.qkv_proj.bias")
        if c.pre_norms:  # (OLMo 2 has none)
            t[b + "attn_norm.weight"] = sd[o + "ln_1.weight"]
        if arch == "phi3":
            t[b + "attn_qkv.weight"] = qkv
        else:
            q, k = qkv[:n], qkv[n : n + kv]
            t[b + "attn_q.weight"] = permute_rows(q, c.n_head) if permute else q
            t[b + "attn_k.weight"] = permute_rows(k, c.n_kv_head) if permute else k
            t[b + "attn_v.weight"] = qkv[n + kv : n + 2 * kv]
            if bias is not None and not permute:
                for name, rows in (("q", (0, n)), ("k", (n, n + kv)), ("v", (n + kv, n + 2 * kv))):
                    t[f"{b}attn_{name}.bias"] = bias[rows[0] : rows[1]]
        t[b + "attn_output.weight"] = sd[o + "attn.out_proj.weight"]
        for x in ("q", "k") if c.qk_norm else ():
            t[f"{b}attn_{x}_norm.weight"] = sd[f"{o}attn.{x}_norm.weight"]
        if c.pre_norms:  # (gpt-oss's is named for transformers' post_attention_layernorm)
            norm = "post_attention_norm" if arch == "gpt-oss" else "ffn_norm"
            t[f"{b}{norm}.weight"] = sd[o + "ln_2.weight"]
        if c.attn_out_bias:
            t[b + "attn_output.bias"] = sd[o + "attn.out_proj.bias"]
        if c.attn_sinks:
            t[b + "attn_sinks.weight"] = sd[o + "attn.sinks"]
        if c.n_expert is not None:
            t.update(_experts(sd, b, o, c.n_expert, f))
        else:
            fc = sd[o + "mlp.fc.weight"]
            if arch == "phi3":
                t[b + "ffn_up.weight"] = fc
            else:
                t[b + "ffn_gate.weight"] = fc[:f]
                t[b + "ffn_up.weight"] = fc[f : 2 * f]
            t[b + "ffn_down.weight"] = sd[o + "mlp.proj.weight"]
        if c.post_norms:
            t[b + "post_attention_norm.weight"] = sd[o + "ln_post_attn.weight"]
            t[b + "post_ffw_norm.weight"] = sd[o + "ln_post_mlp.weight"]
    return arch, meta, t


def _experts(sd: dict[str, Tensor], b: str, o: str, n: int, f: int) -> dict[str, Tensor]:
    """A mixture of experts' tensors as llama.cpp's converter writes them: the router
    ``ffn_gate_inp`` ``(E, C)``, and the experts' gate, up ``(E, F, C)`` and down
    ``(E, C, F)`` matrices stacked (:func:`~attnlm.models.gguf.common.expert_parts`), and
    where the router has biases (gpt-oss) theirs stacked the same way."""
    out = {}
    for param in ("weight", "bias") if o + "mlp.router.bias" in sd else ("weight",):
        fcs = [sd[f"{o}mlp.experts.{e}.fc.{param}"] for e in range(n)]
        downs = [sd[f"{o}mlp.experts.{e}.proj.{param}"] for e in range(n)]
        out.update({f"{b}ffn_gate_inp.{param}": sd[f"{o}mlp.router.{param}"],
                    f"{b}ffn_gate_exps.{param}": torch.stack([w[:f] for w in fcs]),
                    f"{b}ffn_up_exps.{param}": torch.stack([w[f:] for w in fcs]),
                    f"{b}ffn_down_exps.{param}": torch.stack(downs)})  # fmt: skip
    return out


def _gpt2(model: Any) -> tuple[str, dict[str, Any], dict[str, Tensor]]:
    c = model.config
    for field, want in (("positions", "learned"), ("norm", "pre"), ("activation", "gelu_tanh"),
                        ("attention_score", "scaled_dot")):  # fmt: skip
        _need(c, field, want, "gpt2")
    sd = model.state_dict()
    d_ff = c.d_ff or 4 * c.n_embd
    meta = {
        "context_length": c.block_size, "embedding_length": c.n_embd, "block_count": c.n_layer,
        "feed_forward_length": d_ff, "attention.head_count": c.n_head,
        "attention.layer_norm_epsilon": float(c.layer_norm_eps), "vocab_size": c.vocab_size,
    }  # fmt: skip

    def bias(name: str, rows: int) -> Tensor:
        return sd[name] if name in sd else torch.zeros(rows)

    t = {"token_embd.weight": sd["tok_emb.weight"], "position_embd.weight": sd["pos_emb.weight"]}
    t["output_norm.weight"] = sd["ln_f.weight"]
    t["output_norm.bias"] = bias("ln_f.bias", c.n_embd)
    if not c.tie_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    names = {"attn_norm": "ln_1", "attn_qkv": "attn.qkv_proj", "attn_output": "attn.out_proj",
             "ffn_norm": "ln_2", "ffn_up": "mlp.fc", "ffn_down": "mlp.proj"}  # fmt: skip
    for i in range(c.n_layer):
        for g, o in names.items():
            w = sd[f"blocks.{i}.{o}.weight"]
            t[f"blk.{i}.{g}.weight"] = w
            t[f"blk.{i}.{g}.bias"] = bias(f"blocks.{i}.{o}.bias", w.shape[0])
    return "gpt2", meta, t


ARCHES = {"llama": _llama, "gpt": _gpt2}


def tensor_type(name: str, w: Tensor, kind: str) -> str:
    """The type ``w`` is stored in for ``--type kind`` (see the module docstring)."""
    if w.dim() == 1 or name.endswith("ffn_gate_inp.weight"):  # norms, biases, the router
        return "f32"
    if kind in ("q8_0", "q4_0") and w.shape[-1] % GROUP:
        return "f16"
    return kind


def export_gguf(
    model: Any,
    tokenizer: Any,
    path: str | Path,
    kind: str = "f32",
    chat_template: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Write ``model`` (our Llama or GPT) and ``tokenizer`` (byte-level BPE) to ``path`` with
    matrices in ``kind`` (``f32``, ``f16``, ``q8_0``, ``q4_0``); returns ``{"architecture",
    "tensors", "types": {type: count}, "bytes"}``. InputError for what cannot be exported."""
    import gguf

    from attnlm.base.fileio import atomic_path
    from attnlm.models.gguf.vocab import metadata
    from attnlm.models.registry import family_of

    if kind not in FILE_TYPES:
        raise InputError(f"--type {kind!r} is not one of {', '.join(FILE_TYPES)}")
    family = family_of(model).type
    if family not in ARCHES:
        raise InputError(
            f"a {family} model cannot be exported to GGUF (supported families: llama, gpt)"
        )
    arch, meta, tensors = ARCHES[family](model)
    c = model.config
    vocab = metadata(tokenizer, c.vocab_size, getattr(c, "bos_id", None),
                     getattr(c, "eos_id", None), chat_template)  # fmt: skip
    types: dict[str, int] = {}
    with atomic_path(path) as tmp:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(name or Path(path).stem)
        w.add_file_type(FILE_TYPES[kind])
        for key, value in meta.items():
            full = f"{arch}.{key}"
            _add(w, full, value)
        for key, value in vocab.items():
            _add(w, key, value)
        with torch.no_grad():
            for tname, tensor in tensors.items():
                ttype = tensor_type(tname, tensor, kind)
                pieces = tensor.detach().cpu()  # stacked experts' blocks: one matrix at a time
                data = (np.stack([encode(x, ttype) for x in pieces]) if tensor.dim() == 3
                        else encode(pieces, ttype))  # fmt: skip
                if ttype in ("q8_0", "q4_0"):
                    qtype = gguf.GGMLQuantizationType[ttype.upper()]
                    w.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=qtype)
                else:
                    w.add_tensor(tname, data)
                types[ttype.upper()] = types.get(ttype.upper(), 0) + 1
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if family == "llama":
            _same_config(c, tmp)
    return {"architecture": arch, "tensors": len(tensors), "types": types,
            "bytes": Path(path).stat().st_size}  # fmt: skip


def _same_config(config: Any, path: Path) -> None:
    """The file just written, read back by our loader, must describe ``config``: a part the
    GGUF architecture cannot carry (or carries differently) is refused naming the field."""
    import dataclasses

    from attnlm.models.gguf.loader import read_config

    table = read_config(path)
    kinds = (
        table.get("layer_types")
        or ["sliding_attention" if table.get("sliding_window") else "full_attention"]
        * table["n_layer"]
    )
    scale = config.head_dim**-0.5
    nope = table.get("nope_layers")
    theirs_all = {**table, "layer_types": tuple(kinds), "nope_layers": nope and tuple(nope),
                  "attn_scale": table.get("attn_scale") or scale}  # fmt: skip
    mine_all = {"layer_types": config.layer_kinds, "attn_scale": config.attn_scale or scale}
    if (config.rope_scaling or {}).get("truncate") is False:  # gpt-oss's ramp: llama.cpp
        # rounds its ends, as its converter writes every YaRN model (documented)
        mine_all["rope_scaling"] = {k: v for k, v in config.rope_scaling.items()
                                    if k != "truncate"}  # fmt: skip
    for field in dataclasses.fields(config):
        if field.name in ("bos_id", "eos_id", "dropout", "multiple_of", "d_ff", "arch"):
            continue
        mine = mine_all.get(field.name, getattr(config, field.name))
        theirs = theirs_all.get(field.name, field.default)
        if mine != theirs and not _close(mine, theirs):
            raise InputError(
                f"model.{field.name} = {mine!r} cannot be exported to GGUF "
                f"{table.get('arch', 'llama')} (llama.cpp would read {theirs!r})"
            )


def _close(a: Any, b: Any) -> bool:
    """Equal as float32 (the file stores float32)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(np.float32(a)) == float(np.float32(b))
    return False


def _add(w: Any, key: str, value: Any) -> None:
    """One metadata value in the type llama.cpp reads it as."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, (int, np.integer)):
        w.add_uint32(key, int(value)) if value >= 0 else w.add_int32(key, int(value))
    elif isinstance(value, (float, np.floating)):
        w.add_float32(key, float(value))
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        w.add_array(key, [v.item() if isinstance(v, np.generic) else v for v in value])
    else:
        raise InputError(f"GGUF metadata {key}: cannot write a {type(value).__name__}")
