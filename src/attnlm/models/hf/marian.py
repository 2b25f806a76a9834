"""The Hugging Face Marian layout (``MarianMTModel.save_pretrained``) <-> our encoder-decoder
Transformer (:mod:`attnlm.models.transformer`): the config translation both ways (with
``generation_config.json``) and the weight table.

config.json: ``d_model``, ``encoder_layers``, ``decoder_layers``, ``encoder_attention_heads``,
``encoder_ffn_dim``, ..., ``activation_function`` ("swish" in the OPUS-MT models),
``scale_embedding``, ``normalize_before`` absent (post-norm),
``share_encoder_decoder_embeddings``, ``decoder_vocab_size``, ``pad_token_id`` =
``decoder_start_token_id``, ``eos_token_id``. Weights: ``model.shared.weight`` (one matrix for
both sides and the LM head when shared), ``model.encoder.layers.{i}.self_attn.{q,k,v,out}_proj``,
``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``; decoder layers also
``encoder_attn.*`` and ``encoder_attn_layer_norm``; ``final_logits_bias`` ``(1, V)``; the
sinusoidal position tables are not stored. Attention projections are separate q, k, v
``(C, C)`` each; ours are fused: ``qkv_proj`` ``(3C, C)``, cross-attention ``kv_proj``
``(2C, C)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlm.base.errors import ConfigError
from attnlm.models.hf.folder import (
    load_hf_weights,
    read_generation_config,
    read_hf_config,
    write_hf_folder,
)
from attnlm.models.hf.mapping import (
    ACT_FROM_HF,
    ACT_TO_HF,
    WEIGHT,
    WHOLE,
    Layout,
    Rule,
    activation_from_hf,
    layers,
    to_hf,
)
from attnlm.models.transformer import Transformer, TransformerConfig

MODEL_TYPE = "marian"

_ACT_FROM_HF = {**ACT_FROM_HF, "swish": "silu", "silu": "silu"}  # Marian's "swish" is SiLU
_ACT_TO_HF = {**ACT_TO_HF, "silu": "swish"}

LAYER = [  # one layer of either stack: ours {encoder,decoder}.{i}.*, Marian's model.*.layers.{i}.*
    Rule("ln_1", "self_attn_layer_norm"),
    Rule("attn.qkv_proj", tuple(f"self_attn.{p}_proj" for p in "qkv")),  # (3C, C)
    Rule("attn.out_proj", "self_attn.out_proj"),
    Rule("mlp.fc", "fc1"),
    Rule("mlp.proj", "fc2"),
    Rule("ln_2", "final_layer_norm"),
]
CROSS = [  # a decoder layer's cross-attention over the encoder output
    Rule("ln_cross", "encoder_attn_layer_norm"),
    Rule("cross_attn.q_proj", "encoder_attn.q_proj"),
    Rule("cross_attn.kv_proj", tuple(f"encoder_attn.{p}_proj" for p in "kv")),  # (2C, C)
    Rule("cross_attn.out_proj", "encoder_attn.out_proj"),
]
SHARED = [Rule("src_emb", "model.shared", WEIGHT, also=("model.encoder.embed_tokens",))]
SEPARATE = [
    Rule("src_emb", "model.encoder.embed_tokens", WEIGHT),
    Rule("tgt_emb", "model.decoder.embed_tokens", WEIGHT),
]
LOGITS_BIAS = Rule("logits_bias", "final_logits_bias", WHOLE, row=True, optional=True)
HEAD = Rule("lm_head", "lm_head", WEIGHT)
# tied copies of the shared matrix, and the position tables (recomputed)
COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
          "model.shared.weight", "*embed_positions.weight")  # fmt: skip


def layout(config: TransformerConfig) -> Layout:
    """Every Marian weight of a model with this config."""
    c = config
    rules = SHARED if c.share_embeddings else SEPARATE
    rules = rules + layers(LAYER, c.n_encoder_layers, "encoder.{i}.", "model.encoder.layers.{i}.")
    rules += layers(LAYER + CROSS, c.n_decoder_layers, "decoder.{i}.", "model.decoder.layers.{i}.")
    rules += [LOGITS_BIAS] if c.tie_output else [LOGITS_BIAS, HEAD]
    tied = ("tgt_emb.weight",) if c.share_embeddings else ()  # the same module as src_emb
    return Layout(
        "Marian",
        rules,
        ignore=(*COPIES, "lm_head.weight") if c.tie_output else COPIES,
        tied=(*tied, "lm_head.weight") if c.tie_output else tied,
        defaults={"logits_bias": torch.zeros(c.vocab_size)},  # Marian always stores one
    )


def config_from_hf(
    hf: dict, generation: dict | None = None, where: str = "config.json"
) -> dict[str, Any]:
    """The fields of our ``TransformerConfig`` from a Marian ``config.json`` (and
    ``generation_config.json``) dict; layouts we do not implement are ConfigErrors."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'marian'")
    generation = generation or {}
    if hf.get("normalize_before", False) or hf.get("normalize_embedding", False):
        raise ConfigError(f"{where}: pre-norm or embedding-norm Marian layouts are not supported")
    if hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads"):
        raise ConfigError(f"{where}: encoder and decoder head counts differ")
    if hf.get("encoder_ffn_dim") != hf.get("decoder_ffn_dim"):
        raise ConfigError(f"{where}: encoder and decoder feed-forward widths differ")
    act = activation_from_hf(hf, "activation_function", "gelu", where, _ACT_FROM_HF)
    try:
        shared = bool(hf.get("share_encoder_decoder_embeddings", True))
        vocab = int(hf["vocab_size"])
        dec_vocab = int(hf.get("decoder_vocab_size") or vocab)
        pad = int(hf["pad_token_id"])
        eos = hf.get("eos_token_id", 0)
        eos = int(eos[0] if isinstance(eos, list) else eos)
        start = int(generation.get("decoder_start_token_id", hf.get("decoder_start_token_id", pad)))
        bad = generation.get("bad_words_ids", hf.get("bad_words_ids"))
        forced = generation.get("forced_eos_token_id", hf.get("forced_eos_token_id"))
        if bad not in (None, [[pad]]):
            raise ConfigError(f"{where}: bad_words_ids {bad!r}: only [[pad]] is supported")
        if isinstance(forced, list):  # one forced token (generate forces every listed one)
            if len(forced) != 1:
                raise ConfigError(f"{where}: forced_eos_token_id {forced!r}: one id is supported")
            forced = forced[0]
        forced = None if forced is None else int(forced)
        return dict(
            vocab_size=vocab if shared else dec_vocab,
            src_vocab_size=None if shared else vocab,
            d_model=int(hf["d_model"]),
            n_head=int(hf["encoder_attention_heads"]),
            n_encoder_layers=int(hf["encoder_layers"]),
            n_decoder_layers=int(hf["decoder_layers"]),
            d_ff=int(hf["encoder_ffn_dim"]),
            norm="post",
            activation=act,
            dropout=float(hf.get("dropout", 0.0)),
            attention_dropout=float(hf.get("attention_dropout", 0.0)),
            share_embeddings=shared,
            tie_output=bool(hf.get("tie_word_embeddings", True)),
            scale_embedding=bool(hf.get("scale_embedding", False)),
            positions_layout="split",
            final_logits_bias=True,
            layer_norm_eps=1e-5,
            pad_id=pad,
            bos_id=start,
            eos_id=eos,
            mask_pad=bad is not None,
            force_eos=forced is not None,
            forced_eos_id=None if forced in (None, eos) else forced,
        )
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None


