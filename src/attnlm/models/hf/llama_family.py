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
from attnlm.models.hf.folder import load_hf_weights, read_hf_config, write_hf_folder
from attnlm.models.hf.llama import BUFFERS, HEAD, _first, _rope, original_context
from attnlm.models.hf.mapping import WEIGHT, Layout, Rule, layers, to_hf
from attnlm.models.llama import LAYER_TYPES, Llama, LlamaConfig, gemma_embed_scale

FULL, SLIDING = LAYER_TYPES


@dataclass(frozen=True)
class Arch:
    """One Hugging Face architecture of the family: its ``model_type`` and class, our
    ``model.arch`` label, and what its layout holds. ``window``: how its config places
    sliding windows (``"all"``: every layer when ``sliding_window`` is set; ``"qwen"``:
    ``use_sliding_window``, ``max_window_layers`` or ``layer_types``; ``"types"``:
    ``layer_types`` or Gemma's pattern every ``pattern`` layers). ``gemma``: Gemma's parts
    (norms of ``1 + w``, post-norms, GeGLU, the embedding scale, ``query_pre_attn_scalar``,
    soft-capping). ``nope``: layers without positions (SmolLM3's ``no_rope_layers``).
    ``granite``: Granite's ``embedding_multiplier``, ``attention_multiplier`` (the score
    scale), ``residual_multiplier`` and ``logits_scaling`` (the logits' divisor)."""

    model_type: str
    cls: str
    arch: str
    qkv_bias: bool = False
    qk_norm: bool = False
    fused: bool = False  # Phi-3: qkv_proj and gate_up_proj
    gemma: bool = False
    window: str = "all"
    pattern: int = 0  # Gemma's default sliding_window_pattern
    local_rope: bool = False  # Gemma 3: rope_local_base_freq for the sliding layers
    # a mixture of experts (our SparseMoE): the router's and one expert's modules, relative to
    # the layer ("" for a dense model); the experts' gate, up, down projections
    moe: str = ""  # "mlp" (Qwen3-MoE) or "block_sparse_moe" (Mixtral)
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    nope: bool = False
    granite: bool = False
    olmo: bool = False  # OLMo 2: post-norms only, q/k norms over all heads
    tied: bool = False  # the config's default tie_word_embeddings (Gemma's: True)


ARCHS = {
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", "qwen2", qkv_bias=True, window="qwen"),
    "qwen3": Arch("qwen3", "Qwen3ForCausalLM", "qwen3", qk_norm=True, window="qwen"),
    "mistral": Arch("mistral", "MistralForCausalLM", "mistral"),
    "phi3": Arch("phi3", "Phi3ForCausalLM", "phi3", fused=True),
    "gemma2": Arch("gemma2", "Gemma2ForCausalLM", "gemma2", gemma=True, window="types",
                   pattern=2, tied=True),
    "gemma3_text": Arch("gemma3_text", "Gemma3ForCausalLM", "gemma3", qk_norm=True, gemma=True,
                        window="types", pattern=6, local_rope=True, tied=True),
    "smollm3": Arch("smollm3", "SmolLM3ForCausalLM", "smollm3", window="qwen", nope=True,
                    tied=True),
    "granite": Arch("granite", "GraniteForCausalLM", "granite", granite=True),
    "olmo2": Arch("olmo2", "Olmo2ForCausalLM", "olmo2", qk_norm=True, olmo=True),
    "qwen3_moe": Arch("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", qk_norm=True,
                      window="qwen", moe="mlp"),
    "mixtral": Arch("mixtral", "MixtralForCausalLM", "mixtral", moe="block_sparse_moe",
                    experts=("w1", "w3", "w2")),
}  # fmt: skip

