"""The Hugging Face GPT-2 layout (``GPT2LMHeadModel.save_pretrained``) <-> our GPT
(:mod:`attnlm.models.gpt`): the config translation both ways and the weight table.

``config.json`` has ``model_type: "gpt2"``, ``n_embd``, ``n_layer``, ``n_head``,
``n_positions``, ... ; the weights are ``transformer.wte.weight``,
``transformer.h.{i}.attn.c_attn.weight``, ... (``transformer.`` absent when a bare
``GPT2Model`` was saved). GPT-2's ``Conv1D`` layers store their weight as ``(in, out)``, the
transpose of ``nn.Linear``'s ``(out, in)``; ``c_attn`` is already our fused q, k, v
``(C, 3C)``. The tied LM head is not stored; old checkpoints also store the causal-mask
buffers ``attn.bias`` / ``attn.masked_bias``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlm.base.errors import ConfigError
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.hf.folder import (
    load_hf_weights,
    read_hf_config,
    write_hf_folder,
)
from attnlm.models.hf.mapping import (
    ACT_TO_HF,
    WEIGHT,
    Layout,
    Rule,
    activation_from_hf,
    layers,
    to_hf,
)

MODEL_TYPE = "gpt2"

EMBEDDINGS = [
    Rule("tok_emb", "wte", WEIGHT),  # (V, C)
    Rule("pos_emb", "wpe", WEIGHT),  # (block_size, C)
    Rule("ln_f", "ln_f"),
]
BLOCK = [  # one block: ours blocks.{i}.*, GPT-2's h.{i}.*; Conv1D weights transposed
    Rule("ln_1", "ln_1"),
    Rule("attn.qkv_proj", "attn.c_attn", transpose=True),  # (3C, C) <-> (C, 3C)
    Rule("attn.out_proj", "attn.c_proj", transpose=True),
    Rule("ln_2", "ln_2"),
    Rule("mlp.fc", "mlp.c_fc", transpose=True),
    Rule("mlp.proj", "mlp.c_proj", transpose=True),
]
HEAD = Rule("lm_head", "lm_head", WEIGHT, prefixed=False,
            error="GPT-2 weights are missing 'lm_head.weight' (untied embeddings)")  # fmt: skip

BUFFERS = ("*.attn.bias", "*.attn.masked_bias")  # causal-mask buffers of old checkpoints


def layout(config: GPTConfig) -> Layout:
    """Every GPT-2 weight of a model with this config (the LM head only when untied)."""
    tied = config.tie_embeddings
    return Layout(
        "GPT-2",
        EMBEDDINGS
        + layers(BLOCK, config.n_layer, "blocks.{i}.", "h.{i}.")
        + ([] if tied else [HEAD]),
        prefix="transformer.",
        renames=((r"^transformer\.", ""),),  # also read a bare GPT2Model's keys
        ignore=(*BUFFERS, "lm_head.weight") if tied else BUFFERS,  # a tied head's copy
        tied=("lm_head.weight",) if tied else (),
    )


def config_from_hf(hf: dict, *, where: str = "config.json") -> dict[str, Any]:
    """The fields of our ``GPTConfig`` from a GPT-2 ``config.json`` dict."""
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'gpt2'")
    unsupported = {
        "scale_attn_weights": (True, "unscaled attention"),
        "scale_attn_by_inverse_layer_idx": (False, "per-layer attention scaling"),
        "add_cross_attention": (False, "cross-attention"),
    }
    for key, (expected, what) in unsupported.items():
        if hf.get(key, expected) != expected:
            raise ConfigError(f"{where}: {key}={hf[key]!r} ({what}) is not supported")
    act = activation_from_hf(hf, "activation_function", "gelu_new", where)
    try:
        return dict(
            vocab_size=hf["vocab_size"],
            block_size=hf.get("n_positions", hf.get("n_ctx")),
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            positions="learned",
            norm="pre",
            dropout=float(hf.get("resid_pdrop", 0.0)),
            bias=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
            activation=act,
            d_ff=hf.get("n_inner"),
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        )
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """A GPT-2 ``config.json`` dict for our config; fields GPT-2 cannot express are errors."""
    needs = {"positions": "learned", "norm": "pre", "bias": True, "attention_score": "scaled_dot"}
    for field, value in needs.items():
        if getattr(config, field) != value:
            raise ConfigError(
                f"model.{field}={getattr(config, field)!r} has no GPT-2 equivalent "
                f"(the Hugging Face GPT-2 layout needs {field}={value!r})"
            )
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.d_ff,
        "activation_function": ACT_TO_HF[config.activation],
        "layer_norm_epsilon": config.layer_norm_eps,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.vocab_size - 1,
        "eos_token_id": config.vocab_size - 1,
        "dtype": "float32",
    }


# -- the adapter: load(path) / save(model, path) --------------------------------------------

MODEL = GPT


def load(path: str | Path) -> GPT:
    """Load a GPT-2 checkpoint directory in Hugging Face layout (``config.json`` and
    ``model.safetensors`` or ``pytorch_model.bin``) into our :class:`~attnlm.models.gpt.GPT`,
    in eval mode."""
    path = Path(path)
    config = GPTConfig(**config_from_hf(read_hf_config(path), where=str(path / "config.json")))
    return load_hf_weights(GPT(config), path, layout(config))


def save(model: GPT, path: str | Path) -> None:
    """Write ``model`` as a Hugging Face GPT-2 checkpoint directory that
    ``transformers.GPT2LMHeadModel.from_pretrained`` loads."""
    hf_config = config_to_hf(model.config)
    write_hf_folder(path, hf_config, to_hf(layout(model.config), model.state_dict()))
