"""GPT: a decoder-only transformer language model (Radford et al., 2018, 2019).

token ids -> token embedding (+ absolute positions) -> N transformer blocks with causal
self-attention -> final layer norm -> LM head (tied to the token embedding) -> logits.

The file reads top to bottom: the config, the model with its loss and decoding state, its
Hugging Face GPT-2 import/export (the layout itself is :mod:`attnlm.models.hf.gpt2`), and the
registry entry. The shared parts (attention,
positions, blocks) come from :mod:`attnlm.nn`, the output record and loss from
:mod:`attnlm.models.base`.

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

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.errors import ConfigError, InputError
from attnlm.models.base import (
    Decoding,
    Family,
    ModelOutput,
    check_ids,
    check_targets,
    count_params,
    token_loss,
)
from attnlm.models.hf import gpt2
from attnlm.models.hf.folder import load_hf_weights, read_hf_config, write_hf_folder
from attnlm.models.hf.mapping import to_hf
from attnlm.nn.attention import SCORES, KVCache, causal_mask, combine_masks, padding_mask
from attnlm.nn.blocks import ACTIVATIONS, NORMS, TransformerBlock, dropout_layer
from attnlm.nn.positional import (
    POSITIONS,
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)
from attnlm.nn.static_cache import StaticKVCache


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


class GPT(nn.Module):
    """Decoder-only transformer language model with GPT-2 initialisation.

    ``forward(ids (B, T)) -> GPTOutput``. Module names: ``tok_emb`` (token embedding),
    ``pos_emb`` (learned or sinusoidal positions, else None), ``rotary`` / ``alibi`` (relative
    schemes, else None), ``blocks`` (L :class:`~attnlm.nn.blocks.TransformerBlock`),
    ``ln_f`` (final norm; identity for post-norm, whose blocks already end in a norm),
    ``lm_head``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb: nn.Module | None = None
        self.rotary: RotaryEmbedding | None = None
        self.alibi: ALiBi | None = None
        if c.positions == "learned":
            self.pos_emb = LearnedPositionalEmbedding(c.block_size, c.n_embd)
        elif c.positions == "sinusoidal":
            self.pos_emb = SinusoidalPositionalEncoding(c.n_embd)
        elif c.positions == "rope":
            self.rotary = RotaryEmbedding(c.head_dim, base=c.rope_base)
        elif c.positions == "alibi":
            self.alibi = ALiBi(c.n_head)
        self.drop = dropout_layer(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.n_embd,
                c.n_head,
                d_ff=c.d_ff,
                norm=c.norm,
                activation=c.activation,
                dropout=c.dropout,
                bias=c.bias,
                eps=c.layer_norm_eps,
                score=c.attention_score,
            )
            for _ in range(c.n_layer)
        )
        self.ln_f = (
            nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias)
            if c.norm == "pre"
            else nn.Identity()
        )
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # (V, C), one matrix for both ends
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2L) (two residual adds per block)
        for block in self.blocks:
            for proj in (block.attn.out_proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2 initialisation: N(0, 0.02) weights, zero biases, LayerNorm (1, 0)."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # -- forward -------------------------------------------------------------------------------

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
    ) -> ModelOutput:
        """Logits for every position of ``ids`` ``(B, T)``, and the loss against ``targets``
        ``(B, T)`` (the next token at each position; -100 is not predicted).

        ``cache``: ``ids`` are only the new tokens; their positions continue after
        ``cache.position`` and the cache is updated in place. ``attention_mask``
        ``(B, S)`` bool, False at padding (left padding for batched prompts of different
        lengths); ``S`` covers the cached tokens too. With it, each row's positions count
        only its real tokens, so a left-padded row gives the same logits as the row alone.
        ``return_attention`` / ``return_hidden`` fill ``GPTOutput.attentions`` (this takes
        the explicit attention path) / ``GPTOutput.hidden_states``.
        """
        self._check_inputs(ids, cache)
        B, T = ids.shape
        fixed = getattr(cache, "fixed", False)  # a static state's compiled step (nn/static_cache)
        past = cache.length if cache is not None and not fixed else 0
        start = cache.position if cache is not None and not fixed else 0
        S = past + T

        if fixed:
            if attention_mask is not None or self.alibi is not None:
                raise InputError("a fixed decoding state takes no attention_mask and no ALiBi")
            positions = cache.positions(T)  # (T,) a device tensor: the same graph every step
        elif attention_mask is not None:
            if attention_mask.shape != (B, S):
                raise InputError(
                    f"attention_mask must be (B, cached + T) = {(B, S)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            attention_mask = attention_mask.bool()
            counted = attention_mask.long().cumsum(-1) - 1  # index among the row's real tokens
            positions = counted[:, -T:].clamp(min=0) + (start - past)  # (B, T)
        else:
            positions = torch.arange(start, start + T, device=ids.device)  # (T,)

        x = self.tok_emb(ids)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions).to(x.dtype)  # (T, C) or (B, T, C)
        x = self.drop(x)
        rotary = None
        if self.rotary is not None:
            cos, sin = self.rotary(positions)  # computed in float32, used in the model's dtype
            rotary = (cos.to(x.dtype), sin.to(x.dtype))
        if fixed:  # attend over the whole buffer, the slots not yet written masked
            mask, is_causal = cache.visible(T, x.dtype), False
        else:
            mask, is_causal = self._attention_mask(T, S, attention_mask, x.dtype)

        attentions: list[Tensor] = []
        hidden: list[Tensor] = [x]
        for layer, block in enumerate(self.blocks):
            x, weights, _ = block(
                x,
                mask=mask,
                is_causal=is_causal,
                rotary=rotary,
                cache=cache,
                layer=layer,
                need_weights=return_attention,
            )
            if return_attention:
                attentions.append(weights)
            if return_hidden:
                hidden.append(x)
        if cache is not None:
            cache.advance(T)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)

        loss = loss_sum = n_targets = None
        if targets is not None:
            check_targets(targets, ids)
            loss, loss_sum, n_targets = token_loss(logits, targets)
        return ModelOutput(
            logits=logits,
            loss=loss,
            loss_sum=loss_sum,
            n_targets=n_targets,
            attentions=attentions if return_attention else None,
            hidden_states=hidden if return_hidden else None,
        )

    def _check_inputs(self, ids: Tensor, cache: KVCache | None) -> None:
        """Shape, dtype and range of the token ids (:func:`~attnlm.models.base.check_ids`);
        a cache of the right depth."""
        check_ids(ids, self.config.vocab_size)
        if cache is not None and len(cache.keys) != self.config.n_layer:
            n = self.config.n_layer
            raise InputError(f"cache has {len(cache.keys)} layers, model.n_layer is {n}")

    def _attention_mask(
        self, t: int, s: int, keep: Tensor | None, dtype: torch.dtype
    ) -> tuple[Tensor | None, bool]:
        """The additive mask shared by all layers, and whether attention should still apply
        its own causal mask. Plain causal attention returns ``(None, True)`` so the fused
        kernel runs with ``is_causal=True`` and no T x T mask is built."""
        bias = self.alibi(t, s).to(dtype) if self.alibi is not None else None  # (H, T, S)
        pad = padding_mask(keep, dtype) if keep is not None else None  # (B, 1, 1, S)
        if bias is None and pad is None:
            if t == s or t == 1:
                return None, True
            return causal_mask(t, s, device=self.tok_emb.weight.device, dtype=dtype), False
        causal = causal_mask(t, s, device=self.tok_emb.weight.device, dtype=dtype)
        return combine_masks(bias, pad, causal), False

    # -- decoding state (docs/architecture.md) ---------------------------------------------

    def new_cache(self) -> KVCache:
        """An empty :class:`~attnlm.nn.attention.KVCache` with one slot per layer."""
        return KVCache(self.config.n_layer)

    def new_state(
        self, batch: dict[str, Tensor] | None = None, *, max_len: int | None = None
    ) -> KVCache:
        """Decoding state for a batch: for a decoder-only model, an empty KV cache (the
        prompt is fed through :meth:`step` like every later token). ``max_len``: a static
        state (:class:`~attnlm.nn.static_cache.StaticKVCache`) whose buffers hold that many
        positions, written in place."""
        if max_len is not None:
            return StaticKVCache(self.config.n_layer, max_len)
        return self.new_cache()

    def step(self, tokens: Tensor, state: KVCache) -> Tensor:
        """Feed new ``tokens`` ``(B, n)`` after what ``state`` holds; logits ``(B, n, V)``."""
        return self(tokens, cache=state).logits

    # -- utilities -----------------------------------------------------------------------------

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters (a tied matrix counted once). ``non_embedding`` leaves out the
        token and learned position embeddings (Kaplan et al., 2020 count)."""
        if not non_embedding:
            return count_params(self)
        exclude: tuple[nn.Module | None, ...] = (self.tok_emb, self.lm_head)
        if isinstance(self.pos_emb, LearnedPositionalEmbedding):
            exclude += (self.pos_emb,)
        return count_params(self, exclude=exclude)

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


def _positions(config: GPTConfig) -> str:
    """Each config chooses its position scheme (a named function: families pickle)."""
    return config.positions


FAMILY = Family(
    type="gpt",
    config=GPTConfig,
    model=GPT,
    objective="causal",
    capabilities=frozenset({"generate"}),
    description="decoder-only transformer LM (Radford et al. 2018, 2019)",
    hf_types=(gpt2.MODEL_TYPE,),
    describe=_describe,
    decoding=Decoding(positions=_positions, static_state=True, fixed_state=True, prefix_step=True),
)
