"""The Hugging Face Llama layout (``LlamaForCausalLM.save_pretrained``) <-> our Llama
(:mod:`attnlm.models.llama`): the config translation both ways and the weight table.

``config.json`` has ``model_type: "llama"``, ``hidden_size``, ``intermediate_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``rms_norm_eps``,
``max_position_embeddings``, ``tie_word_embeddings`` and the rotary settings: ``rope_theta``
with an optional ``rope_scaling`` table (``transformers`` 4), or both in one
``rope_parameters`` table (``transformers`` 5). The weights are
``model.embed_tokens.weight``, ``model.layers.{i}.input_layernorm.weight``,
``self_attn.{q,k,v,o}_proj.weight`` (k and v have ``C · n_kv_head / n_head`` rows),
``post_attention_layernorm.weight``, ``mlp.{gate,up,down}_proj.weight``, ``model.norm.weight``
and ``lm_head.weight`` (absent when tied). No biases. Ours fuse q, k, v into ``qkv_proj`` and
gate, up into ``mlp.fc``. The q and k rows are already in the rotate-half order of
:class:`~attnlm.nn.positional.RotaryEmbedding` (the Hugging Face conversion permuted Meta's
interleaved layout), so they are copied as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlm.base.errors import ConfigError
from attnlm.models.hf.folder import (
    load_hf_weights,
    read_hf_config,
    write_hf_folder,
)
from attnlm.models.hf.mapping import WEIGHT, Layout, Rule, layers, to_hf
from attnlm.models.llama import Llama, LlamaConfig

MODEL_TYPE = "llama"

EMBEDDINGS = [
    Rule("tok_emb", "embed_tokens", WEIGHT),  # (V, C)
    Rule("ln_f", "norm", WEIGHT),  # (C,)
]
HEAD = Rule("lm_head", "lm_head", WEIGHT, prefixed=False,
            error="Llama weights are missing 'lm_head.weight' (untied embeddings)")  # fmt: skip
BUFFERS = ("*rotary_emb.inv_freq",)  # stored by some old checkpoints; recomputed


def block(config: LlamaConfig) -> list[Rule]:
    """One layer: ours ``blocks.{i}.*``, theirs ``model.layers.{i}.*``."""
    q, kv = config.n_head * config.head_dim, config.n_kv_head * config.head_dim
    qkv = tuple(f"self_attn.{p}_proj" for p in "qkv")
    return [
        Rule("ln_1", "input_layernorm", WEIGHT),
        Rule("attn.qkv_proj", qkv, WEIGHT, sizes=(q, kv, kv)),  # (H D + 2 C_kv, C)
        Rule("attn.out_proj", "self_attn.o_proj", WEIGHT),
        Rule("ln_2", "post_attention_layernorm", WEIGHT),
        Rule("mlp.fc", ("mlp.gate_proj", "mlp.up_proj"), WEIGHT),  # (2F, C)
        Rule("mlp.proj", "mlp.down_proj", WEIGHT),  # (C, F)
    ]


def layout(config: LlamaConfig) -> Layout:
    """Every Llama weight of a model with this config (the LM head only when untied)."""
    tied = config.tie_embeddings
    return Layout(
        "Llama",
        EMBEDDINGS
        + layers(block(config), config.n_layer, "blocks.{i}.", "layers.{i}.")
        + ([] if tied else [HEAD]),
        prefix="model.",
        renames=((r"^model\.", ""),),  # also read a bare LlamaModel's keys
        ignore=(*BUFFERS, "lm_head.weight") if tied else BUFFERS,
        tied=("lm_head.weight",) if tied else (),
    )


def _rope(hf: dict, where: str) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, our rope_scaling or None)`` from either generation of the config."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict):
        theta, scaling = params.get("rope_theta", hf.get("rope_theta", 10000.0)), params
    else:
        theta, scaling = hf.get("rope_theta", 10000.0), hf.get("rope_scaling")
    if scaling is None:
        return float(theta), None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind == "linear":
        if not isinstance(scaling.get("factor"), (int, float)):
            raise ConfigError(f"{where}: rope_scaling lacks a numeric 'factor'")
        return float(theta), {"rope_type": "linear", "factor": float(scaling["factor"])}
    if kind == "yarn":
        return float(theta), _yarn(scaling, where, hf.get("max_position_embeddings"))
    if kind in ("longrope", "su"):  # ("su": Phi-3's first name for it)
        return float(theta), _longrope(scaling, where, hf)
    if kind != "llama3":
        raise ConfigError(
            f"{where}: rope_type {kind!r} is not supported (default, linear, llama3, yarn, "
            f"longrope)"
        )
    from attnlm.nn.positional import ROPE_SCALING_KEYS

    missing = [k for k in ROPE_SCALING_KEYS if k not in scaling]
    if missing:
        raise ConfigError(f"{where}: rope_scaling lacks {missing[0]!r}")
    return float(theta), {"rope_type": "llama3", **{k: scaling[k] for k in ROPE_SCALING_KEYS}}


def _yarn(scaling: dict, where: str, context: Any) -> dict[str, Any]:
    """Our YaRN ``rope_scaling`` of a config's: its factor, original context (absent: the
    config's ``max_position_embeddings``, as ``transformers`` takes it), betas and attention
    factor (absent ones left out), ``truncate`` where false (gpt-oss's ramp, its ends not
    rounded); DeepSeek's ``mscale`` / ``mscale_all_dim`` are refused."""
    from attnlm.nn.positional import YARN_KEYS

    for key in ("mscale", "mscale_all_dim"):
        if scaling.get(key) not in (None, 0, 1, 1.0):
            raise ConfigError(f"{where}: rope_scaling.{key} (DeepSeek's YaRN) is not supported")
    if scaling.get("truncate", True) not in (True, False):
        raise ConfigError(f"{where}: rope_scaling.truncate must be true or false")
    scaling = {"original_max_position_embeddings": context, **scaling}
    for key in YARN_KEYS[:2]:
        if type(scaling.get(key)) not in (int, float):
            raise ConfigError(f"{where}: rope_scaling lacks a numeric {key!r}")
    out = {"rope_type": "yarn", **{k: scaling[k] for k in YARN_KEYS if scaling.get(k)}}
    return {**out, "truncate": False} if scaling.get("truncate") is False else out