#: config.json keys of a mixture of experts (read by the architectures that have one)
MOE_KEYS = ("num_experts", "num_local_experts", "moe_intermediate_size")
# config.json keys of parts we do not implement (truthy values are refused)
REFUSED_KEYS = {
    "num_experts": "mixtures of experts", "num_local_experts": "mixtures of experts",
    "n_routed_experts": "mixtures of experts", "moe_intermediate_size": "mixtures of experts",
    "q_lora_rank": "latent attention (MLA)", "kv_lora_rank": "latent attention (MLA)",
    "vision_config": "a vision tower", "use_bidirectional_attention": "bidirectional attention",
    "mlp_bias": "feed-forward biases",
}  # fmt: skip


def _refuse_parts(hf: dict, arch: Arch, where: str) -> None:
    for key, what in REFUSED_KEYS.items():
        if hf.get(key) and not (arch.moe and key in MOE_KEYS):
            raise ConfigError(f"{where}: {key} ({what}) is not supported for {arch.cls}")
    if hf.get("attention_bias") and not arch.qkv_bias:
        raise ConfigError(f"{where}: attention_bias=true is not supported for {arch.cls}")


def _partial(hf: dict, arch: Arch, head_dim: int, where: str) -> int | None:
    """The rotated features of partial rotary (Phi-4 mini's ``partial_rotary_factor`` 0.75:
    ``int(D * factor)``, as ``transformers`` takes it), None for all; other architectures'
    are refused."""
    factor = hf.get("partial_rotary_factor")
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and factor is None:
        factor = params.get("partial_rotary_factor")
    if factor in (None, 1, 1.0):
        return None
    if not arch.fused:
        raise ConfigError(f"{where}: partial_rotary_factor {factor} (partial rotary) is not "
                          f"supported for {arch.cls}")  # fmt: skip
    if type(factor) not in (int, float) or not 0 < factor < 1:
        raise ConfigError(f"{where}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    return int(head_dim * factor)


def _activation(hf: dict, arch: Arch, where: str) -> str:
    if arch.gemma:
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_new"):
            raise ConfigError(f"{where}: hidden_activation {act!r} is not supported "
                              f"(gelu_pytorch_tanh)")  # fmt: skip
        return "gelu_tanh"
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported (silu)")
    return "silu"


def _rotary(hf: dict, arch: Arch, where: str) -> dict[str, Any]:
    """``rope_theta``, ``rope_scaling`` and ``rope_local_theta`` from either generation of the
    config (Gemma 3's ``rope_parameters`` per layer type, or ``rope_local_base_freq``)."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get(FULL), dict):
        theta, scaling = _rope({"rope_parameters": params[FULL]}, where)
        local = params.get(SLIDING)
        local_theta = None
        if isinstance(local, dict):
            local_theta, local_scaling = _rope({"rope_parameters": local}, where)
            if local_scaling is not None:
                raise ConfigError(f"{where}: rope scaling of the sliding layers is not supported")
    else:
        theta, scaling = _rope(hf, where)
        local_theta = hf.get("rope_local_base_freq")
    if arch.local_rope:
        local_theta = float(local_theta if local_theta is not None else 10000.0)
    elif local_theta is not None:
        raise ConfigError(f"{where}: a local rotary base is not supported for {arch.cls}")
    return dict(rope_theta=theta, rope_scaling=scaling, rope_local_theta=local_theta)


def _windows(hf: dict, arch: Arch, n_layer: int, where: str) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` as the architecture's config places them."""
    window = hf.get("sliding_window")
    if arch.window == "qwen" and not hf.get("use_sliding_window", False):
        window = None
    if window is None:
        return dict(sliding_window=None, layer_types=None)
    if arch.window == "all":
        return dict(sliding_window=int(window), layer_types=None)
    types = hf.get("layer_types")
    if types is None and arch.window == "qwen":
        first = int(hf.get("max_window_layers", 28))
        types = [SLIDING if i >= first else FULL for i in range(n_layer)]
    elif types is None:
        pattern = int(hf.get("sliding_window_pattern", arch.pattern))
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n_layer)]
    if not isinstance(types, list) or any(t not in LAYER_TYPES for t in types):
        raise ConfigError(f"{where}: layer_types must list {' or '.join(LAYER_TYPES)} per layer")
    return dict(sliding_window=int(window), layer_types=tuple(types))


