"""Llama: GPT's decoder with four changes (Touvron et al., 2023, "LLaMA"; Llama 2, Llama 3;
SmolLM, Mistral and Qwen share the layout).

token ids -> token embedding -> N blocks ``x + attn(RMSNorm(x))``, ``x + SwiGLU(RMSNorm(x))``
-> final RMSNorm -> LM head (untied by default) -> logits. The changes, each one of the
lectures' small ideas:

1. **RMSNorm** instead of LayerNorm: ``x / sqrt(mean(x²) + eps) · γ``, no centring, no bias
   (:func:`attnlm.nn.blocks.make_norm`);
2. a gated **SwiGLU** feed-forward ``(SiLU(x W_gate) ⊙ x W_up) W_down`` of width about
   ``8C/3`` (:class:`attnlm.nn.blocks.SwiGLU`; the default width follows Meta's rounding rule,
   :func:`llama_ffn_width`);
3. **rotary positions** with base ``rope_theta`` and optional Llama-3 frequency scaling
   (:class:`attnlm.nn.positional.RotaryEmbedding`), nothing added to the embeddings;
4. **grouped-query attention**: ``n_kv_head`` key/value heads shared by ``n_head`` query heads
   (:class:`attnlm.nn.attention.MultiHeadAttention`), so the KV cache holds
   ``n_kv_head / n_head`` of multi-head attention's keys and values.

No biases anywhere. Everything else (the causal forward with padding masks and a KV cache,
the decoding state, the loss) is GPT's: :class:`Llama` subclasses :class:`~attnlm.models.gpt.GPT`
and only builds different modules. Its linear layers, RMSNorms and rotary heads run on the CPU
training kernels of :mod:`attnlm.nn.fused` (the same numbers, hand-written backwards).
Parameters: attention ``2C² + 2C² · n_kv_head / n_head``, feed-forward ``3 C F``, two RMSNorms
``2C`` per block; embedding ``V C`` (and ``V C`` for an untied head), final norm ``C``.

Shape legend
    B  batch size
    T  new tokens in this call
    C  model width (n_embd)
    H  query heads, Hkv key/value heads
    F  feed-forward width
    V  vocabulary size
    L  layers
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlm.errors import ConfigError
from attnlm.models.base import Decoding, Family
from attnlm.models.gpt import GPT
from attnlm.models.hf import llama as hf_llama
from attnlm.models.hf.folder import load_hf_weights, read_hf_config, write_hf_folder
from attnlm.models.hf.mapping import to_hf
from attnlm.nn import fused
from attnlm.nn.blocks import TransformerBlock, dropout_layer, make_norm
from attnlm.nn.positional import ROPE_SCALING_KEYS, RotaryEmbedding


def llama_ffn_width(d_model: int, multiple_of: int = 256) -> int:
    """Meta's feed-forward width: ``2/3`` of ``4C`` (three matrices instead of two, the same
    weights), rounded up to a multiple of ``multiple_of``."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and options of a :class:`Llama`. Invalid values raise
    :class:`~attnlm.errors.ConfigError` naming the field (``model.<field>``)."""

    vocab_size: int
    block_size: int  # context length (max_position_embeddings)
    n_layer: int
    n_head: int
    n_embd: int
    n_kv_head: int | None = None  # key/value heads; None: n_head (MHA); 1: MQA; else GQA
    d_ff: int | None = None  # SwiGLU width; None: llama_ffn_width(n_embd, multiple_of)
    multiple_of: int = 256
    rope_theta: float = 10000.0
    # Llama 3.1 scaling: {rope_type = "llama3", factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings}; None for plain RoPE
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    dropout: float = 0.0
    bos_id: int | None = None  # kept for the Hugging Face config.json
    eos_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "multiple_of"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"rotary positions need an even head width, got {self.head_dim}")
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        kv = self.n_kv_head
        if not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0 or self.n_head % kv:
            raise ConfigError(
                f"model.n_kv_head ({kv!r}) must be a positive divisor of model.n_head "
                f"({self.n_head})"
            )
        if self.d_ff is not None and self.d_ff <= 0:
            raise ConfigError(f"model.d_ff must be a positive integer, got {self.d_ff}")
        if self.rope_theta <= 0:
            raise ConfigError(f"model.rope_theta must be > 0, got {self.rope_theta}")
        if self.rms_norm_eps <= 0:
            raise ConfigError(f"model.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.rope_scaling is not None:
            self._check_scaling(self.rope_scaling)

    @staticmethod
    def _check_scaling(scaling: dict[str, Any]) -> None:
        kind = scaling.get("rope_type")
        if kind != "llama3":
            raise ConfigError(f"model.rope_scaling.rope_type must be 'llama3', got {kind!r}")
        unknown = sorted(set(scaling) - {"rope_type", *ROPE_SCALING_KEYS})
        if unknown:
            raise ConfigError(f"unknown key model.rope_scaling.{unknown[0]}")
        for key in ROPE_SCALING_KEYS:
            value = scaling.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.rope_scaling.{key} must be a positive number")
        if scaling["low_freq_factor"] >= scaling["high_freq_factor"]:
            raise ConfigError("model.rope_scaling.low_freq_factor must be below high_freq_factor")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_width(self) -> int:
        """The SwiGLU width ``F``: ``d_ff`` or Meta's rounding rule."""
        return self.d_ff or llama_ffn_width(self.n_embd, self.multiple_of)

    @property
    def positions(self) -> str:
        """Rotary (relative) positions: decoding may slide past ``block_size``."""
        return "rope"


