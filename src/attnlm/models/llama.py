"""Llama: GPT's decoder with four changes (Touvron et al., 2023, "LLaMA"; Llama 2, Llama 3;
SmolLM, Mistral and Qwen share the layout).

token ids -> token embedding -> N blocks ``x + attn(RMSNorm(x))``, ``x + SwiGLU(RMSNorm(x))``
-> final RMSNorm -> LM head (untied by default) -> logits. The changes, each one of the
lectures' small ideas:

1. **RMSNorm** instead of LayerNorm: ``x / sqrt(mean(x²) + eps) · γ``, no centring, no bias
   (:class:`attnlm.nn.blocks.RMSNorm`);
2. a gated **SwiGLU** feed-forward ``(SiLU(x W_gate) ⊙ x W_up) W_down`` of width about
   ``8C/3`` (:class:`attnlm.nn.blocks.SwiGLU`; the default width follows Meta's rounding rule,
   :func:`llama_ffn_width`);
3. **rotary positions** with base ``rope_theta`` and optional Llama-3 frequency scaling
   (:class:`attnlm.nn.positional.RotaryEmbedding`), nothing added to the embeddings;
4. **grouped-query attention**: ``n_kv_head`` key/value heads shared by ``n_head`` query heads
   (:class:`attnlm.nn.attention.MultiHeadAttention`), so the KV cache holds
   ``n_kv_head / n_head`` of multi-head attention's keys and values.

No biases anywhere. Everything else (the causal forward with padding masks and a KV cache,
the decoding state, the loss) is the causal decoder GPT shares
(:class:`~attnlm.models.decoder.Decoder`): this file builds the blocks (:func:`llama_block`)
and the positions. Its linear layers, RMSNorms and rotary heads run on the CPU training
kernels of :mod:`attnlm.nn.fused` (the same numbers, hand-written backwards).
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
from typing import Any

import torch
from torch import nn

from attnlm.base.errors import ConfigError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import above_zero, fraction, one_of, positive
from attnlm.models.base import Decoding, Family
from attnlm.models.decoder import Decoder
from attnlm.nn import fused
from attnlm.nn.attention import MultiHeadAttention, ScaledScore
from attnlm.nn.blocks import (
    ClampedSwiGLU,
    GeGLU,
    RMSNorm,
    SandwichBlock,
    SwiGLU,
    TransformerBlock,
)
from attnlm.nn.moe import GATINGS, SparseMoE
from attnlm.nn.positional import ROPE_SCALING_KEYS, YARN_KEYS, RotaryEmbedding
from attnlm.nn.yarn import LONGROPE_KEYS

# the source architectures a Llama-family config may carry as its label (model.arch)
ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral", "qwen3moe", "mixtral",
         "smollm3", "granite", "olmo2", "olmo3", "gptoss")  # fmt: skip
ARCH_NAMES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma 2",
              "gemma3": "Gemma 3", "phi3": "Phi-3", "mistral": "Mistral",
              "qwen3moe": "Qwen3-MoE", "mixtral": "Mixtral", "smollm3": "SmolLM3",
              "granite": "Granite", "olmo2": "OLMo 2", "olmo3": "OLMo 3",
              "gptoss": "gpt-oss"}  # fmt: skip
LAYER_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's names
MLP_ACTS = ("silu", "gelu_tanh", "swiglu_oai")  # SwiGLU, GeGLU, gpt-oss's clamped SwiGLU


def gemma_embed_scale(width: int) -> float:
    """Gemma's embedding scale for ``model.embed_scale``: ``sqrt(n_embd)`` rounded to float32,
    as Gemma computes it in the model's dtype."""
    return float(torch.tensor(width**0.5, dtype=torch.float32))


