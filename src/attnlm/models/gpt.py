"""GPT: a decoder-only transformer language model (Radford et al., 2018, 2019).

token ids -> token embedding (+ absolute positions) -> N transformer blocks with causal
self-attention -> final layer norm -> LM head (tied to the token embedding) -> logits.

The file reads top to bottom: the config, the block (:func:`gpt_block`: LayerNorm, attention,
LayerNorm, MLP) and the positions, the model, its Hugging Face GPT-2 import/export (the layout
itself is :mod:`attnlm.models.hf.gpt2`), and the registry entry. The forward, loss and decoding
state are the causal decoder's (:mod:`attnlm.models.decoder`, shared with Llama); the parts
(attention, positions, blocks) come from :mod:`attnlm.nn`.

Shape legend
    B  batch size
    T  new tokens in this call (the whole sequence without a cache)
    S  tokens attended over: cached + T
    C  model width (n_embd)
    H  heads
    V  vocabulary size
    L  layers
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlm.errors import ConfigError
from attnlm.models.base import Family, ModelOutput
from attnlm.models.decoder import Decoder
from attnlm.models.hf import gpt2
from attnlm.models.hf.folder import load_hf_weights, read_hf_config, write_hf_folder
from attnlm.models.hf.mapping import to_hf
from attnlm.nn.attention import SCORES, MultiHeadAttention
from attnlm.nn.blocks import ACTIVATIONS, NORMS, FeedForward, TransformerBlock, block_class
from attnlm.nn.positional import (
    POSITIONS,
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)


@dataclass(frozen=True)
class GPTConfig:
    """Shape and options of a :class:`GPT`. Invalid values raise
    :class:`~attnlm.errors.ConfigError` naming the field (``model.<field>``)."""

    vocab_size: int
    block_size: int  # context length: the most positions a learned embedding covers
    n_layer: int
    n_head: int
    n_embd: int
    positions: str = "learned"  # "learned" | "sinusoidal" | "rope" | "alibi" | "none"
    norm: str = "pre"  # "pre": x + f(LN(x)) (GPT-2) | "post": LN(x + f(x)) (Vaswani et al.)
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers
    tie_embeddings: bool = True  # LM head shares the token embedding matrix
    activation: str = "gelu_tanh"  # "gelu" | "gelu_tanh" (GPT-2's "gelu_new") | "relu"
    d_ff: int | None = None  # feed-forward width; None means 4 * n_embd
    layer_norm_eps: float = 1e-5
    rope_base: float = 10000.0
    attention_score: str = "scaled_dot"  # "scaled_dot" | "dot" | "bilinear" | "additive"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        choices = {
            "positions": POSITIONS,
            "norm": NORMS,
            "activation": tuple(ACTIVATIONS),
            "attention_score": SCORES,
        }
        for name, known in choices.items():
            if getattr(self, name) not in known:
                raise ConfigError(
                    f"unknown model.{name} {getattr(self, name)!r} (known: {', '.join(known)})"
                )
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"model.positions 'rope' needs an even head width, got model.n_embd / "
                f"model.n_head = {self.head_dim}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.d_ff is not None and self.d_ff <= 0:
            raise ConfigError(f"model.d_ff must be a positive integer, got {self.d_ff}")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"model.layer_norm_eps must be > 0, got {self.layer_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


GPTOutput = ModelOutput  # what GPT.forward returns (see attnlm.models.base)


def gpt_block(c: GPTConfig) -> TransformerBlock:
    """One GPT-2 block: LayerNorm, causal self-attention, LayerNorm, the GELU MLP; pre-norm
    (GPT-2) or post-norm (Vaswani et al.) as ``c.norm`` says."""
    return block_class(c.norm)(
        MultiHeadAttention(
            c.n_embd, c.n_head, score=c.attention_score, bias=c.bias, dropout=c.dropout
        ),
        FeedForward(c.n_embd, c.d_ff, activation=c.activation, bias=c.bias, dropout=c.dropout),
        sa_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias),
        mlp_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias),
        dropout=c.dropout,
    )


def gpt_positions(c: GPTConfig) -> dict[str, nn.Module]:
    """The position module of ``c.positions``, under the name :class:`Decoder` takes it by:
    absolute ``pos_emb`` (learned, GPT-2; sinusoidal), ``rotary`` or ``alibi``; none for
    ``"none"``."""
    if c.positions == "learned":
        return {"pos_emb": LearnedPositionalEmbedding(c.block_size, c.n_embd)}
    if c.positions == "sinusoidal":
        return {"pos_emb": SinusoidalPositionalEncoding(c.n_embd)}
    if c.positions == "rope":
        return {"rotary": RotaryEmbedding(c.head_dim, base=c.rope_base)}
    if c.positions == "alibi":
        return {"alibi": ALiBi(c.n_head)}
    return {}


class GPT(Decoder):
    """Decoder-only transformer language model with GPT-2 initialisation.

    ``forward(ids (B, T)) -> GPTOutput`` (:class:`~attnlm.models.decoder.Decoder`'s). Module
    names: ``tok_emb`` (token embedding), ``pos_emb`` (learned or sinusoidal positions, else
    None), ``rotary`` / ``alibi`` (relative schemes, else None), ``blocks`` (L
    :func:`gpt_block`), ``ln_f`` (final norm; identity for post-norm, whose blocks already end
    in a norm), ``lm_head``.
    """

    def __init__(self, config: GPTConfig) -> None:
        c = config
        super().__init__(
            config,
            [gpt_block(c) for _ in range(c.n_layer)],
            ln_f=(
                nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias)
                if c.norm == "pre"
                else nn.Identity()
            ),
            **gpt_positions(c),
        )

    @classmethod
    def from_config_dict(cls, data: dict[str, Any]) -> GPT:
        """A fresh model from a ``[model]`` table (unknown keys and bad types are errors)."""
        from attnlm.config import from_dict

        return cls(from_dict(GPTConfig, data, where="model"))

    # -- Hugging Face GPT-2 folders (the layout: attnlm.models.hf.gpt2) ------------------------

    @classmethod
    def from_hf(cls, path: str | Path) -> GPT:
        """Load a GPT-2 checkpoint directory in Hugging Face layout (``config.json`` and
        ``model.safetensors`` or ``pytorch_model.bin``), in eval mode."""
        path = Path(path)
        config = GPTConfig(
            **gpt2.config_from_hf(read_hf_config(path), where=str(path / "config.json"))
        )
        return load_hf_weights(cls(config), path, gpt2.layout(config))

    def save_hf(self, path: str | Path) -> None:
        """Write this model as a Hugging Face GPT-2 checkpoint directory that
        ``transformers.GPT2LMHeadModel.from_pretrained`` loads."""
        hf_config = gpt2.config_to_hf(self.config)
        write_hf_folder(path, hf_config, to_hf(gpt2.layout(self.config), self.state_dict()))


# -- registry entry ---------------------------------------------------------------------------


def _describe(c: GPTConfig) -> str:
    return (
        f"GPT, L={c.n_layer}, H={c.n_head}, d={c.n_embd}, vocab={c.vocab_size}, "
        f"context={c.block_size}, positions={c.positions}, "
        f"tied={'yes' if c.tie_embeddings else 'no'}"
    )


FAMILY = Family(
    type="gpt",
    config=GPTConfig,
    model=GPT,
    objective="causal",
    capabilities=frozenset({"generate"}),
    description="decoder-only transformer LM (Radford et al. 2018, 2019)",
    hf_types=(gpt2.MODEL_TYPE,),
    describe=_describe,
)