def _longrope(scaling: dict, where: str, hf: dict) -> dict[str, Any]:
    """Our LongRoPE ``rope_scaling`` of a config's (Phi-3's 128k models): the two factor
    lists, the original context (the config's top-level ``original_max_position_embeddings``
    first, as ``transformers``' Phi-3 takes it, then the table's, then the context), the context
    factor (absent: the context over the original one) and the attention factor where given."""
    n = hf.get("original_max_position_embeddings") or scaling.get(
        "original_max_position_embeddings", hf.get("max_position_embeddings")
    )
    for key in ("short_factor", "long_factor"):
        if not isinstance(scaling.get(key), list):
            raise ConfigError(f"{where}: rope_scaling lacks a list {key!r}")
    if type(n) is not int or n < 1:
        raise ConfigError(f"{where}: LongRoPE needs original_max_position_embeddings, got {n!r}")
    factor = scaling.get("factor") or hf.get("max_position_embeddings", n) / n
    out = {"rope_type": "longrope", "short_factor": list(scaling["short_factor"]),
           "long_factor": list(scaling["long_factor"]), "original_max_position_embeddings": n,
           "factor": float(factor)}  # fmt: skip
    if scaling.get("attention_factor") is not None:
        out["attention_factor"] = scaling["attention_factor"]
    return out


