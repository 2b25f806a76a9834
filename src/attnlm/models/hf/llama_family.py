"""The Hugging Face layouts of the Llama family's other members <-> our Llama
(:mod:`attnlm.models.llama`) with its optional parts: ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, ``MistralForCausalLM``, ``Phi3ForCausalLM``, ``Gemma2ForCausalLM``,
``Gemma3ForCausalLM`` (text only), ``SmolLM3ForCausalLM`` (every fourth layer without
positions: ``no_rope_layers``), ``GraniteForCausalLM`` (four scalar multipliers: of the
embeddings, the scores, the sublayer outputs and the logits), ``Olmo2ForCausalLM`` (norms of
the sublayers' outputs only, ``post_attention_layernorm`` and ``post_feedforward_layernorm``;
q/k norms over all heads), and the mixtures of experts
``Qwen3MoeForCausalLM`` and ``MixtralForCausalLM``. Each ``model_type`` has one :class:`Adapter` in
:data:`ADAPTERS`, which calls :func:`load` / :func:`save` here with its row of :data:`ARCHS`.

The weights are Llama's (``model.embed_tokens``, ``model.layers.{i}.input_layernorm``,
``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, ``model.norm``, ``lm_head``) with,
as the config's parts say: q/k/v biases (Qwen2); ``self_attn.{q,k}_norm`` (Qwen3, Gemma 3);
Phi-3's fused ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` (gate rows first: our fused
layout as it is); Gemma's four norms per layer (``input_layernorm``,
``post_attention_layernorm`` after attention, ``pre_feedforward_layernorm``,
``post_feedforward_layernorm``), which store ``w`` and multiply by ``1 + w``: ours hold
``1 + w`` (added on load, subtracted on save); a mixture of experts' router (``mlp.gate``,
Mixtral's ``block_sparse_moe.gate``) and per-expert projections
(``mlp.experts.{e}.{gate,up,down}_proj``, Mixtral's ``w1``, ``w3``, ``w2``). Every
``config.json`` value that changes the numbers is read and decides a field, or is refused in
one line naming the key (experts in an architecture without them, latent attention, partial
rotary, rotary scalings other than linear and llama3, bidirectional attention, biases the
architecture does not place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.base.errors import ConfigError
from attnlm.models.hf import gpt_oss
from attnlm.models.hf.folder import (
    load_hf_weights,
    read_hf_config,
    read_hf_weights,
    write_hf_folder,
)
from attnlm.models.hf.llama import BUFFERS, HEAD, original_context
from attnlm.models.hf.llama_family_config import (
    ARCHS,
    FULL,
    SLIDING,
    SWIGLU_OAI,
    Arch,
    config_from_hf,
)
from attnlm.models.hf.mapping import PARAMS, WEIGHT, WHOLE, Layout, Rule, layers, to_hf
from attnlm.models.llama import Llama, LlamaConfig, gemma_embed_scale


def _fits(config: LlamaConfig, arch: Arch) -> None:
    """Refuse (one line naming the field) a config that ``arch``'s layout cannot express."""
    c = config
    fixed = dict(qkv_bias=arch.qkv_bias, qk_norm=arch.qk_norm, post_norms=arch.gemma or arch.olmo,
                 pre_norms=not arch.olmo, qk_norm_all=arch.olmo,
                 mlp_act="gelu_tanh" if arch.gemma else "swiglu_oai" if arch.oss else "silu",
                 attn_out_bias=arch.oss, attn_sinks=arch.oss, moe_bias=arch.oss,
                 moe_gating="topk_softmax" if arch.oss else "softmax")  # fmt: skip
    if arch.gemma:
        fixed["embed_scale"] = gemma_embed_scale(c.n_embd)
    elif arch.granite:
        fixed.update(attn_softcap=None, final_softcap=None)
    else:
        fixed.update(embed_scale=None, attn_scale=None, attn_softcap=None, final_softcap=None)
    if not arch.granite:
        fixed.update(residual_scale=None, logit_scale=None)
    if not arch.local_rope:
        fixed["rope_local_theta"] = None
    elif arch.olmo:  # (OLMo 3's sliding layers: the global base, unscaled)
        fixed["rope_local_theta"] = c.rope_theta
    if not arch.nope:
        fixed["nope_layers"] = None
    if not arch.fused:  # (partial rotary: Phi-3's partial_rotary_factor)
        fixed["rotary_dim"] = None
    for name, value in fixed.items():
        if getattr(c, name) != value:
            raise ConfigError(f"model.{name} = {getattr(c, name)!r} cannot be saved as "
                              f"{arch.cls} (it has {value!r})")  # fmt: skip
    if arch.window == "all" and len(set(c.layer_kinds)) > 1:
        raise ConfigError(f"model.layer_types: {arch.cls} slides on every layer or none")
    if bool(arch.moe) != (c.n_expert is not None):
        has = "a mixture of experts" if arch.moe else "a dense feed-forward"
        raise ConfigError(f"model.n_expert = {c.n_expert!r} cannot be saved as {arch.cls} "
                          f"(it has {has})")  # fmt: skip
    if arch.moe == "block_sparse_moe" and not c.moe_norm_topk:
        raise ConfigError(f"model.moe_norm_topk = False cannot be saved as {arch.cls} "
                          f"(it renormalises)")  # fmt: skip


