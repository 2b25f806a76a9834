"""GPT: a decoder-only transformer language model (Radford et al., 2018, 2019).

token ids -> token embedding (+ absolute positions) -> N transformer blocks with causal
self-attention -> final layer norm -> LM head (tied to the token embedding) -> logits.

The file reads top to bottom: the config, the block (:func:`gpt_block`: LayerNorm, attention,
LayerNorm, MLP) and the positions, the model, and the registry entry. The forward, loss and
decoding state are the causal decoder's (:mod:`attnlm.models.decoder`, shared with Llama); the
parts (attention, positions, blocks) come from :mod:`attnlm.nn`.

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
from typing import Any

from torch import nn

from attnlm.base.errors import ConfigError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import above_zero, fraction, one_of, positive
from attnlm.models.base import Decoding, Family, ModelOutput
from attnlm.models.decoder import Decoder
from attnlm.nn import fused
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
    :class:`~attnlm.base.errors.ConfigError` naming the field (``model.<field>``)."""

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
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        positive(self, "d_ff", optional=True)
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        one_of(self, "positions", POSITIONS)
        one_of(self, "norm", NORMS)
        one_of(self, "activation", ACTIVATIONS)
        one_of(self, "attention_score", SCORES)
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"model.positions 'rope' needs an even head width, got model.n_embd / "
                f"model.n_head = {self.head_dim}"
            )
        fraction(self, "dropout")
        above_zero(self, "layer_norm_eps")

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
        # every projection and the head on the CPU's faster float32 kernel (as Llama's)
        fused.use_onednn(self)

    @classmethod
    def from_config_dict(cls, data: dict[str, Any]) -> GPT:
        """A fresh model from a ``[model]`` table (unknown keys and bad types are errors)."""
        from attnlm.base.config import from_dict

        return cls(from_dict(GPTConfig, data, where="model"))


# -- registry entry ---------------------------------------------------------------------------


def _describe(c: GPTConfig) -> str:
    return (
        f"GPT, L={c.n_layer}, H={c.n_head}, d={c.n_embd}, vocab={c.vocab_size}, "
        f"context={c.block_size}, positions={c.positions}, "
        f"tied={'yes' if c.tie_embeddings else 'no'}"
    )


def _positions(config: GPTConfig) -> str:
    """Each config chooses its position scheme (a named function: families pickle)."""
    return config.positions


FAMILY = Family(
    "gpt", GPTConfig, GPT, "causal", frozenset({"generate"}), describe=_describe,
    description="decoder-only transformer LM (Radford et al. 2018, 2019)",
    decoding=Decoding(positions=_positions, static_state=True, fixed_state=True, prefix_step=True,
                      drafts=True),
)  # fmt: skip
