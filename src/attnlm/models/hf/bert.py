"""The Hugging Face BERT layout (``BertModel`` / ``BertForMaskedLM`` ``save_pretrained``) <->
our BERT (:mod:`attnlm.models.bert`): the config translation both ways and the weight table.

Weights: ``embeddings.{word,position,token_type}_embeddings.weight``, ``embeddings.LayerNorm``,
``encoder.layer.{i}.attention.self.{query,key,value}`` (separate ``(C, C)`` projections, fused
into our ``qkv_proj`` ``(3C, C)``), ``attention.output.dense``, ``attention.output.LayerNorm``,
``intermediate.dense``, ``output.dense``, ``output.LayerNorm``, ``pooler.dense``; under
``bert.`` in task models, whose MLM head is ``cls.predictions.transform.dense``,
``cls.predictions.transform.LayerNorm``, ``cls.predictions.bias`` (and the tied
``cls.predictions.decoder.weight`` / ``.bias``). Old TF-converted checkpoints name LayerNorm
parameters ``gamma`` / ``beta``. Whether the pooler and the MLM head exist is read from the
weights (:func:`config_from_hf`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlm.base.errors import ConfigError
from attnlm.models.bert import Bert, BertConfig
from attnlm.models.hf.folder import (
    load_hf_weights,
    read_hf_config,
    read_hf_weights,
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

MODEL_TYPE = "bert"

EMBEDDINGS = [
    Rule("embeddings.tok", "embeddings.word_embeddings", WEIGHT),  # (V, C)
    Rule("embeddings.pos", "embeddings.position_embeddings", WEIGHT),  # (block_size, C)
    Rule("embeddings.types", "embeddings.token_type_embeddings", WEIGHT),
    Rule("embeddings.ln", "embeddings.LayerNorm"),
]
BLOCK = [  # one layer: ours blocks.{i}.*, BERT's encoder.layer.{i}.*
    Rule("attn.qkv_proj", tuple(f"attention.self.{n}" for n in ("query", "key", "value"))),
    Rule("attn.out_proj", "attention.output.dense"),
    Rule("ln_1", "attention.output.LayerNorm"),
    Rule("mlp.fc", "intermediate.dense"),
    Rule("mlp.proj", "output.dense"),
    Rule("ln_2", "output.LayerNorm"),
]
POOLER = [Rule("pooler", "pooler.dense")]
HEAD = [  # the MLM head of BertForMaskedLM, outside the bert. prefix
    Rule("head.dense", "cls.predictions.transform.dense", prefixed=False),
    Rule("head.ln", "cls.predictions.transform.LayerNorm", prefixed=False),
    Rule("head", "cls.predictions", ("bias",), prefixed=False),
    Rule(
        "embeddings.tok",
        "cls.predictions.decoder",
        WEIGHT,
        prefixed=False,
        copy=True,
        error="BERT weights: an untied MLM decoder is not supported",
    ),  # fmt: skip
]
# what a folder may hold that we do not load: position-id buffers, next-sentence prediction
IGNORE = ("*position_ids", "cls.seq_relationship*")
OLD_NAMES = ((r"^bert\.", ""), (r"\.gamma$", ".weight"), (r"\.beta$", ".bias"))


def layout(config: BertConfig) -> Layout:
    """Every BERT weight of a model with this config: ``BertForMaskedLM`` names (``bert.``
    prefix) with an MLM head, ``BertModel`` names without."""
    rules = EMBEDDINGS + layers(BLOCK, config.n_layer, "blocks.{i}.", "encoder.layer.{i}.")
    rules += POOLER if config.pooler else []
    rules += HEAD if config.mlm_head else []
    return Layout(
        "BERT",
        rules,
        prefix="bert." if config.mlm_head else "",
        renames=OLD_NAMES,
        # the decoder bias is the same tensor as cls.predictions.bias
        ignore=(*IGNORE, "cls.predictions.decoder.bias") if config.mlm_head else IGNORE,
        tied=("head.decoder.weight",),
    )


def config_from_hf(hf: dict, names: Iterable[str] = (), *, where: str = "config.json") -> dict:
    """The fields of our ``BertConfig`` from a BERT ``config.json`` dict and the names of the
    folder's weights (``pooler`` and ``mlm_head``: whether those weights are there)."""
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'bert'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(
            f"{where}: position_embedding_type={hf['position_embedding_type']!r} is not "
            "supported (only absolute)"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(f"{where}: decoder BERT / cross-attention is not supported")
    act = activation_from_hf(hf, "hidden_act", "gelu", where)
    names = {k.removeprefix("bert.") for k in names}
    try:
        return dict(
            vocab_size=hf["vocab_size"],
            block_size=hf.get("max_position_embeddings", 512),
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            n_embd=hf["hidden_size"],
            d_ff=hf.get("intermediate_size"),
            type_vocab_size=hf.get("type_vocab_size", 2),
            dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            activation=act,
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pad_id=int(hf.get("pad_token_id") or 0),
            pooler="pooler.dense.weight" in names,
            mlm_head="cls.predictions.transform.dense.weight" in names,
        )
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None


def config_to_hf(config: BertConfig) -> dict[str, Any]:
    """A BERT ``config.json`` dict for our config."""
    arch = "BertForMaskedLM" if config.mlm_head else "BertModel"
    return {
        "architectures": [arch],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": config.d_ff or 4 * config.n_embd,
        "hidden_act": ACT_TO_HF[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.block_size,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": 0.02,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "dtype": "float32",
    }


# -- the adapter: load(path) / save(model, path) --------------------------------------------

MODEL = Bert


def load(path: str | Path) -> Bert:
    """Load a Hugging Face ``BertModel`` folder (no MLM head: the model gets
    ``mlm_head=False`` and can embed, not fill masks) or ``BertForMaskedLM`` /
    ``BertForPreTraining`` folder (``config.json`` and ``model.safetensors`` or
    ``pytorch_model.bin``) into our :class:`~attnlm.models.bert.Bert`, in eval mode."""
    path = Path(path)
    hf = read_hf_config(path)
    weights = read_hf_weights(path)
    config = BertConfig(**config_from_hf(hf, weights, where=str(path / "config.json")))
    return load_hf_weights(Bert(config), path, layout(config), weights)


def save(model: Bert, path: str | Path) -> None:
    """Write a Hugging Face folder: ``BertForMaskedLM`` layout (``bert.`` prefix, ``cls.
    predictions`` head, plus the pooler when present, which ``BertForMaskedLM`` ignores)
    when the model has an MLM head, else ``BertModel`` layout."""
    state = to_hf(layout(model.config), model.state_dict())
    write_hf_folder(path, config_to_hf(model.config), state)