def _scalar(c: LlamaConfig) -> int | float:
    """Gemma's ``query_pre_attn_scalar`` of our score scale (an integer where it is one)."""
    scale = c.attn_scale if c.attn_scale is not None else c.head_dim**-0.5
    value = scale**-2
    return round(value) if math.isclose(value, round(value), rel_tol=1e-9) else value


def config_to_hf(config: LlamaConfig, arch: Arch) -> dict[str, Any]:
    """``arch``'s ``config.json`` dict for our config (``rope_theta`` / ``rope_scaling``,
    which ``transformers`` 4 and 5 both read): Llama's keys, then where the architecture puts
    its windows and their rotation, then its other parts' keys."""
    _fits(config, arch)
    out = _llama_keys(config, arch)
    out.update(_window_keys(config, arch))
    out.update(_part_keys(config, arch))
    return out


def _llama_keys(c: LlamaConfig, arch: Arch) -> dict[str, Any]:
    """The keys every member writes (the activation Gemma names its own way)."""
    sliding = SLIDING in c.layer_kinds
    out: dict[str, Any] = {
        "architectures": [arch.cls], "model_type": arch.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "intermediate_size": c.ffn_width,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head, "head_dim": c.head_dim,
        "max_position_embeddings": c.block_size, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
        "attention_dropout": c.dropout, "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": c.bos_id, "eos_token_id": c.eos_id, "pad_token_id": None,
        "sliding_window": c.sliding_window if sliding else None,
        "initializer_range": 0.02, "dtype": "float32",
    }  # fmt: skip
    if not arch.gemma:
        out["hidden_act"] = "silu"
    return out


def _window_keys(c: LlamaConfig, arch: Arch) -> dict[str, Any]:
    """Gemma's parts with its windows, Qwen's windows, OLMo 3's windows and each layer
    type's rotation."""
    sliding = [i for i, k in enumerate(c.layer_kinds) if k == SLIDING]
    out: dict[str, Any] = {}
    if arch.gemma:
        if sliding and c.sliding_window is None:  # (a config always has one)
            raise ConfigError("model.sliding_window is needed by the sliding layers")
        out.update(
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=_scalar(c),
            attn_logit_softcapping=c.attn_softcap, final_logit_softcapping=c.final_softcap,
            attention_bias=False, layer_types=list(c.layer_kinds),
            sliding_window=c.sliding_window or c.block_size,
        )  # fmt: skip
    if arch.local_rope and not arch.olmo:
        out["rope_local_base_freq"] = c.rope_local_theta or c.rope_theta
    if arch.window == "qwen":
        out.update(use_sliding_window=bool(sliding), layer_types=list(c.layer_kinds),
                   max_window_layers=sliding[0] if sliding else c.n_layer)  # fmt: skip
    if arch.model_type == "olmo3":  # each layer type's rotation (transformers' Olmo3Config
        # gives a flat rope_theta to the global layers alone)
        full = {"rope_type": "default", **(c.rope_scaling or {}), "rope_theta": c.rope_theta}
        out.update(
            layer_types=list(c.layer_kinds),
            rope_scaling=None,
            rope_parameters={
                FULL: full,
                SLIDING: {"rope_type": "default", "rope_theta": c.rope_theta},
            },
        )
    return out