def llama_ffn_width(d_model: int, multiple_of: int = 256) -> int:
    """Meta's feed-forward width: ``2/3`` of ``4C`` (three matrices instead of two, the same
    weights), rounded up to a multiple of ``multiple_of``."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


def _check_longrope(scaling: dict[str, Any], pairs: int) -> None:
    """LongRoPE's table: two lists of ``pairs`` positive factors, the original context and the
    context factor (positive numbers), an optional attention factor."""
    unknown = sorted(set(scaling) - {"rope_type", *LONGROPE_KEYS})
    if unknown:
        raise ConfigError(f"unknown key model.rope_scaling.{unknown[0]}")
    for key in LONGROPE_KEYS[:2]:
        values = scaling.get(key)
        if (not isinstance(values, (list, tuple)) or len(values) != pairs
                or any(type(v) not in (int, float) or not v > 0 for v in values)):  # fmt: skip
            raise ConfigError(f"model.rope_scaling.{key} must list {pairs} positive numbers "
                              f"(one per rotary pair)")  # fmt: skip
    for key in LONGROPE_KEYS[2:]:
        value = scaling.get(key)
        if (value is not None or key != "attention_factor") and (
            type(value) not in (int, float) or not value > 0
        ):
            raise ConfigError(f"model.rope_scaling.{key} must be a positive number")


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and options of a :class:`Llama`. Invalid values raise
    :class:`~attnlm.base.errors.ConfigError` naming the field (``model.<field>``)."""

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
    # original_max_position_embeddings}; {rope_type = "linear", factor}; YaRN's {rope_type =
    # "yarn", factor, original_max_position_embeddings, beta_fast?, beta_slow?,
    # attention_factor?}; None for plain RoPE
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    dropout: float = 0.0
    bos_id: int | None = None  # kept for exported configs
    eos_id: int | None = None
    # -- the parts other members of the family add (docs/llama.md; each default is Llama's) --
    arch: str = "llama"  # label of the source architecture (ARCHS): display and export only
    d_head: int | None = None  # head width D; None: n_embd // n_head
    rotary_dim: int | None = None  # features rotated per head, the first R of D (Phi-4 mini)
    qkv_bias: bool = False  # biases on q, k and v (Qwen2)
    attn_out_bias: bool = False  # a bias on the attention's output projection (gpt-oss)
    attn_sinks: bool = False  # a learned sink logit per head in every softmax (gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)
    qk_norm_all: bool = False  # with qk_norm: q's and k's norms span all heads at once (OLMo 2)
    sliding_window: int | None = None  # W: a sliding layer's query i sees keys i - W < j <= i
    layer_types: tuple[str, ...] | None = None  # per layer LAYER_TYPES; None: see layer_kinds
    rope_local_theta: float | None = None  # rotary base of the sliding layers (Gemma 3)
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(n_embd))
    post_norms: bool = False  # RMSNorms on the sublayer outputs before the residual adds
    pre_norms: bool = True  # False: no norms before the sublayers, post_norms only (OLMo 2)
    mlp_act: str = "silu"  # the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    attn_scale: float | None = None  # score scale; None: d_head ** -0.5
    attn_softcap: float | None = None  # scores -> cap tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits -> cap tanh(logits / cap) (Gemma 2)
    residual_scale: float | None = None  # sublayer outputs times this before the adds (Granite)
    logit_scale: float | None = None  # logits divided by this (Granite's logits_scaling)
    # a sparse mixture of experts in place of every block's feed-forward (attnlm.nn.moe):
    # n_expert SwiGLU experts of width d_ff, n_expert_used of them per token, their weights
    # renormalised to sum to one with moe_norm_topk (Mixtral, Qwen3-MoE); None: dense
    n_expert: int | None = None
    n_expert_used: int | None = None
    moe_norm_topk: bool = True
    # gpt-oss's routing ("topk_softmax": the softmax over the k chosen logits; attnlm.nn.moe)
    # and its biases on the router and every expert's three matrices
    moe_gating: str = "softmax"
    moe_bias: bool = False
    # layers without positions (NoPE): their q and k are not rotated (SmolLM3: every fourth
    # layer, 3, 7, 11, ...); None: every layer rotates
    nope_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "multiple_of")
        positive(self, "n_kv_head", "d_ff", "d_head", "sliding_window", "n_expert",
                 "n_expert_used", optional=True)  # fmt: skip
        if self.d_head is None and self.n_embd % self.n_head:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"rotary positions need an even head width, got {self.head_dim}")
        r = self.rotary_dim
        if r is not None and (type(r) is not int or not 0 < r <= self.head_dim or r % 2):
            raise ConfigError(f"model.rotary_dim must be an even number of features in 2.."
                              f"{self.head_dim} (the head width), got {r!r}")  # fmt: skip
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        kv = self.n_kv_head
        if self.n_head % kv:
            raise ConfigError(
                f"model.n_kv_head ({kv!r}) must be a positive divisor of model.n_head "
                f"({self.n_head})"
            )
        above_zero(self, "rope_theta", "rms_norm_eps")
        fraction(self, "dropout")
        if self.rope_scaling is not None:
            self._check_scaling(self.rope_scaling, self.rotary_width // 2)
        self._check_parts()

    def _check_parts(self) -> None:
        """The optional parts' fields (``model.<field>`` named in each error)."""
        if (self.n_expert is None) != (self.n_expert_used is None):
            raise ConfigError("model.n_expert and model.n_expert_used go together")
        if self.n_expert is not None and self.n_expert_used > self.n_expert:
            raise ConfigError(
                f"model.n_expert_used ({self.n_expert_used}) is more than model.n_expert "
                f"({self.n_expert})"
            )
        if self.n_expert is not None and self.mlp_act == "gelu_tanh":
            raise ConfigError("model.n_expert: experts are SwiGLU (model.mlp_act = 'silu' or "
                              "'swiglu_oai')")  # fmt: skip
        if self.n_expert is None and (self.moe_bias or self.moe_gating != "softmax"):
            raise ConfigError("model.moe_bias and model.moe_gating need model.n_expert")
        one_of(self, "arch", ARCHS)
        one_of(self, "mlp_act", MLP_ACTS)
        one_of(self, "moe_gating", GATINGS)
        if not self.pre_norms and not self.post_norms:
            raise ConfigError("model.pre_norms = false needs model.post_norms = true (OLMo 2's "
                              "blocks normalise the sublayers' outputs instead)")  # fmt: skip
        if self.qk_norm_all and not self.qk_norm:
            raise ConfigError("model.qk_norm_all needs model.qk_norm = true")
        if self.nope_layers is not None:
            self._check_nope(self.nope_layers)
        optional = ("rope_local_theta", "embed_scale", "attn_scale", "attn_softcap",
                    "final_softcap", "residual_scale", "logit_scale")  # fmt: skip
        above_zero(self, *(n for n in optional if getattr(self, n) is not None))
        if self.layer_types is not None:
            types = tuple(self.layer_types)
            object.__setattr__(self, "layer_types", types)
            if len(types) != self.n_layer:
                raise ConfigError(
                    f"model.layer_types has {len(types)} entries, model.n_layer is {self.n_layer}"
                )
            bad = [t for t in types if t not in LAYER_TYPES]
            if bad:
                raise ConfigError(
                    f"model.layer_types: unknown layer type {bad[0]!r} "
                    f"(known: {', '.join(LAYER_TYPES)})"
                )
            if "sliding_attention" in types and self.sliding_window is None:
                raise ConfigError(
                    "model.layer_types has sliding layers but no model.sliding_window"
                )

    def _check_nope(self, layers: Any) -> None:
        """``nope_layers``: distinct layer indices in ``[0, n_layer)``, kept as a sorted tuple."""
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise ConfigError("model.nope_layers must be a list of layer indices")
        found = tuple(layers)
        for i in found:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.n_layer:
                raise ConfigError(
                    f"model.nope_layers: {i!r} is not a layer index in [0, {self.n_layer})"
                )
        if len(set(found)) != len(found):
            raise ConfigError("model.nope_layers names a layer twice")
        object.__setattr__(self, "nope_layers", tuple(sorted(found)))

    def nope(self, layer: int) -> bool:
        """Whether ``layer`` attends without positions (its q and k are not rotated)."""
        return self.nope_layers is not None and layer in self.nope_layers

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Each layer's kind, ``"full_attention"`` or ``"sliding_attention"``: ``layer_types``,
        or every layer sliding when ``sliding_window`` is set, else every layer full."""
        if self.layer_types is not None:
            return tuple(self.layer_types)
        kind = LAYER_TYPES[1] if self.sliding_window is not None else LAYER_TYPES[0]
        return (kind,) * self.n_layer

    def window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (None: it sees every earlier token)."""
        return self.sliding_window if self.layer_kinds[layer] == LAYER_TYPES[1] else None

    @staticmethod
    def _check_scaling(scaling: dict[str, Any], pairs: int) -> None:
        kind = scaling.get("rope_type")
        if kind == "linear":
            unknown = sorted(set(scaling) - {"rope_type", "factor"})
            if unknown:
                raise ConfigError(f"unknown key model.rope_scaling.{unknown[0]}")
            factor = scaling.get("factor")
            if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
                raise ConfigError("model.rope_scaling.factor must be a positive number")
            return
        if kind == "yarn":
            unknown = sorted(set(scaling) - {"rope_type", *YARN_KEYS})
            if unknown:
                raise ConfigError(f"unknown key model.rope_scaling.{unknown[0]}")
            if scaling.get("truncate", True) not in (True, False):
                raise ConfigError("model.rope_scaling.truncate must be true or false")
            for key in YARN_KEYS[:-1]:
                value = scaling.get(key)
                needed = key in YARN_KEYS[:2]
                if (value is not None or needed) and (type(value) not in (int, float)
                                                      or not value > 0):  # fmt: skip
                    raise ConfigError(f"model.rope_scaling.{key} must be a positive number")
            return
        if kind == "longrope":
            _check_longrope(scaling, pairs)
            return
        if kind != "llama3":
            raise ConfigError(
                f"model.rope_scaling.rope_type must be 'llama3', 'linear', 'yarn' or 'longrope', "
                f"got {kind!r}"
            )
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
        """The head width ``D``: ``d_head``, or ``n_embd // n_head``."""
        return self.d_head or self.n_embd // self.n_head

    @property
    def rotary_width(self) -> int:
        """The features of each head q and k rotate, the first ``R`` of ``D``: ``rotary_dim``,
        or all of them."""
        return self.rotary_dim or self.head_dim

    @property
    def ffn_width(self) -> int:
        """The SwiGLU width ``F`` (each expert's, in a mixture of experts): ``d_ff`` or Meta's
        rounding rule."""
        return self.d_ff or llama_ffn_width(self.n_embd, self.multiple_of)


def llama_attention(c: LlamaConfig, layer: int) -> MultiHeadAttention:
    """Layer ``layer``'s grouped-query self-attention with the config's parts: head width,
    q/k/v biases (none on the output), q/k norms (each head's, or all heads' at once), its
    window, the score's scale and cap."""
    D = c.head_dim
    q_width, k_width = (c.n_head * D, c.n_kv_head * D) if c.qk_norm_all else (D, D)
    norm = (lambda w: RMSNorm(w, eps=c.rms_norm_eps)) if c.qk_norm else (lambda w: None)
    plain = c.attn_scale is None and c.attn_softcap is None
    return MultiHeadAttention(
        c.n_embd, c.n_head, n_kv_head=c.n_kv_head, d_head=c.d_head, bias=c.qkv_bias,
        out_bias=c.attn_out_bias, dropout=c.dropout, q_norm=norm(q_width),
        k_norm=norm(k_width), qk_norm_all=c.qk_norm_all, window=c.window(layer),
        nope=c.nope(layer), sinks=c.attn_sinks,
        score="scaled_dot" if plain else ScaledScore(c.attn_scale, c.attn_softcap),
    )  # fmt: skip


def llama_block(c: LlamaConfig, layer: int = 0) -> TransformerBlock:
    """One Llama block: RMSNorm, grouped-query self-attention (:func:`llama_attention`),
    RMSNorm, the gated feed-forward (SwiGLU, or GeGLU with ``mlp_act = "gelu_tanh"``);
    pre-norm, with ``post_norms`` also normalising each sublayer's output
    (:class:`~attnlm.nn.blocks.SandwichBlock`); without ``pre_norms`` the sublayers read the
    residual stream itself (``ln_1``, ``ln_2`` are identities: OLMo 2)."""
    gated = {"silu": SwiGLU, "gelu_tanh": GeGLU, "swiglu_oai": ClampedSwiGLU}[c.mlp_act]
    pre = (lambda: RMSNorm(c.n_embd, eps=c.rms_norm_eps)) if c.pre_norms else nn.Identity
    parts = dict(sa_norm=pre(), mlp_norm=pre(), dropout=c.dropout)
    attn = llama_attention(c, layer)
    if c.n_expert is not None:
        mlp = SparseMoE(c.n_embd, c.ffn_width, c.n_expert, c.n_expert_used,
                        norm_topk=c.moe_norm_topk, dropout=c.dropout, gating=c.moe_gating,
                        bias=c.moe_bias, expert=gated)  # fmt: skip
    else:
        mlp = gated(c.n_embd, c.ffn_width, bias=False, dropout=c.dropout)
    if c.post_norms:
        block = SandwichBlock(
            attn, mlp, post_attn_norm=RMSNorm(c.n_embd, eps=c.rms_norm_eps),
            post_mlp_norm=RMSNorm(c.n_embd, eps=c.rms_norm_eps), **parts,
        )  # fmt: skip
    else:
        block = TransformerBlock(attn, mlp, **parts)
    block.residual_scale = c.residual_scale  # Granite's residual_multiplier (None: 1)
    return block


class Llama(Decoder):
    """Llama decoder-only LM. Module names as GPT's: ``tok_emb``, ``rotary``, ``blocks``
    (L :func:`llama_block`), ``ln_f`` (RMSNorm), ``lm_head``. ``forward``, ``step``,
    ``new_state`` and the loss are the causal decoder's
    (:class:`~attnlm.models.decoder.Decoder`); the config's optional parts are modules of
    the blocks and arguments of the decoder (``rotary_local``, ``embed_scale``,
    ``final_softcap``)."""

    def __init__(self, config: LlamaConfig) -> None:
        c = config
        local = None
        if c.rope_local_theta is not None and LAYER_TYPES[1] in c.layer_kinds:
            local = RotaryEmbedding(c.rotary_width, base=c.rope_local_theta)
        super().__init__(
            config,
            [llama_block(c, layer) for layer in range(c.n_layer)],
            ln_f=RMSNorm(c.n_embd, eps=c.rms_norm_eps),
            rotary=RotaryEmbedding(c.rotary_width, base=c.rope_theta, scaling=c.rope_scaling),
            rotary_local=local,
            embed_scale=c.embed_scale,
            final_softcap=c.final_softcap,
            logit_scale=c.logit_scale,
        )
        # every projection and the head on the CPU training kernel (the same numbers)
        fused.use_onednn(self)

    @classmethod
    def from_config_dict(cls, data: dict[str, Any]) -> Llama:
        """A fresh model from a ``[model]`` table (unknown keys and bad types are errors)."""
        from attnlm.base.config import from_dict

        return cls(from_dict(LlamaConfig, data, where="model"))


# -- registry entry ---------------------------------------------------------------------------


def describe_parts(c: LlamaConfig) -> list[str]:
    """The optional parts a config uses, one short phrase each (empty for a plain Llama)."""
    parts = []
    if c.d_head is not None and c.d_head * c.n_head != c.n_embd:
        parts.append(f"d_head={c.d_head}")
    if c.qkv_bias:
        parts.append("q/k/v/o biases" if c.attn_out_bias else "q/k/v biases")
    elif c.attn_out_bias:
        parts.append("output projection bias")
    if c.attn_sinks:
        parts.append("attention sinks")
    if c.qk_norm:
        parts.append("q/k norms over all heads" if c.qk_norm_all else "q/k norms")
    kinds = c.layer_kinds
    sliding = kinds.count(LAYER_TYPES[1])
    if sliding:
        where = "every layer" if sliding == len(kinds) else f"{sliding} of {len(kinds)} layers"
        parts.append(f"sliding window {c.sliding_window} ({where})")
    if c.rope_local_theta is not None:
        parts.append(f"local rope_theta={c.rope_local_theta:g}")
    if c.nope_layers:
        parts.append(f"no positions in {len(c.nope_layers)} of {c.n_layer} layers (NoPE)")
    if c.rope_scaling:
        parts.append(f"rope scaling {c.rope_scaling.get('rope_type')}")
    if c.rotary_dim is not None:
        parts.append(f"partial rotary ({c.rotary_dim} of {c.head_dim} features)")
    if c.embed_scale is not None:
        parts.append(f"embed scale {c.embed_scale:.4g}")
    if c.post_norms:
        parts.append("post-norms" if c.pre_norms else "post-norms only (no pre-norms)")
    if c.mlp_act != "silu":
        parts.append("GeGLU" if c.mlp_act == "gelu_tanh" else "clamped SwiGLU")
    if c.n_expert is not None:
        norm = "" if c.moe_norm_topk or c.moe_gating != "softmax" else ", weights not renormalised"
        gating = ", softmax of the top k" if c.moe_gating == "topk_softmax" else ""
        bias = ", biases" if c.moe_bias else ""
        parts.append(f"{c.n_expert} experts, {c.n_expert_used} per token{norm}{gating}{bias}")
    if c.attn_scale is not None:
        parts.append(f"attn scale {c.attn_scale:.4g}")
    if c.attn_softcap is not None:
        parts.append(f"attn softcap {c.attn_softcap:g}")
    if c.final_softcap is not None:
        parts.append(f"final softcap {c.final_softcap:g}")
    if c.residual_scale is not None:
        parts.append(f"residual scale {c.residual_scale:g}")
    if c.logit_scale is not None:
        parts.append(f"logits / {c.logit_scale:g}")
    return parts


def _describe(c: LlamaConfig) -> str:
    kind = "MHA" if c.n_kv_head == c.n_head else "MQA" if c.n_kv_head == 1 else "GQA"
    parts = describe_parts(c)
    return (
        f"{ARCH_NAMES[c.arch]}, L={c.n_layer}, H={c.n_head}, Hkv={c.n_kv_head} ({kind}), "
        f"d={c.n_embd}, d_ff={c.ffn_width}, vocab={c.vocab_size}, context={c.block_size}, "
        f"rope_theta={c.rope_theta:g}, tied={'yes' if c.tie_embeddings else 'no'}"
        + (f"; {', '.join(parts)}" if parts else "")
    )


FAMILY = Family(
    "llama", LlamaConfig, Llama, "causal", frozenset({"generate"}), describe=_describe,
    description="Llama decoder: RMSNorm, SwiGLU, RoPE, grouped-query attention "
    "(Touvron et al. 2023)", decoding=Decoding("rope", True, True, True, True, drafts=True),
)  # fmt: skip
