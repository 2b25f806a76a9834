"""BERT: a bidirectional transformer encoder trained by masked-language modelling
(Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers").

token ids -> token + position + token-type embeddings -> LayerNorm -> N post-LN transformer
blocks (self-attention over every unpadded token, GELU feed-forward) -> hidden states; on top,
a pooler (``tanh(W h_[CLS] + b)``) and the masked-LM head (dense + GELU + LayerNorm, then a
decoder tied to the token embedding, plus a bias).

The file reads top to bottom: the config, the embeddings, block and MLM head BERT builds, the
model, the registry entry. Blocks, attention and masks come from
:mod:`attnlm.nn`; the output record and loss from :mod:`attnlm.models.base`.

Shape legend
    B  batch size
    T  tokens
    C  model width (n_embd)
    H  heads
    V  vocabulary size
    N  predicted (masked) positions in a batch
    L  layers
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import above_zero, fraction, one_of, positive
from attnlm.models.base import (
    IGNORE_INDEX,
    Family,
    ModelOutput,
    check_ids,
    check_targets,
    count_params,
)
from attnlm.nn.attention import MultiHeadAttention, padding_mask
from attnlm.nn.blocks import ACTIVATIONS, FeedForward, PostNormBlock, dropout_layer


@dataclass(frozen=True)
class BertConfig:
    """Shape and options of a :class:`Bert` encoder. Invalid values raise
    :class:`~attnlm.base.errors.ConfigError` naming the field (``model.<field>``).

    ``block_size`` is BERT's ``max_position_embeddings`` (the longest input); ``d_ff`` its
    ``intermediate_size`` (None: 4C); ``type_vocab_size`` the number of segment (token-type)
    ids; ``pooler`` / ``mlm_head`` whether those parts exist (a published encoder may
    lack the MLM head, a published masked LM the pooler; a fresh model has no
    pooler by default: masked-LM training gives it no gradient); ``whole_word_masking`` is
    read by the masked-LM objective."""

    vocab_size: int
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    d_ff: int | None = None
    type_vocab_size: int = 2
    dropout: float = 0.1
    activation: str = "gelu"  # "gelu" (erf, BERT's) | "gelu_tanh" | "relu"
    layer_norm_eps: float = 1e-12
    pad_id: int = 0
    pooler: bool = False  # unused by masked-LM training (no gradient; DDP would refuse it)
    mlm_head: bool = True
    whole_word_masking: bool = False

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "type_vocab_size")
        positive(self, "d_ff", optional=True)
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        one_of(self, "activation", ACTIVATIONS)
        fraction(self, "dropout")
        above_zero(self, "layer_norm_eps")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"model.pad_id {self.pad_id} is outside the vocabulary")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class BertEmbeddings(nn.Module):
    """``LN(E_tok[ids] + E_pos[0..T-1] + E_type[token_type_ids])`` then dropout:
    ``(B, T) -> (B, T, C)``."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos = nn.Embedding(c.block_size, c.n_embd)
        self.types = nn.Embedding(c.type_vocab_size, c.n_embd)
        self.ln = nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps)
        self.drop = dropout_layer(c.dropout)

    def forward(self, ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        T = ids.shape[1]
        x = self.tok(ids) + self.pos.weight[:T]  # (B, T, C)
        if token_type_ids is None:
            x = x + self.types.weight[0]
        else:
            x = x + self.types(token_type_ids)
        return self.drop(self.ln(x))


class MaskedLMHead(nn.Module):
    """BERT's prediction head: ``LN(act(h W + b)) E_tok^T + bias``, ``(..., C) -> (..., V)``;
    the decoder matrix is the token embedding (tied), the bias is the head's own."""

    def __init__(self, c: BertConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(c.n_embd, c.n_embd)
        self.act = ACTIVATIONS[c.activation]
        self.ln = nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps)
        self.decoder = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.decoder.weight = embedding.weight  # (V, C), tied
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        h = self.ln(self.act(self.dense(h)))
        return nn.functional.linear(h, self.decoder.weight, self.bias)  # one fused addmm


def bert_block(c: BertConfig) -> PostNormBlock:
    """One BERT block, post-norm: ``x = LN(x + attn(x))``, ``x = LN(x + MLP(x))``, with
    bidirectional self-attention and a GELU MLP."""
    return PostNormBlock(
        MultiHeadAttention(c.n_embd, c.n_head, dropout=c.dropout),
        FeedForward(c.n_embd, c.d_ff, activation=c.activation, dropout=c.dropout),
        sa_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps),
        mlp_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps),
        dropout=c.dropout,
    )


