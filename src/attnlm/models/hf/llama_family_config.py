"""Reading a Llama-family member's ``config.json`` (:mod:`.llama_family`): each
architecture's row of :data:`ARCHS` (:class:`Arch`: its class, our label, what its layout
holds) and :func:`config_from_hf`, every value that changes the numbers read into a field of our
``LlamaConfig`` or refused in one line naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnlm.base.errors import ConfigError
from attnlm.models.hf.llama import _first, _rope
from attnlm.models.llama import LAYER_TYPES, gemma_embed_scale

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
    # gpt-oss: attention sinks, an output bias, stacked experts with biases, the softmax over
    # the top k router logits, the clamped SwiGLU (attnlm.models.hf.gpt_oss)
    oss: bool = False
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
    # OLMo 3: OLMo 2's blocks, three of four layers sliding, their rotation never scaled
    "olmo3": Arch("olmo3", "Olmo3ForCausalLM", "olmo3", qk_norm=True, olmo=True, window="types",
                  pattern=4, local_rope=True),
    "qwen3_moe": Arch("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", qk_norm=True,
                      window="qwen", moe="mlp"),
    "mixtral": Arch("mixtral", "MixtralForCausalLM", "mixtral", moe="block_sparse_moe",
                    experts=("w1", "w3", "w2")),
    "gpt_oss": Arch("gpt_oss", "GptOssForCausalLM", "gptoss", qkv_bias=True, window="types",
                    pattern=2, moe="mlp", oss=True),
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
    from attnlm.models.hf.gpt_oss import check_quantization

    if arch.oss:
        check_quantization(hf, where)
    elif hf.get("quantization_config") is not None:
        q = hf["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise ConfigError(f"{where}: quantization_config {method!r} is not supported (load "
                          f"a GGUF file of the model, or its float weights)")  # fmt: skip
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
    if arch.local_rope:  # (Gemma 3's default 10000; OLMo 3's the global base)
        default = theta if arch.olmo else 10000.0
        local_theta = float(local_theta if local_theta is not None else default)
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
        if arch.oss:
            fields.update(_oss(hf, where))
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
    used = hf.get("num_experts_per_tok") or hf.get("experts_per_token")  # (gpt-oss: either)
    if not used:
        raise ConfigError(f"{where}: missing key 'num_experts_per_tok'")
    out = dict(n_expert=int(n), n_expert_used=int(used), moe_norm_topk=True)
    if arch.moe == "mlp" and not arch.oss:  # Qwen3-MoE
        if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step", 1)) != 1:
            raise ConfigError(f"{where}: dense layers among the experts' (mlp_only_layers, "
                              f"decoder_sparse_step) are not supported")  # fmt: skip
        out.update(d_ff=int(hf["moe_intermediate_size"]),
                   moe_norm_topk=bool(hf.get("norm_topk_prob", False)))  # fmt: skip
    return out


#: gpt-oss's clamped SwiGLU: transformers' defaults, and the only values llama.cpp computes
SWIGLU_OAI = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}


def _oss(hf: dict, where: str) -> dict[str, Any]:
    """gpt-oss's parts: sinks, biases on the output and the experts, the softmax of the top k
    logits (no renormalising), the clamped SwiGLU (its limit and alpha must be the defaults)."""
    for key, value in SWIGLU_OAI.items():
        if hf.get(key, value) != value:
            raise ConfigError(f"{where}: {key} {hf[key]!r} is not supported ({value})")
    if not hf.get("attention_bias", True):
        raise ConfigError(f"{where}: attention_bias=false is not supported for gpt-oss")
    return dict(attn_out_bias=True, attn_sinks=True, moe_bias=True, moe_gating="topk_softmax",
                moe_norm_topk=False, mlp_act="swiglu_oai")  # fmt: skip


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