def _part_keys(c: LlamaConfig, arch: Arch) -> dict[str, Any]:
    """The keys of the other parts: no attention biases, Granite's multipliers, SmolLM3's
    layers without positions, Phi-3's contexts and partial rotary, the experts."""
    out: dict[str, Any] = {}
    if arch.model_type in ("qwen3", "olmo2", "olmo3"):
        out["attention_bias"] = False
    if arch.oss:
        out.update(attention_bias=True, layer_types=list(c.layer_kinds),
                   sliding_window=c.sliding_window or c.block_size,
                   router_aux_loss_coef=0.9, **SWIGLU_OAI)  # fmt: skip
    if arch.granite:
        out.update(embedding_multiplier=c.embed_scale or 1.0,
                   attention_multiplier=c.attn_scale or c.head_dim**-0.5,
                   residual_multiplier=c.residual_scale or 1.0,
                   logits_scaling=c.logit_scale or 1.0, attention_bias=False,
                   mlp_bias=False)  # fmt: skip
    if arch.nope:
        out.update(no_rope_layers=[int(not c.nope(i)) for i in range(c.n_layer)],
                   no_rope_layer_interval=4, attention_bias=False, mlp_bias=False)  # fmt: skip
    if arch.fused:
        out.update(original_max_position_embeddings=c.block_size, resid_pdrop=0.0,
                   embd_pdrop=0.0)  # fmt: skip
    out.update(original_context(c))  # (LongRoPE's)
    if c.rotary_dim is not None:  # (Phi-4 mini's 0.75)
        out["partial_rotary_factor"] = c.rotary_dim / c.head_dim
    if arch.moe:
        out.update(num_local_experts=c.n_expert, num_experts_per_tok=c.n_expert_used,
                   output_router_logits=False)  # fmt: skip
    if arch.moe == "mlp" and not arch.oss:
        out.update(
            num_experts=c.n_expert,
            moe_intermediate_size=c.ffn_width,
            norm_topk_prob=c.moe_norm_topk,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return out


# -- the weight table ----------------------------------------------------------------------------


def block(config: LlamaConfig, arch: Arch) -> list[Rule]:
    """One layer: ours ``blocks.{i}.*``, theirs ``model.layers.{i}.*``."""
    c = config
    q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    one = 1.0 if arch.gemma else 0.0  # Gemma's norms: 1 + w
    params = ("weight", "bias") if c.qkv_bias else WEIGHT
    if arch.fused:
        qkv = Rule("attn.qkv_proj", "self_attn.qkv_proj", params)
        fc = Rule("mlp.fc", "mlp.gate_up_proj", WEIGHT)
    else:
        names = tuple(f"self_attn.{p}_proj" for p in "qkv")
        qkv = Rule("attn.qkv_proj", names, params, sizes=(q, kv, kv))  # (H D + 2 C_kv, C)
        fc = Rule("mlp.fc", ("mlp.gate_proj", "mlp.up_proj"), WEIGHT)  # (2F, C)
    rules = [Rule("ln_1", "input_layernorm", WEIGHT, offset=one)] if c.pre_norms else []
    rules.append(qkv)
    if c.qk_norm:
        rules += [Rule("attn.q_norm", "self_attn.q_norm", WEIGHT, offset=one),
                  Rule("attn.k_norm", "self_attn.k_norm", WEIGHT, offset=one)]  # fmt: skip
    rules.append(Rule("attn.out_proj", "self_attn.o_proj", PARAMS if c.attn_out_bias else WEIGHT))
    if c.attn_sinks:
        rules.append(Rule("attn.sinks", "self_attn.sinks", WHOLE))
    if c.post_norms:  # Gemma's four norms; OLMo 2 has no pre_feedforward_layernorm
        pre = Rule("ln_2", "pre_feedforward_layernorm", WEIGHT, offset=one)
        rules += [
            Rule("ln_post_attn", "post_attention_layernorm", WEIGHT, offset=one),
            *([pre] if c.pre_norms else []),
            Rule("ln_post_mlp", "post_feedforward_layernorm", WEIGHT, offset=one),
        ]
    else:
        rules.append(Rule("ln_2", "post_attention_layernorm", WEIGHT, offset=one))
    if c.n_expert is not None:
        return rules + experts(c, arch)
    return [*rules, fc, Rule("mlp.proj", "mlp.down_proj", WEIGHT)]


def experts(config: LlamaConfig, arch: Arch) -> list[Rule]:
    """A mixture of experts' router and experts (Hugging Face's per-expert keys, as every
    checkpoint stores them): ``mlp.router`` <- ``<moe>.gate``, ``mlp.experts.{e}.fc`` <- the
    expert's gate and up, ``mlp.experts.{e}.proj`` <- its down."""
    if arch.oss:  # (router and experts with biases; the experts unstacked: hf.gpt_oss)
        rules = [Rule("mlp.router", "mlp.router", PARAMS)]
        for e in range(config.n_expert):
            rules += [Rule(f"mlp.experts.{e}.{m}", f"mlp.experts.{e}.{m}", PARAMS)
                      for m in ("fc", "proj")]  # fmt: skip
        return rules
    gate, up, down = arch.experts
    rules = [Rule("mlp.router", f"{arch.moe}.gate", WEIGHT)]
    for e in range(config.n_expert):
        theirs = f"{arch.moe}.experts.{e}."
        rules += [Rule(f"mlp.experts.{e}.fc", (theirs + gate, theirs + up), WEIGHT),
                  Rule(f"mlp.experts.{e}.proj", theirs + down, WEIGHT)]  # fmt: skip
    return rules


def layout(config: LlamaConfig, arch: Arch) -> Layout:
    """Every weight of ``arch`` for a model with this config (the LM head only when untied)."""
    tied = config.tie_embeddings
    one = 1.0 if arch.gemma else 0.0
    embeddings = [Rule("tok_emb", "embed_tokens", WEIGHT), Rule("ln_f", "norm", WEIGHT, offset=one)]
    return Layout(
        arch.cls.removesuffix("ForCausalLM"),
        embeddings
        + layers(block(config, arch), config.n_layer, "blocks.{i}.", "layers.{i}.")
        + ([] if tied else [HEAD]),
        prefix="model.",
        renames=((r"^model\.", ""),),  # also read a bare base model's keys
        ignore=(*BUFFERS, "lm_head.weight") if tied else BUFFERS,
        tied=("lm_head.weight",) if tied else (),
    )


def load(path: str | Path, arch: Arch) -> Llama:
    """Load an ``arch`` folder into our :class:`~attnlm.models.llama.Llama`, in eval mode."""
    path = Path(path)
    hf = read_hf_config(path)
    config = LlamaConfig(**config_from_hf(hf, arch, where=str(path / "config.json")))
    if arch.oss:  # stacked (or MXFP4) experts: read whole, unstacked, then mapped
        state = gpt_oss.unstack(read_hf_weights(path), config.n_layer, str(path))
        return load_hf_weights(Llama(config), path, layout(config, arch), weights=state)
    return load_hf_weights(Llama(config), path, layout(config, arch))


def save(model: Llama, path: str | Path, arch: Arch, max_shard_size: int | None = None) -> None:
    """Write ``model`` as an ``arch`` folder that ``transformers`` loads as ``arch.cls``."""
    hf = config_to_hf(model.config, arch)
    state = to_hf(layout(model.config, arch), model.state_dict())
    if arch.oss:
        state = gpt_oss.stack(state, model.config.n_layer, model.config.n_expert)
    write_hf_folder(path, hf, state, max_shard_size=max_shard_size)


@dataclass(frozen=True)
class Adapter:
    """The Hugging Face adapter of one :class:`Arch` (what an adapter module holds for the
    other families: ``MODEL_TYPE``, ``MODEL``, ``load(path)``, ``save(model, path, ...)``;
    ``ARCH``: the architecture, which :func:`attnlm.models.hf.adapter_for` matches against a
    model's ``arch`` label)."""

    ARCH: Arch
    MODEL = Llama

    @property
    def MODEL_TYPE(self) -> str:  # noqa: N802 - the adapter modules' attribute name
        return self.ARCH.model_type

    def load(self, path: str | Path) -> Llama:
        """Load a folder of this class into our Llama (its parts from ``config.json``)."""
        return load(path, self.ARCH)

    def save(self, model: Llama, path: str | Path, max_shard_size: int | None = None) -> None:
        """Write ``model`` as a folder of this class (``transformers`` loads it)."""
        save(model, path, self.ARCH, max_shard_size=max_shard_size)


#: ``model_type`` -> its adapter (:data:`attnlm.models.hf.ARCHITECTURES` names them
#: ``attnlm.models.hf.llama_family:<model_type>``)
ADAPTERS = {t: Adapter(a) for t, a in ARCHS.items()}