class Llama(GPT):
    """Llama decoder-only LM. Module names as GPT's: ``tok_emb``, ``rotary``, ``blocks``
    (L :class:`~attnlm.nn.blocks.TransformerBlock` with RMSNorm, SwiGLU and ``n_kv_head``
    key/value heads), ``ln_f`` (RMSNorm), ``lm_head``. ``forward``, ``step``,
    ``new_state`` and the loss are :class:`~attnlm.models.gpt.GPT`'s."""

    def __init__(self, config: LlamaConfig) -> None:
        nn.Module.__init__(self)  # GPT's modules are not built: only its methods are shared
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = None  # nothing added to the embeddings: positions are rotations
        self.alibi = None
        scaling = {k: v for k, v in (c.rope_scaling or {}).items() if k != "rope_type"}
        self.rotary = RotaryEmbedding(c.head_dim, base=c.rope_theta, scaling=scaling or None)
        self.drop = dropout_layer(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.n_embd,
                c.n_head,
                d_ff=c.ffn_width,
                norm="pre",
                norm_type="rms",
                feed_forward="swiglu",
                n_kv_head=c.n_kv_head,
                dropout=c.dropout,
                bias=False,
                eps=c.rms_norm_eps,
                onednn_linear=True,
            )
            for _ in range(c.n_layer)
        )
        self.ln_f = make_norm("rms", c.n_embd, eps=c.rms_norm_eps)
        self.lm_head = fused.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # (V, C)
        self.apply(self._init_weights)  # N(0, 0.02) as Hugging Face's initializer_range
        for block in self.blocks:  # residual projections scaled by 1/sqrt(2L), as GPT-2
            for proj in (block.attn.out_proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @classmethod
    def from_config_dict(cls, data: dict[str, Any]) -> Llama:
        """A fresh model from a ``[model]`` table (unknown keys and bad types are errors)."""
        from attnlm.config import from_dict

        return cls(from_dict(LlamaConfig, data, where="model"))

    # -- Hugging Face Llama folders (the layout: attnlm.models.hf.llama) -----------------------

    @classmethod
    def from_hf(cls, path: str | Path) -> Llama:
        """Load a ``LlamaForCausalLM`` folder (``config.json`` and ``model.safetensors``,
        sharded safetensors with ``model.safetensors.index.json``, or ``pytorch_model.bin``),
        in eval mode."""
        path = Path(path)
        fields = hf_llama.config_from_hf(read_hf_config(path), where=str(path / "config.json"))
        config = LlamaConfig(**fields)
        return load_hf_weights(cls(config), path, hf_llama.layout(config))

    def save_hf(self, path: str | Path, max_shard_size: int | None = None) -> None:
        """Write this model as a Hugging Face Llama folder that
        ``transformers.LlamaForCausalLM.from_pretrained`` loads; with ``max_shard_size``
        (bytes) the weights are sharded with an index file when larger."""
        state = to_hf(hf_llama.layout(self.config), self.state_dict())
        write_hf_folder(
            path, hf_llama.config_to_hf(self.config), state, max_shard_size=max_shard_size
        )


# -- registry entry ---------------------------------------------------------------------------


def _describe(c: LlamaConfig) -> str:
    kind = "MHA" if c.n_kv_head == c.n_head else "MQA" if c.n_kv_head == 1 else "GQA"
    return (
        f"Llama, L={c.n_layer}, H={c.n_head}, Hkv={c.n_kv_head} ({kind}), d={c.n_embd}, "
        f"d_ff={c.ffn_width}, vocab={c.vocab_size}, context={c.block_size}, "
        f"rope_theta={c.rope_theta:g}, tied={'yes' if c.tie_embeddings else 'no'}"
    )


FAMILY = Family(
    type="llama",
    config=LlamaConfig,
    model=Llama,
    objective="causal",
    capabilities=frozenset({"generate"}),
    description="Llama decoder: RMSNorm, SwiGLU, RoPE, grouped-query attention "
    "(Touvron et al. 2023)",
    hf_types=(hf_llama.MODEL_TYPE,),
    describe=_describe,
    decoding=Decoding(positions="rope", static_state=True, fixed_state=True, prefix_step=True),
)