def config_to_hf(
    config: TransformerConfig, max_position_embeddings: int = 512
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Marian ``config.json`` dict and ``generation_config.json`` dict for our config."""
    c = config
    needs = {"norm": "post", "positions_layout": "split", "bias": True, "layer_norm_eps": 1e-5}
    for field, value in needs.items():
        if getattr(c, field) != value:
            raise ConfigError(
                f"model.{field}={getattr(c, field)!r} has no Marian equivalent (needs {value!r})"
            )
    if c.bos_id != c.pad_id:
        raise ConfigError("Marian starts decoding from the padding id: model.bos_id must equal "
                          "model.pad_id")  # fmt: skip
    if not c.tie_output:
        raise ConfigError("model.tie_output=false has no Marian equivalent")
    hf = {
        "architectures": ["MarianMTModel"],
        "model_type": MODEL_TYPE,
        "vocab_size": c.source_vocab,
        "decoder_vocab_size": c.vocab_size,
        "share_encoder_decoder_embeddings": c.share_embeddings,
        "d_model": c.d_model,
        "encoder_layers": c.n_encoder_layers,
        "decoder_layers": c.n_decoder_layers,
        "encoder_attention_heads": c.n_head,
        "decoder_attention_heads": c.n_head,
        "encoder_ffn_dim": c.d_ff or 4 * c.d_model,
        "decoder_ffn_dim": c.d_ff or 4 * c.d_model,
        "activation_function": _ACT_TO_HF[c.activation],
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": max_position_embeddings,
        "scale_embedding": c.scale_embedding,
        "pad_token_id": c.pad_id,
        "decoder_start_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "forced_eos_token_id": c.forced_eos if c.force_eos else None,
        "is_encoder_decoder": True,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    generation = {
        "decoder_start_token_id": c.bos_id,
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
        "forced_eos_token_id": c.forced_eos if c.force_eos else None,
        "bad_words_ids": [[c.pad_id]] if c.mask_pad else None,
        "max_length": max_position_embeddings,
    }
    return hf, {k: v for k, v in generation.items() if v is not None}


# -- the adapter: load(path) / save(model, path, max_position_embeddings) -------------------

MODEL = Transformer


def load(path: str | Path) -> Transformer:
    """Load a ``MarianMTModel`` folder (``config.json`` with ``model_type: "marian"`` and
    ``model.safetensors`` or ``pytorch_model.bin``) into our encoder-decoder
    :class:`~attnlm.models.transformer.Transformer`, in eval mode. The decoding settings
    (``bad_words_ids`` = padding, ``forced_eos_token_id``) follow ``generation_config.json``
    when the folder has one."""
    path = Path(path)
    fields = config_from_hf(read_hf_config(path), read_generation_config(path), str(path))
    config = TransformerConfig(**fields)
    return load_hf_weights(Transformer(config), path, layout(config))


def save(model: Transformer, path: str | Path, max_position_embeddings: int = 512) -> None:
    """Write ``model`` as a ``MarianMTModel`` folder (``config.json``,
    ``generation_config.json``, ``model.safetensors``) that
    ``transformers.MarianMTModel.from_pretrained`` loads."""
    hf_config, generation = config_to_hf(model.config, max_position_embeddings)
    state = to_hf(layout(model.config), model.state_dict())
    write_hf_folder(path, hf_config, state, generation)