def config_from_hf(hf: dict, arch: Arch, *, where: str = "config.json") -> dict[str, Any]:
    """The fields of our ``LlamaConfig`` from ``arch``'s ``config.json`` dict (one
    ConfigError line for anything we do not implement)."""
    if hf.get("model_type", arch.model_type) != arch.model_type:
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, "
                          f"expected {arch.model_type!r}")  # fmt: skip
    _refuse_parts(hf, arch, where)
    try:
        d, heads, n = (
            int(hf["hidden_size"]),
            int(hf["num_attention_heads"]),
            int(hf["num_hidden_layers"]),
        )
        head_dim = hf.get("head_dim")
        plain = head_dim is None or (head_dim == d // heads and d % heads == 0)
        d_head = None if plain else int(head_dim)
        fields = dict(
            arch=arch.arch, vocab_size=int(hf["vocab_size"]),
            block_size=int(hf.get("max_position_embeddings", 2048)), n_layer=n, n_head=heads,
            n_kv_head=int(hf.get("num_key_value_heads") or heads), n_embd=d, d_head=d_head,
            d_ff=int(hf["intermediate_size"]), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", arch.tied)),
            dropout=float(hf.get("attention_dropout") or 0.0), bos_id=hf.get("bos_token_id"),
            eos_id=_first(hf.get("eos_token_id")), qkv_bias=arch.qkv_bias, qk_norm=arch.qk_norm,
            mlp_act=_activation(hf, arch, where),
            **_rotary(hf, arch, where), **_windows(hf, arch, n, where),
        )  # fmt: skip
        if arch.moe:
            fields.update(_experts(hf, arch, where))
        if arch.nope:
            fields["nope_layers"] = _nope(hf, n, where)
        if arch.granite:
            fields.update(_multipliers(hf, where))
        if arch.olmo:
            fields.update(post_norms=True, pre_norms=False, qk_norm_all=True)
        if arch.fused:  # Phi-3's residual dropout (training only)
            fields["dropout"] = max(fields["dropout"], float(hf.get("resid_pdrop") or 0.0))
        fields["rotary_dim"] = _partial(hf, arch, d_head or d // heads, where)
        if arch.gemma:
            scalar = float(hf.get("query_pre_attn_scalar", 256))
            fields.update(
                post_norms=True, embed_scale=gemma_embed_scale(d), attn_scale=scalar**-0.5,
                attn_softcap=_cap(hf.get("attn_logit_softcapping")),
                final_softcap=_cap(hf.get("final_logit_softcapping")),
            )  # fmt: skip
        return fields
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None


def _experts(hf: dict, arch: Arch, where: str) -> dict[str, Any]:
    """A mixture of experts' fields: ``n_expert`` (``num_experts`` or ``num_local_experts``),
    ``n_expert_used``, each expert's width (Qwen3-MoE's ``moe_intermediate_size``, Mixtral's
    ``intermediate_size``) and the renormalised weights (Qwen3-MoE's ``norm_topk_prob``,
    always in Mixtral); dense layers among the sparse ones are refused."""
    n = hf.get("num_experts") or hf.get("num_local_experts")
    if not n:
        raise ConfigError(f"{where}: missing key 'num_experts' ({arch.cls} has experts)")
    out = dict(n_expert=int(n), n_expert_used=int(hf["num_experts_per_tok"]),
               moe_norm_topk=True)  # fmt: skip
    if arch.moe == "mlp":  # Qwen3-MoE
        if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step", 1)) != 1:
            raise ConfigError(f"{where}: dense layers among the experts' (mlp_only_layers, "
                              f"decoder_sparse_step) are not supported")  # fmt: skip
        out.update(d_ff=int(hf["moe_intermediate_size"]),
                   moe_norm_topk=bool(hf.get("norm_topk_prob", False)))  # fmt: skip
    return out


def _nope(hf: dict, n_layer: int, where: str) -> tuple[int, ...] | None:
    """SmolLM3's layers without positions: ``no_rope_layers`` (1: the layer rotates, 0: it
    does not; at least one entry per layer), or else every ``no_rope_layer_interval``-th
    layer (default 4); None where every layer rotates."""
    flags = hf.get("no_rope_layers")
    if flags is None:
        step = hf.get("no_rope_layer_interval", 4)
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ConfigError(f"{where}: no_rope_layer_interval must be a positive integer")
        flags = [int((i + 1) % step != 0) for i in range(n_layer)]
    if not isinstance(flags, list) or len(flags) < n_layer or any(f not in (0, 1) for f in flags):
        raise ConfigError(f"{where}: no_rope_layers must give 1 (rotary) or 0 (none) per layer")
    return tuple(i for i in range(n_layer) if not flags[i]) or None


def _multipliers(hf: dict, where: str) -> dict[str, Any]:
    """Granite's four multipliers as our fields: ``embed_scale``, ``attn_scale`` (the score
    scale itself: Granite has no ``1 / sqrt(D)``), ``residual_scale`` and ``logit_scale``
    (None where 1: the plain model's)."""
    keys = ("embedding_multiplier", "attention_multiplier", "residual_multiplier",
            "logits_scaling")  # fmt: skip
    values = {}
    for key in keys:
        v = hf.get(key, 1.0)
        if type(v) not in (int, float) or not v > 0:
            raise ConfigError(f"{where}: {key} must be a positive number, got {v!r}")
        values[key] = float(v)
    one = lambda v: None if v == 1.0 else v  # noqa: E731
    return dict(embed_scale=one(values["embedding_multiplier"]),
                attn_scale=values["attention_multiplier"],
                residual_scale=one(values["residual_multiplier"]),
                logit_scale=one(values["logits_scaling"]))  # fmt: skip


def _cap(value: Any) -> float | None:
    return None if value is None else float(value)


# -- saving ------------------------------------------------------------------------------------


def _fits(config: LlamaConfig, arch: Arch) -> None:
    """Refuse (one line naming the field) a config that ``arch``'s layout cannot express."""
    c = config
    fixed = dict(qkv_bias=arch.qkv_bias, qk_norm=arch.qk_norm, post_norms=arch.gemma or arch.olmo,
                 pre_norms=not arch.olmo, qk_norm_all=arch.olmo,
                 mlp_act="gelu_tanh" if arch.gemma else "silu")  # fmt: skip
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
    which ``transformers`` 4 and 5 both read)."""
    _fits(config, arch)
    c = config
    sliding = [i for i, k in enumerate(c.layer_kinds) if k == SLIDING]
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
    if arch.gemma:
        out.update(
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=_scalar(c),
            attn_logit_softcapping=c.attn_softcap, final_logit_softcapping=c.final_softcap,
            attention_bias=False, layer_types=list(c.layer_kinds),
        )  # fmt: skip
        if sliding and c.sliding_window is None:  # (a config always has one)
            raise ConfigError("model.sliding_window is needed by the sliding layers")
        out["sliding_window"] = c.sliding_window or c.block_size
    else:
        out["hidden_act"] = "silu"
    if arch.local_rope:
        out["rope_local_base_freq"] = c.rope_local_theta or c.rope_theta
    if arch.window == "qwen":
        out.update(use_sliding_window=bool(sliding), layer_types=list(c.layer_kinds),
                   max_window_layers=sliding[0] if sliding else c.n_layer)  # fmt: skip
    if arch.model_type in ("qwen3", "olmo2"):
        out["attention_bias"] = False
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
    if arch.moe == "mlp":
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
    rules.append(Rule("attn.out_proj", "self_attn.o_proj", WEIGHT))
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
    return load_hf_weights(Llama(config), path, layout(config, arch))


def save(model: Llama, path: str | Path, arch: Arch, max_shard_size: int | None = None) -> None:
    """Write ``model`` as an ``arch`` folder that ``transformers`` loads as ``arch.cls``."""
    hf = config_to_hf(model.config, arch)
    state = to_hf(layout(model.config, arch), model.state_dict())
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
