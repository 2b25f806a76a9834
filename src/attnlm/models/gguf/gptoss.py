"""GGUF architecture ``gpt-oss`` (OpenAI's gpt-oss-20b and gpt-oss-120b) -> our Llama with
attention sinks, biases on q, k, v and the output, a window on every other layer and a
mixture of experts with biases, the softmax of the top k router logits and the clamped SwiGLU.

Metadata: the common keys (:func:`~.common.base_table`: heads of ``attention.key_length``,
YaRN's rotary scaling as llama.cpp applies it, :func:`~.common.yarn_scaling`: the ramp's ends
rounded, where ``transformers`` does not round gpt-oss's), the experts'
(:func:`~.common.moe_fields`), ``attention.sliding_window`` and its pattern (absent: every
even layer sliding, llama.cpp's default of 2 for this architecture; the sliding layers rotate
as the global ones: a different ``rope.freq_base_swa`` is refused).

Tensors as a Qwen3-MoE file's without q/k norms, plus ``attn_sinks`` ``(H,)`` (each head's sink
logit), ``attn_output.bias``, the router's ``ffn_gate_inp.bias`` ``(E,)`` and the experts'
stacked biases ``ffn_gate_exps.bias`` / ``ffn_up_exps.bias`` ``(E, F)`` and
``ffn_down_exps.bias`` ``(E, C)``; the norm before the feed-forward is
``post_attention_norm`` (llama.cpp's name for Hugging Face's ``post_attention_layernorm``).
The released files hold the experts in MXFP4 and the rest in Q8_0 or float.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.common import (
    BASE_KEYS,
    MOE_KEYS,
    YARN_KEYS,
    Meta,
    base_table,
    block_parts,
    has_tensor,
    moe_fields,
    swa_pattern,
)
from attnlm.models.gguf.parts import Part

ARCH = "gpt-oss"
READ = BASE_KEYS | MOE_KEYS | YARN_KEYS | {"attention.sliding_window",
                                          "attention.sliding_window_pattern",
                                          "rope.freq_base_swa"}  # fmt: skip


def config_table(header: GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table of our Llama for this file."""
    meta = Meta(header, ARCH, READ)
    table = base_table(meta, scalings=("yarn",))
    experts = moe_fields(meta, table)
    if not experts:
        meta.refuse("expert_count", "a gpt-oss model needs experts")
    theta = table["rope_theta"]
    if meta.float("rope.freq_base_swa", theta) != theta:
        meta.refuse("rope.freq_base_swa", f"not the global base {theta:g}")
    table.update(experts, arch="gptoss", qkv_bias=has_tensor(header, "attn_q.bias"),
                 attn_out_bias=True, attn_sinks=True, moe_bias=True, moe_gating="topk_softmax",
                 moe_norm_topk=False, mlp_act="swiglu_oai")  # fmt: skip
    window = meta.int("attention.sliding_window", 0, zero=True)
    if window:
        table.update(sliding_window=window,
                     layer_types=list(swa_pattern(meta, table["n_layer"], 2)))  # fmt: skip
    return table


def parts(config: Any, header: GGUFFile) -> list[Part]:
    """Where each tensor goes (NEOX rotary: rows as stored): the Llama family's, the norm
    before the experts renamed, and the sinks and biases."""
    c, f, n, h = config.n_embd, config.ffn_width, config.n_expert, config.n_head
    out = []
    for part in block_parts(config, header):
        if part.gguf.endswith(".ffn_norm.weight"):
            part = replace(part, gguf=part.gguf.replace("ffn_norm", "post_attention_norm"))
        out.append(part)
    for i in range(config.n_layer):
        blk, ours = f"blk.{i}.", f"blocks.{i}."
        out += [Part(blk + "attn_output.bias", ours + "attn.out_proj.bias", shape=(c,)),
                Part(blk + "attn_sinks.weight", ours + "attn.sinks", shape=(h,)),
                Part(blk + "ffn_gate_inp.bias", ours + "mlp.router.bias", shape=(n,))]  # fmt: skip
        for e in range(n):
            mine = f"{ours}mlp.experts.{e}."
            out += [Part(blk + "ffn_gate_exps.bias", mine + "fc.bias", (0, f), shape=(n, f),
                         expert=e),
                    Part(blk + "ffn_up_exps.bias", mine + "fc.bias", (f, 2 * f), shape=(n, f),
                         expert=e),
                    Part(blk + "ffn_down_exps.bias", mine + "proj.bias", shape=(n, c),
                         expert=e)]  # fmt: skip
    return out
