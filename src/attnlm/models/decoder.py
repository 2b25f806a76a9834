"""The causal decoder that GPT (:mod:`attnlm.models.gpt`) and Llama (:mod:`attnlm.models.llama`)
share: everything but the blocks and the positions, which each family builds and hands over.

token ids -> token embedding (+ absolute positions) -> dropout -> N blocks (causal
self-attention, rotary or ALiBi positions inside it) -> final norm -> LM head -> logits.

One forward serves training, a full forward, and every decoding state: the state (a
:class:`~attnlm.nn.cache.KVCache`, a static one, or :class:`~attnlm.nn.cache.NoCache` when
there is none) says where the new tokens sit (``positions``) and what they may see
(``mask``), so the forward has no branch per cache mode.

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
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlm.base.errors import InputError
from attnlm.models.base import (
    IGNORE_INDEX,
    ModelOutput,
    check_ids,
    check_targets,
    count_params,
    token_loss,
)
from attnlm.nn import fused
from attnlm.nn.blocks import dropout_layer
from attnlm.nn.cache import KVCache, NoCache
from attnlm.nn.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
    segment_positions,
    window_mask,
)
from attnlm.nn.positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding
from attnlm.nn.static_cache import StaticKVCache


class Decoder(nn.Module):
    """A decoder-only language model with GPT-2 initialisation, from a family's parts.

    ``blocks``: the L transformer blocks; ``ln_f``: the final norm (an identity after
    post-norm blocks, which end in a norm); positions, at most one of ``pos_emb`` (absolute,
    added to the embeddings), ``rotary`` (rotates q and k) or ``alibi`` (a bias on the
    scores). ``config`` needs ``vocab_size``, ``n_embd``, ``n_layer``, ``block_size``,
    ``dropout`` and ``tie_embeddings``. Module names (the checkpoint keys): ``tok_emb``,
    ``pos_emb``, ``blocks``, ``ln_f``, ``lm_head``.

    Optional parts: a block whose attention has a ``window`` attends through a sliding window
    (:func:`~attnlm.nn.masks.window_mask` on the positions of queries and keys, so a cache, a
    static state and left padding see the same band) and rotates with ``rotary_local`` when
    given; ``embed_scale`` multiplies the embeddings; ``final_softcap`` caps the logits to
    ``cap · tanh(logits / cap)``; ``logit_scale`` divides them (Granite).
    """

    def __init__(
        self,
        config: Any,
        blocks: list[nn.Module],
        *,
        ln_f: nn.Module,
        pos_emb: nn.Module | None = None,
        rotary: RotaryEmbedding | None = None,
        alibi: ALiBi | None = None,
        rotary_local: RotaryEmbedding | None = None,
        embed_scale: float | None = None,
        final_softcap: float | None = None,
        logit_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb, self.rotary, self.alibi = pos_emb, rotary, alibi
        self.rotary_local = rotary_local  # the sliding layers' rotary, when it differs
        self.embed_scale, self.final_softcap = embed_scale, final_softcap
        self.logit_scale = logit_scale  # the logits divided by it (Granite's logits_scaling)
        self.drop = dropout_layer(c.dropout)
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = ln_f
        # tied: a placeholder (no memory) that the embedding's matrix replaces at once
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False,
                                 device="meta" if c.tie_embeddings else None)  # fmt: skip
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # (V, C), one matrix for both ends
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2L) (two residual adds per block)
        for block in self.blocks:
            experts = getattr(block.mlp, "experts", None)  # a mixture of experts: each one's
            for proj in (block.attn.out_proj, *[m.proj for m in (experts or [block.mlp])]):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2 initialisation: N(0, 0.02) weights, zero biases, norms (1, 0)."""
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
        last_only: bool = False,
        trace: Any = None,
        segments: Tensor | None = None,
    ) -> ModelOutput:
        """Logits ``(B, T, V)`` for every position of ``ids`` ``(B, T)``, and the loss against
        ``targets`` ``(B, T)`` (the next token at each position; -100 is not predicted).

        ``cache``: ``ids`` are only the new tokens, after what the cache holds; it is updated
        in place. ``attention_mask`` ``(B, S)`` bool, False at (left) padding, over the cached
        tokens too: each row's positions count only its real tokens, so a left-padded row
        gives the same logits as the row alone. ``return_attention`` / ``return_hidden`` fill
        ``attentions`` (this takes the explicit attention path) / ``hidden_states``.
        ``last_only``: logits ``(B, 1, V)`` of the last position alone (the LM head, the
        largest product, runs on nothing else), as decoding a prompt needs. ``trace``: an
        :class:`attnlm.inspect.trace.Tracer` that names, captures and edits the activations of
        this pass (the same modules run; without one nothing of it runs). ``segments``
        ``(B, T)`` int: several sequences packed into each row (training on short examples,
        :mod:`attnlm.train.chat_data`), numbered in order; a token attends only to earlier
        tokens of its own segment and absolute positions restart at each segment, so a packed
        row gives each sequence the loss it has alone (rotary and ALiBi depend on distances
        only, which attention within a segment keeps).
        """
        if last_only and targets is not None:
            raise InputError("last_only gives no loss: the targets need every position")
        state = NoCache() if cache is None else cache
        keep = self._check_inputs(ids, state, attention_mask)  # (B, S) bool or None
        T = ids.shape[1]
        positions = state.positions(T, ids.device, keep)  # (T,), or (B, T) with padding
        if segments is not None and (cache is not None or keep is not None):
            raise InputError("segments (packed training rows) take no cache or attention_mask")
        x = self._embed(ids, positions, segments, trace)  # (B, T, C)
        rotary = self._rotations(positions, x.dtype)  # (cos, sin) or None
        if segments is None:
            mask = self._mask(state, T, keep, x.dtype)  # None: causal, applied by attention
        else:  # (B, 1, T, T): causal within each segment
            bias = self.alibi(T, T).to(x.dtype) if self.alibi is not None else None
            mask = combine_masks(bias, segment_mask(segments, x.dtype))
        attend = dict(mask=mask, is_causal=mask is None, rotary=rotary, cache=cache)
        attends = self._layer_attends(attend, state, positions, keep, x.dtype)
        x, attentions, hidden = self._blocks(x, attend, attends, trace, return_attention)
        state.advance(T)
        if targets is not None and self._chunked_loss(return_attention or return_hidden, targets):
            return self._loss_only(self.ln_f(x), targets, ids)
        logits = self._logits(x[:, -1:] if last_only else x, trace)
        out = ModelOutput(logits=logits)
        out.attentions = attentions if return_attention else None
        out.hidden_states = hidden if return_hidden else None
        if targets is not None:
            check_targets(targets, ids)
            out.loss, out.loss_sum, out.n_targets = token_loss(logits, targets)
        return out

    def _embed(self, ids: Tensor, positions: Tensor, segments: Tensor | None,
               trace: Any) -> Tensor:  # fmt: skip
        """The input of the first block ``(B, T, C)``: token embeddings (scaled where the
        model says), learned positions (restarting at each segment), dropout."""
        x = self.tok_emb(ids)  # (B, T, C)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if trace is not None:
            x = trace.point("hook_embed", x)
        if self.pos_emb is not None:
            at = positions if segments is None else segment_positions(segments)  # (B, T)
            pos = self.pos_emb(at).to(x.dtype)  # (T, C) or (B, T, C)
            x = x + (pos if trace is None else trace.point("hook_pos_embed", pos.expand_as(x)))
        return self.drop(x)

    def _blocks(self, x: Tensor, attend: dict, attends: list | None, trace: Any,
                need_weights: bool) -> tuple[Tensor, list, list]:  # fmt: skip
        """``x`` through every block (``attends``: each layer's attention settings, else
        ``attend`` for all): the output, each layer's attention weights (None unless
        ``need_weights``) and the hidden states (the input first)."""
        attentions, hidden = [], [x]
        for layer, block in enumerate(self.blocks):
            here = attend if attends is None else attends[layer]
            if trace is not None:  # the same modules, their activations named
                x, weights = trace.block(block, x, layer, {**here, "layer": layer}), None
            elif self._checkpointing(here, need_weights):
                x, weights = checkpoint(_block_output, block, x, layer, here,
                                        use_reentrant=False), None  # fmt: skip
            else:
                x, weights, _ = block(x, layer=layer, need_weights=need_weights, **here)
            attentions.append(weights)
            hidden.append(x)
        return x, attentions, hidden

    # train.grad_checkpoint (attnlm.train.checkpointing): the blocks keep only their inputs
    # for the backward and compute their insides again there
    checkpoint_blocks: bool = False

    def _checkpointing(self, attend: dict, need_weights: bool) -> bool:
        """Whether this forward checkpoints its blocks: asked for, training under autograd,
        no cache and no attention weights wanted."""
        return (self.checkpoint_blocks and self.training and torch.is_grad_enabled()
                and attend.get("cache") is None and not need_weights)  # fmt: skip

    def _logits(self, x: Tensor, trace: Any) -> Tensor:
        """The final norm and the LM head (capped where the model says) over ``x``."""
        if trace is None:
            return self._cap(self.lm_head(self.ln_f(x)))
        h = trace.norm("ln_final", self.ln_f, x)
        return trace.point("hook_logits", self._cap(self.lm_head(h)))

    # Rows per chunk of the training loss when the LM head is frozen (LoRA training,
    # attnlm.lora.layers): its logits are wanted for the loss alone, so they are never held whole
    loss_chunk: int = 1024

    def _chunked_loss(self, wants_more: bool, targets: Tensor) -> bool:
        """Whether the loss is computed :attr:`loss_chunk` rows at a time: under autograd,
        when nothing but the loss is asked for, with a frozen head (a float weight that takes
        no gradient) or with targets that leave positions out (a chat run's prompts: the head
        then runs on the counted positions only, :meth:`_loss_only`)."""
        head = getattr(self.lm_head, "weight", None)
        plain = (isinstance(head, torch.Tensor) and self.final_softcap is None
                 and self.logit_scale is None)  # plain logits  # fmt: skip
        if not (plain and self.loss_chunk and torch.is_grad_enabled() and not wants_more):
            return False
        if not head.requires_grad:
            return True
        # (a compiled graph keeps the full logits: the check would break it)
        return not torch.compiler.is_compiling() and bool((targets == IGNORE_INDEX).any())

    def _loss_only(self, h: Tensor, targets: Tensor, ids: Tensor) -> ModelOutput:
        """The training loss of final hidden states ``h`` ``(B, T, C)`` computed
        :attr:`loss_chunk` rows at a time (:func:`attnlm.nn.fused.chunked_head_loss`: the
        ``(B T, V)`` logits are never held at once), on the rows whose target counts only
        (the head's product skips the rest); ``logits`` is None."""
        check_targets(targets, ids)
        flat, h = targets.reshape(-1), h.reshape(-1, h.shape[-1])  # (B T,), (B T, C)
        counted = flat != IGNORE_INDEX
        # the head runs on the counted rows only (chat: assistant tokens); not under compile,
        # where the data-dependent row count would break the graph
        if not torch.compiler.is_compiling() and not bool(counted.all()):
            rows = counted.nonzero().squeeze(1)
            flat, h = flat.index_select(0, rows), h.index_select(0, rows)
        total = fused.chunked_head_loss(h, self.lm_head.weight, flat, self.loss_chunk, IGNORE_INDEX)
        count = counted.sum()
        return ModelOutput(logits=None, loss=total / count.clamp(min=1), loss_sum=total,
                           n_targets=count)  # fmt: skip

    def _cap(self, logits: Tensor) -> Tensor:
        """``cap · tanh(logits / cap)`` with ``final_softcap`` (Gemma 2), then divided by
        ``logit_scale`` (Granite), else the logits."""
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits if self.logit_scale is None else logits / self.logit_scale

    def _layer_attends(
        self,
        attend: dict[str, Any],
        state: NoCache,
        positions: Tensor,
        keep: Tensor | None,
        dtype: torch.dtype,
    ) -> list[dict[str, Any]] | None:
        """Each layer's attention arguments when layers differ (None: every layer takes
        ``attend``): a sliding layer's mask adds its window's band to the shared mask (or to
        the causal mask), and it rotates with ``rotary_local`` when the model has one. One
        mask per window size, built once per call."""
        windows = [getattr(b.attn, "window", None) for b in self.blocks]
        if all(w is None for w in windows):
            return None
        T = positions.shape[-1]
        local = attend["rotary"]
        if self.rotary_local is not None:
            cos, sin = self.rotary_local(positions)
            local = cos.to(dtype), sin.to(dtype)
        keys = state.key_positions(T, positions.device, keep)  # (S,) or (B, S)
        base = attend["mask"]
        if base is None:
            base = causal_mask(T, keys.shape[-1], device=positions.device, dtype=dtype)
        made: dict[int, dict[str, Any]] = {}
        for w in set(windows) - {None}:
            band = window_mask(positions, keys, w, dtype)  # (T, S) or (B, 1, T, S)
            made[w] = dict(attend, mask=combine_masks(base, band), is_causal=False, rotary=local)
        return [attend if w is None else made[w] for w in windows]

    def _check_inputs(
        self, ids: Tensor, state: NoCache, attention_mask: Tensor | None
    ) -> Tensor | None:
        """Shape, dtype and range of the token ids (:func:`~attnlm.models.base.check_ids`), a
        cache of the right depth, an ``attention_mask`` of shape ``(B, cached + T)`` (returned
        as bool)."""
        check_ids(ids, self.config.vocab_size)
        if isinstance(state, KVCache) and len(state.keys) != self.config.n_layer:
            n = self.config.n_layer
            raise InputError(f"cache has {len(state.keys)} layers, model.n_layer is {n}")
        if state.fixed and (attention_mask is not None or self.alibi is not None):
            raise InputError("a fixed decoding state takes no attention_mask and no ALiBi")
        if attention_mask is None:
            return None
        expected = (ids.shape[0], state.length + ids.shape[1])
        if attention_mask.shape != expected:
            raise InputError(
                f"attention_mask must be (B, cached + T) = {expected}, "
                f"got {tuple(attention_mask.shape)}"
            )
        return attention_mask.bool()

    def _rotations(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        """Rotary ``(cos, sin)`` of ``positions``: computed in float32, used in ``dtype``."""
        if self.rotary is None:
            return None
        cos, sin = self.rotary(positions)
        return cos.to(dtype), sin.to(dtype)

    def _mask(
        self, state: NoCache, t: int, keep: Tensor | None, dtype: torch.dtype
    ) -> Tensor | None:
        """The additive mask every layer shares: the state's, or (with ALiBi or padding) the
        causal mask ``(T, S)`` plus the ALiBi bias ``(H, T, S)`` and the padding mask
        ``(B, 1, 1, S)``. None lets attention apply the causal rule itself, so the fused
        kernel runs without a ``T x S`` tensor."""
        if self.alibi is None and keep is None:
            return state.mask(t, dtype)
        s = state.length + t
        bias = self.alibi(t, s).to(dtype) if self.alibi is not None else None
        pad = padding_mask(keep, dtype) if keep is not None else None
        device = (keep if keep is not None else bias).device  # (the embedding may be quantized)
        causal = causal_mask(t, s, device=device, dtype=dtype)
        return combine_masks(bias, pad, causal)

    # -- decoding state (docs/architecture.md) ---------------------------------------------

    def new_state(
        self, batch: dict[str, Tensor] | None = None, *, max_len: int | None = None
    ) -> KVCache:
        """Decoding state for a batch: for a decoder-only model, an empty KV cache (the
        prompt is fed through :meth:`step` like every later token). ``max_len``: a static
        state (:class:`~attnlm.nn.static_cache.StaticKVCache`) whose buffers hold that many
        positions, written in place."""
        if max_len is not None:
            return StaticKVCache(self.config.n_layer, max_len)
        return KVCache(self.config.n_layer)

    # step() takes last_only (the runtime's runners ask for it: attnlm.runtime.eager)
    step_last_only = True

    def step(self, tokens: Tensor, state: KVCache, last_only: bool = False) -> Tensor:
        """Feed new ``tokens`` ``(B, n)`` after what ``state`` holds; logits ``(B, n, V)``,
        or ``(B, 1, V)`` of the last token with ``last_only`` (a prompt's prefill): the
        forward. Faster ways to run the same step (the flat one-token step, the C step, a
        compiled graph) are backends of :mod:`attnlm.runtime`, chosen once per decode."""
        return self(tokens, cache=state, last_only=last_only).logits

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


def _block_output(block: nn.Module, x: Tensor, layer: int, attend: dict) -> Tensor:
    """One block's output alone (what a checkpointed block recomputes)."""
    return block(x, layer=layer, need_weights=False, **attend)[0]