class Bert(nn.Module):
    """Bidirectional transformer encoder with a pooler and a masked-LM head (BERT).

    ``forward(ids (B, T), targets=None, attention_mask=None, token_type_ids=None) ->
    ModelOutput``. Module names: ``embeddings`` (:class:`BertEmbeddings`), ``blocks`` (L
    :func:`bert_block`), ``pooler`` (Linear, or None),
    ``head`` (:class:`MaskedLMHead`, or None). Padding is masked out of attention by
    ``attention_mask``; positions always count from 0 (right padding, as BERT).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embeddings = BertEmbeddings(c)
        self.blocks = nn.ModuleList(bert_block(c) for _ in range(c.n_layer))
        self.pooler = nn.Linear(c.n_embd, c.n_embd) if c.pooler else None
        self.head = MaskedLMHead(c, self.embeddings.tok) if c.mlm_head else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """BERT initialisation: N(0, 0.02) weights, zero biases, LayerNorm (1, 0)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    # -- forward -------------------------------------------------------------------------------

    def encode(
        self,
        ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The encoder alone: last hidden state ``(B, T, C)``, per-layer attention weights
        ``(B, H, T, T)`` (when asked) and the ``L + 1`` hidden states (when asked)."""
        check_ids(ids, self.config.vocab_size)
        B, T = ids.shape
        if T > self.config.block_size:
            raise InputError(
                f"{T} tokens are more than the model's {self.config.block_size} positions "
                "(model.block_size); truncate the input"
            )
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and tuple(t.shape) != (B, T):
                raise InputError(
                    f"{name} must have the shape of ids {(B, T)}, got {tuple(t.shape)}"
                )
        if (
            token_type_ids is not None
            and token_type_ids.device.type == "cpu"
            and int(token_type_ids.max()) >= self.config.type_vocab_size
        ):
            raise InputError(
                f"token type {int(token_type_ids.max())} is out of range for "
                f"model.type_vocab_size={self.config.type_vocab_size}"
            )
        x = self.embeddings(ids, token_type_ids)
        mask = None
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            mask = padding_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
        attentions: list[Tensor] = []
        hidden: list[Tensor] = [x] if return_hidden else []
        for block in self.blocks:
            x, weights, _ = block(x, mask=mask, need_weights=return_attention)
            if return_attention:
                attentions.append(weights)
            if return_hidden:
                hidden.append(x)
        return x, attentions, hidden

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """Masked-LM logits and loss for ``ids`` ``(B, T)``.

        ``targets`` ``(B, T)``: the original token at masked positions, -100 elsewhere (the
        masked objective's batch). With targets, the head runs only at the N predicted
        positions and ``logits`` is ``(N, V)`` in row-major order of those positions (the
        other 85% of a batch cost nothing in the vocabulary projection); without targets, and
        under ``torch.compile`` (static shapes, one graph; the same loss), it is
        ``(B, T, V)``. ``attention_mask`` ``(B, T)`` (1/True at real tokens),
        ``token_type_ids`` ``(B, T)`` (segment A = 0, B = 1). A model without an MLM head (a
        ``BertModel`` folder) returns the last hidden state as ``logits`` when no targets are
        given, and refuses targets.
        """
        x, attentions, hidden = self.encode(
            ids, attention_mask, token_type_ids, return_attention, return_hidden
        )
        loss = loss_sum = n_targets = None
        if targets is not None:
            if self.head is None:
                raise InputError(
                    "this BERT has no masked-LM head (a Hugging Face BertModel folder, e.g. "
                    "MiniLM); masked-LM needs a BertForMaskedLM folder or an attnlm checkpoint"
                )
            check_targets(targets, ids)
            keep = targets != IGNORE_INDEX
            n_targets = keep.sum()
            if torch.compiler.is_compiling():
                # static shapes for one graph: the head at every position, padding ignored
                logits = self.head(x)  # (B, T, V)
                loss_sum = nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), targets.flatten(), reduction="sum"
                )
            else:
                picked = targets[keep]  # (N,)
                logits = self.head(x[keep])  # (N, V)
                loss_sum = nn.functional.cross_entropy(logits.float(), picked, reduction="sum")
            loss = loss_sum / n_targets.clamp(min=1)
        else:
            logits = self.head(x) if self.head is not None else x
        return ModelOutput(
            logits=logits,
            loss=loss,
            loss_sum=loss_sum,
            n_targets=n_targets,
            attentions=attentions if return_attention else None,
            hidden_states=hidden if return_hidden else None,
        )

    def pool(self, last_hidden: Tensor) -> Tensor:
        """BERT's pooler: ``tanh(W h_[CLS] + b)``, ``(B, T, C) -> (B, C)``."""
        if self.pooler is None:
            raise InputError("this BERT has no pooler (a BertForMaskedLM folder has none)")
        return torch.tanh(self.pooler(last_hidden[:, 0]))

    # -- utilities -----------------------------------------------------------------------------

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters (the tied decoder counted once); ``non_embedding`` leaves out
        the three embedding tables."""
        if not non_embedding:
            return count_params(self)
        e = self.embeddings
        return count_params(self, exclude=(e.tok, e.pos, e.types))


# -- registry entry ---------------------------------------------------------------------------


def _describe(c: BertConfig) -> str:
    parts = [p for p, on in (("pooler", c.pooler), ("MLM head", c.mlm_head)) if on]
    return (
        f"BERT, L={c.n_layer}, H={c.n_head}, d={c.n_embd}, vocab={c.vocab_size}, "
        f"positions={c.block_size}, {' + '.join(parts) or 'encoder only'}"
    )


FAMILY = Family(
    "bert", BertConfig, Bert, "masked", frozenset({"fill-mask", "embed"}), describe=_describe,
    description="bidirectional transformer encoder, masked LM (Devlin et al. 2019)",
)  # fmt: skip