def config_from_hf(hf: dict, *, where: str = "config.json") -> dict[str, Any]:
    """The fields of our ``LlamaConfig`` from a Llama ``config.json`` dict (``head_dim``, where
    it is not ``hidden_size / num_attention_heads``, is ``d_head``: Mistral Nemo's layout in a
    Llama); what our Llama does not implement (biases, another activation, other rotary
    scalings) is a ConfigError."""
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'llama'")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise ConfigError(f"{where}: {key}=true is not supported (Llama has no biases)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported (silu)")
    try:
        d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        head_dim = hf.get("head_dim")
        if head_dim is not None and (type(head_dim) is not int or head_dim < 1):
            raise ConfigError(f"{where}: head_dim must be a positive integer, got {head_dim!r}")
        plain = head_dim is None or head_dim * heads == d
        theta, scaling = _rope(hf, where)
        return dict(
            vocab_size=int(hf["vocab_size"]),
            block_size=int(hf.get("max_position_embeddings", 2048)),
            n_layer=int(hf["num_hidden_layers"]),
            n_head=heads,
            n_kv_head=int(hf.get("num_key_value_heads") or heads),
            n_embd=d,
            d_head=None if plain else head_dim,
            d_ff=int(hf["intermediate_size"]),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dropout=float(hf.get("attention_dropout", 0.0)),
            bos_id=hf.get("bos_token_id"),
            eos_id=_first(hf.get("eos_token_id")),
        )
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None


def _first(value: Any) -> int | None:
    """An id, or the first of a list of ids (Llama 3's several end tokens)."""
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def config_to_hf(config: LlamaConfig) -> dict[str, Any]:
    """A Llama ``config.json`` dict for our config (``rope_theta`` / ``rope_scaling``, which
    ``transformers`` 4 and 5 both read)."""
    c = config
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.n_embd,
        "intermediate_size": c.ffn_width,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
        **original_context(c),
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": c.dropout,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "initializer_range": 0.02,
        "dtype": "float32",
    }


def original_context(c: LlamaConfig) -> dict[str, Any]:
    """LongRoPE's original context at the top level of ``config.json`` too, where
    ``transformers``' Phi-3 reads it first (its default 4096 would otherwise win over the
    table's); empty for other configs."""
    scaling = c.rope_scaling or {}
    if scaling.get("rope_type") != "longrope":
        return {}
    return {"original_max_position_embeddings": scaling["original_max_position_embeddings"]}


# -- the adapter: load(path) / save(model, path, max_shard_size) ----------------------------

MODEL = Llama


def load(path: str | Path) -> Llama:
    """Load a ``LlamaForCausalLM`` folder (``config.json`` and ``model.safetensors``, sharded
    safetensors with ``model.safetensors.index.json``, or ``pytorch_model.bin``) into our
    :class:`~attnlm.models.llama.Llama`, in eval mode."""
    path = Path(path)
    config = LlamaConfig(**config_from_hf(read_hf_config(path), where=str(path / "config.json")))
    return load_hf_weights(Llama(config), path, layout(config))


def save(model: Llama, path: str | Path, max_shard_size: int | None = None) -> None:
    """Write ``model`` as a Hugging Face Llama folder that
    ``transformers.LlamaForCausalLM.from_pretrained`` loads; with ``max_shard_size`` (bytes)
    the weights are sharded with an index file when larger."""
    from attnlm.models.hf import ARCHITECTURES
    from attnlm.models.llama import describe_parts

    held = ("rope scaling", "d_head=")  # Llama's own rotary scalings and head_dim
    parts = [p for p in describe_parts(model.config) if not p.startswith(held)]
    if parts:
        # the Llama family's model types (their adapters import this module, so ask the table)
        others = ", ".join(t for t, where in ARCHITECTURES.items() if ":" in where)
        raise ConfigError(
            f"a Llama with {parts[0]} cannot be saved as LlamaForCausalLM (model.arch is "
            f"{model.config.arch!r}; the Hugging Face model types that hold it: {others})"
        )
    state = to_hf(layout(model.config), model.state_dict())
    write_hf_folder(path, config_to_hf(model.config), state, max_shard_size=max_shard_size)
