"""The encoder-decoder Transformer for translation (Vaswani et al., 2017, "Attention Is All
You Need"), with the Hugging Face Marian (``MarianMTModel``) weight layout.

source ids -> embedding * sqrt(C) + sinusoidal positions -> N encoder blocks (self-attention
over the source, padding masked) -> memory. target ids (``[start] + target``) -> embedding *
sqrt(C) + positions -> N decoder blocks (causal self-attention, cross-attention over the
memory) -> LM head (tied to the target embedding) -> logits for the next target token.

Options: post-norm (the paper, Marian) or pre-norm (then a final norm after each stack),
shared source/target embeddings, label smoothing (Szegedy et al., 2016; the paper uses 0.1).
The file reads top to bottom: the config, the decoding state, the model (encoder, decoder,
loss, decoding protocol, inspection), the Marian layout, the registry entry.

Shape legend
    B  batch size
    S  source length
    T  target tokens in this call (all of them without a cache)
    C  model width (d_model)
    H  heads
    V  target vocabulary size
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.errors import ConfigError, InputError
from attnlm.models.base import (
    IGNORE_INDEX,
    DecodingSetup,
    Family,
    ModelOutput,
    check_ids,
    check_targets,
    count_params,
    token_loss,
)
from attnlm.models.hf import load_mapped_state, read_hf_config, read_hf_weights, write_hf_folder
from attnlm.nn.attention import KVCache, Packing, padding_mask
from attnlm.nn.blocks import ACTIVATIONS, NORMS, TransformerBlock, dropout_layer
from attnlm.nn.positional import SinusoidalPositionalEncoding

LAYOUTS = ("interleaved", "split")


@dataclass(frozen=True)
class TransformerConfig:
    """Shape and options of a :class:`Transformer` encoder-decoder. Invalid values raise
    :class:`~attnlm.errors.ConfigError` naming the field (``model.<field>``).

    ``vocab_size`` is the target vocabulary (and the source one unless ``src_vocab_size``
    says otherwise); ``pad_id``/``bos_id``/``eos_id`` come from the tokenizers (``bos_id``
    is the decoder start token; Marian starts from the padding id).
    """

    vocab_size: int
    src_vocab_size: int | None = None  # None: the source uses the target vocabulary
    d_model: int = 256
    n_head: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int | None = None  # feed-forward width; None means 4 * d_model
    norm: str = "post"  # "post": LN(x + f(x)) (Vaswani et al., Marian) | "pre": x + f(LN(x))
    activation: str = "relu"  # "relu" | "gelu" | "gelu_tanh" | "silu" (Marian's "swish")
    dropout: float = 0.1  # on embeddings, sublayer outputs (residual dropout)
    attention_dropout: float = 0.0  # on attention weights (Marian's attention_dropout)
    label_smoothing: float = 0.0
    share_embeddings: bool = True  # one matrix for source and target tokens
    tie_output: bool = True  # LM head = target embedding matrix
    scale_embedding: bool = True  # embeddings times sqrt(d_model) (the paper, section 3.4)
    positions_layout: str = "interleaved"  # sinusoid features: "interleaved" | "split" (Marian)
    final_logits_bias: bool = False  # a fixed (buffer) bias on the logits, as Marian stores one
    layer_norm_eps: float = 1e-5
    bias: bool = True
    pad_id: int = 0
    bos_id: int = 1  # decoder start token
    eos_id: int = 2
    mask_pad: bool = True  # decoding never emits pad (Marian's bad_words_ids=[[pad]])
    force_eos: bool = True  # the last allowed token is eos (Marian's forced_eos_token_id)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_head", "n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.src_vocab_size is not None and (
            not isinstance(self.src_vocab_size, int) or self.src_vocab_size <= 0
        ):
            raise ConfigError(f"model.src_vocab_size must be a positive integer or null, got "
                              f"{self.src_vocab_size!r}")  # fmt: skip
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})"
            )
        choices = {"norm": NORMS, "activation": tuple(ACTIVATIONS), "positions_layout": LAYOUTS}
        for name, known in choices.items():
            if getattr(self, name) not in known:
                raise ConfigError(
                    f"unknown model.{name} {getattr(self, name)!r} (known: {', '.join(known)})"
                )
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"model.label_smoothing must be in [0, 1), got {self.label_smoothing}"
            )
        if self.d_ff is not None and self.d_ff <= 0:
            raise ConfigError(f"model.d_ff must be a positive integer, got {self.d_ff}")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"model.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if self.share_embeddings and self.source_vocab != self.vocab_size:
            raise ConfigError(
                f"model.share_embeddings needs one vocabulary, but model.src_vocab_size="
                f"{self.src_vocab_size} and model.vocab_size={self.vocab_size}"
            )
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{name} must be a token id >= 0, got {value!r}")

    def check_ids(self) -> None:
        """The special ids fit the target vocabulary (checked when the model is built: before
        the data is known, presets validate with a stand-in vocabulary size)."""
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(self, name) >= self.vocab_size:
                raise ConfigError(
                    f"model.{name} must be a token id below model.vocab_size={self.vocab_size}, "
                    f"got {getattr(self, name)}"
                )

    @property
    def source_vocab(self) -> int:
        return self.vocab_size if self.src_vocab_size is None else self.src_vocab_size


class EncoderDecoderState(KVCache):
    """Decoding state of the encoder-decoder: the decoder's KV cache (self-attention keys and
    values per layer, cross-attention keys and values computed once from the encoder output)
    plus the encoder output ``memory`` ``(B, S, C)`` until the first step has turned it into
    the cross-attention slots, and the source padding mask ``context_mask``
    ``(B, 1, 1, S)``."""

    def __init__(self, n_layer: int, memory: Tensor, context_mask: Tensor) -> None:
        super().__init__(n_layer)
        self.memory: Tensor | None = memory
        self.context_mask = context_mask
        # the cross-attention row (of ``cross``, ``context_mask``, ``memory``) of each row:
        # row r uses cross-attention row r // cross_group
        self.rows = torch.arange(memory.shape[0], device=memory.device)
        self._held = 0  # tokens held; keys[l] / values[l] are views of the buffers below
        self._k_buf: list[Tensor | None] = [None] * n_layer  # (B, H, capacity, D)
        self._v_buf: list[Tensor | None] = [None] * n_layer

    @property
    def length(self) -> int:
        return self._held

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys/values ``(B, H, T, D)`` into preallocated buffers that grow by
        doubling (no concatenation of everything held at every step); returns views of all
        held entries ``(B, H, S, D)``."""
        start = self._held if layer == 0 else self.keys[0].shape[-2] - k.shape[-2]
        end = start + k.shape[-2]
        buf = self._k_buf[layer]
        if buf is None or buf.shape[-2] < end or buf.shape[0] != k.shape[0]:
            cap = max(16, 2 * end)
            new_k = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
            new_v = v.new_empty(new_k.shape)
            if start:
                new_k[:, :, :start] = self.keys[layer][:, :, :start]
                new_v[:, :, :start] = self.values[layer][:, :, :start]
            self._k_buf[layer], self._v_buf[layer] = new_k, new_v
        self._k_buf[layer][:, :, start:end] = k
        self._v_buf[layer][:, :, start:end] = v
        self.keys[layer] = self._k_buf[layer][:, :, :end]
        self.values[layer] = self._v_buf[layer][:, :, :end]
        if layer == len(self.keys) - 1:
            self._held = end
        return self.keys[layer], self.values[layer]

    def trim(self, keep_last: int) -> None:
        raise InputError("an encoder-decoder's decoding state has no window to trim")

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices``. The self-attention entries of a row that keeps its own place
        (``indices[r] == r``, as most beams do from step to step) stay where they are: only
        the rows that take another row's entries are copied, in place. The cross-attention
        keys/values of a row depend only on its source, so they are kept once per source row
        (``cross_group`` consecutive rows share one, as the beams of a source do) and never
        copied when rows only change places among the rows of their source."""
        indices = indices.to(self.rows.device)
        n = len(indices)
        rows = self.rows.index_select(0, indices)
        same_rows = n == len(self.rows)
        for layer in range(len(self.keys)):  # self-attention entries
            k, v = self.keys[layer], self.values[layer]
            if k is None:
                continue
            if same_rows:
                moved = (indices != torch.arange(n, device=indices.device)).nonzero()[:, 0]
                if len(moved):  # gather first: a source row may itself be overwritten
                    src = indices.index_select(0, moved)
                    k.index_copy_(0, moved, k.index_select(0, src))
                    v.index_copy_(0, moved, v.index_select(0, src))
                continue
            new_k = k.new_empty(n, *self._k_buf[layer].shape[1:])
            new_v = v.new_empty(new_k.shape)
            torch.index_select(k, 0, indices, out=new_k[:, :, : k.shape[-2]])
            torch.index_select(v, 0, indices, out=new_v[:, :, : v.shape[-2]])
            self._k_buf[layer], self._v_buf[layer] = new_k, new_v
            self.keys[layer], self.values[layer] = (
                new_k[:, :, : k.shape[-2]],
                new_v[:, :, : v.shape[-2]],
            )
        if same_rows and torch.equal(rows, self.rows):
            return
        # rows = the cross-attention row of each new row; group runs of equal rows
        g = int((rows == rows[0]).sum())
        if n % g == 0 and bool((rows.view(-1, g) == rows.view(-1, g)[:, :1]).all()):
            pick = rows.view(-1, g)[:, 0]  # one cross-attention row per group of g rows
        else:
            g, pick = 1, rows
        n_cross = self.context_mask.shape[0]
        if len(pick) != n_cross or not torch.equal(pick, torch.arange(n_cross, device=pick.device)):
            self.cross = [None if c is None else (c[0].index_select(0, pick),
                          c[1].index_select(0, pick)) for c in self.cross]  # fmt: skip
            self.context_mask = self.context_mask.index_select(0, pick)
            if self.memory is not None:
                self.memory = self.memory.index_select(0, pick)
        self.cross_group = g
        self.rows = torch.arange(len(pick), device=pick.device).repeat_interleave(g)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (see the module docstring).

    ``forward(src (B, S), src_mask (B, S) bool, tgt_in (B, T), targets (B, T)) ->
    ModelOutput`` with logits ``(B, T, V)``, the label-smoothed loss when ``targets`` are
    given, and on request decoder self-attention, cross-attention ``(B, H, T, S)`` and encoder
    attention per layer. Module names: ``src_emb``, ``tgt_emb`` (the same module when shared),
    ``pos`` (sinusoidal), ``encoder`` / ``decoder`` (:class:`~attnlm.nn.blocks.TransformerBlock`
    lists, the decoder's with cross-attention), ``enc_ln`` / ``dec_ln`` (final norms of a
    pre-norm model, else identities), ``lm_head``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.check_ids()
        self.config = c = config
        self.src_emb = nn.Embedding(c.source_vocab, c.d_model)
        self.tgt_emb = self.src_emb if c.share_embeddings else nn.Embedding(c.vocab_size, c.d_model)
        self.pos = SinusoidalPositionalEncoding(c.d_model, layout=c.positions_layout)
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embedding else 1.0
        self.drop = dropout_layer(c.dropout)

        def blocks(n: int, cross: bool) -> nn.ModuleList:
            return nn.ModuleList(
                TransformerBlock(
                    c.d_model,
                    c.n_head,
                    d_ff=c.d_ff,
                    norm=c.norm,
                    activation=c.activation,
                    dropout=c.dropout,
                    attention_dropout=c.attention_dropout,
                    bias=c.bias,
                    eps=c.layer_norm_eps,
                    cross_attention=cross,
                )
                for _ in range(n)
            )

        self.encoder = blocks(c.n_encoder_layers, False)
        self.decoder = blocks(c.n_decoder_layers, True)
        pre = c.norm == "pre"
        eps, bias = c.layer_norm_eps, c.bias
        self.enc_ln = nn.LayerNorm(c.d_model, eps=eps, bias=bias) if pre else nn.Identity()
        self.dec_ln = nn.LayerNorm(c.d_model, eps=eps, bias=bias) if pre else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.final_logits_bias:
            self.register_buffer("logits_bias", torch.zeros(c.vocab_size))
        else:
            self.logits_bias = None
        self.apply(self._init_weights)
        if c.tie_output:
            self.lm_head.weight = self.tgt_emb.weight  # (V, C): one matrix for both ends

    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform matrices and zero biases (as the paper's reference code);
        embeddings N(0, C^-1/2), so that after the sqrt(C) scale they have unit variance."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.d_model**-0.5 if self.config.scale_embedding else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)

    # -- encoder and decoder ----------------------------------------------------------------

    def _embed(
        self, emb: nn.Embedding, ids: Tensor, start: int = 0, packing: Packing | None = None
    ) -> Tensor:
        """Scaled embeddings plus positions ``start..``, dropout: ``(B, T, C)``, or ``(N, C)``
        of the tokens ``packing`` keeps."""
        pe = self.pos.span(start, ids.shape[1], ids.device)  # (T, C): positions start..
        if packing is not None:
            ids, pe = packing.take(ids), pe.index_select(0, packing.positions)
        x = emb(ids) * self.embed_scale + pe.to(emb.weight.dtype)
        return self.drop(x)

    def _source_mask(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """Check the source ids and their mask; all True when none is given."""
        check_ids(src, self.config.source_vocab, "src")
        if src_mask is None:
            return torch.ones_like(src, dtype=torch.bool)
        if src_mask.shape != src.shape:
            raise InputError(
                f"src_mask must have the shape of src {tuple(src.shape)}, "
                f"got {tuple(src_mask.shape)}"
            )
        return src_mask.bool()

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, return_attention: bool = False
    ) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
        """Encoder pass: ``(memory (B, S, C), additive source mask (B, 1, 1, S), attention per
        layer (B, H, S, S) when asked, hidden states: embeddings then each layer)``."""
        src_mask = self._source_mask(src, src_mask)
        x = self._embed(self.src_emb, src, 0)
        mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        attentions, hidden = [], [x]
        for block in self.encoder:
            x, weights, _ = block(x, mask=mask, need_weights=return_attention)
            attentions.append(weights)
            hidden.append(x)
        x = self.enc_ln(x)
        return x, mask, attentions if return_attention else [], hidden

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        context_mask: Tensor,
        cache: KVCache | None = None,
        return_attention: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor], list[Tensor]]:
        """Decoder pass over ``tgt_in`` ``(B, T)`` (after what ``cache`` holds): ``(logits
        (B, T, V), self-attention per layer, cross-attention per layer, hidden states)``."""
        check_ids(tgt_in, self.config.vocab_size, "tgt_in")
        start = cache.position if cache is not None else 0
        x = self._embed(self.tgt_emb, tgt_in, start)
        self_w, cross_w, hidden = [], [], [x]
        for layer, block in enumerate(self.decoder):
            x, w, cw = block(
                x,
                is_causal=True,
                cache=cache,
                layer=layer,
                need_weights=return_attention,
                context=memory,
                context_mask=context_mask,
            )
            if return_attention:
                self_w.append(w)
                cross_w.append(cw)
            hidden.append(x)
        if cache is not None:
            cache.advance(tgt_in.shape[1])
        logits = self.lm_head(self.dec_ln(x))  # (B, T, V)
        if self.logits_bias is not None:
            logits = logits + self.logits_bias
        return logits, self_w, cross_w, hidden

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        targets: Tensor | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """Teacher-forced logits of every target position and the (label-smoothed) loss
        against ``targets`` (-100 is not predicted). Target padding needs no mask of its own:
        padding sits at the end and the causal mask keeps real positions from seeing it."""
        if tgt_in.shape[0] != src.shape[0]:
            raise InputError(f"tgt_in has {tgt_in.shape[0]} rows but src has {src.shape[0]}")
        if targets is not None and not (return_attention or return_hidden):
            if not torch.compiler.is_compiling():  # data-dependent sizes: eager only
                return self._forward_packed(src, tgt_in, src_mask, targets)
        memory, mask, enc_w, enc_h = self.encode(src, src_mask, return_attention)
        logits, self_w, cross_w, hidden = self.decode(
            tgt_in, memory, mask, return_attention=return_attention
        )
        loss = loss_sum = n_targets = None
        if targets is not None:
            loss, loss_sum, n_targets = token_loss(logits, targets, self.config.label_smoothing)
        return ModelOutput(
            logits=logits,
            loss=loss,
            loss_sum=loss_sum,
            n_targets=n_targets,
            attentions=self_w if return_attention else None,
            hidden_states=hidden if return_hidden else None,
            cross_attentions=cross_w if return_attention else None,
            encoder_attentions=enc_w if return_attention else None,
            encoder_hidden_states=enc_h if return_hidden else None,
        )

    def _forward_packed(
        self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None, targets: Tensor
    ) -> ModelOutput:
        """The teacher-forced loss with every per-token layer (embedding, projections,
        feed-forward, norms, dropout, head) on real tokens only (:class:`Packing`): the source
        tokens ``src_mask`` keeps, and the target positions up to each row's last counted
        target (later positions feed no counted one under the causal mask). Attention runs on
        the padded layout. Logits ``(N, V)`` of the counted targets in row-major order; equal
        to :meth:`forward` on the padded batch (tested)."""
        src_mask = self._source_mask(src, src_mask)
        check_ids(tgt_in, self.config.vocab_size, "tgt_in")
        check_targets(targets, tgt_in)
        counted = targets != IGNORE_INDEX  # (B, T)
        enc = Packing(src_mask)
        dec = Packing(counted.flip(1).cumsum(1).flip(1) > 0)  # up to the last counted target
        x = self._embed(self.src_emb, src, packing=enc)  # (N_src, C)
        mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        for block in self.encoder:
            x = block(x, mask=mask, packing=enc)[0]
        memory = self.enc_ln(x)
        y = self._embed(self.tgt_emb, tgt_in, packing=dec)  # (N_tgt, C)
        for block in self.decoder:
            y = block(
                y,
                is_causal=True,
                context=memory,
                context_mask=mask,
                packing=dec,
                context_packing=enc,
            )[0]
        y = y[dec.take(counted)]  # (N, C): the counted targets among the kept positions
        logits = self.lm_head(self.dec_ln(y))  # (N, V)
        if self.logits_bias is not None:
            logits = logits + self.logits_bias
        loss, loss_sum, n_targets = token_loss(
            logits, targets[counted], self.config.label_smoothing
        )
        return ModelOutput(logits=logits, loss=loss, loss_sum=loss_sum, n_targets=n_targets)

    # -- decoding state (docs/architecture.md) ---------------------------------------------

    def prepare_decoding(self, sources: list[list[int]]) -> DecodingSetup:
        """Decoding setup for source id lists: every row starts from ``bos_id`` (kept in the
        result, as ``transformers`` returns the decoder start token), conditions on the
        right-padded sources and ends at ``eos_id``; :meth:`process_scores` applies the
        pad mask and the forced end token."""
        c = self.config
        if not sources or any(len(s) == 0 for s in sources):
            raise InputError("every source needs at least one token")
        S = max(len(s) for s in sources)
        src = torch.full((len(sources), S), c.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sources), S), dtype=torch.bool)
        for r, s in enumerate(sources):
            src[r, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[r, : len(s)] = True
        return DecodingSetup(
            prompts=[[c.bos_id] for _ in sources],
            state_batch={"src": src, "src_mask": mask},
            eos_id=c.eos_id,
            keep_prompt=True,
            process=self.process_scores if (c.mask_pad or c.force_eos) else None,
        )

    def process_scores(self, scores: Tensor, length: int, max_length: int) -> Tensor:
        """Next-token scores ``(N, V)`` with padding banned (``mask_pad``) and, at the last
        position before ``max_length``, every token but ``eos_id`` banned (``force_eos``):
        ``transformers``' ``NoBadWordsLogitsProcessor`` and ``ForcedEOSTokenLogitsProcessor``
        as Marian's generation config sets them."""
        c = self.config
        scores = scores.clone()
        if c.mask_pad:
            scores[:, c.pad_id] = float("-inf")
        if c.force_eos and length == max_length - 1:
            scores[:] = float("-inf")
            scores[:, c.eos_id] = 0.0
        return scores

    def new_state(self, batch: dict[str, Tensor] | None = None) -> EncoderDecoderState:
        """Encode ``batch["src"]`` (with ``batch["src_mask"]``) once; the state holds the
        memory for the cross-attention and an empty decoder cache."""
        if batch is None or "src" not in batch:
            raise InputError("an encoder-decoder decodes from a source: pass {'src', 'src_mask'}")
        device = self.lm_head.weight.device
        src = batch["src"].to(device)
        src_mask = batch.get("src_mask")
        memory, mask, _, _ = self.encode(src, None if src_mask is None else src_mask.to(device))
        return EncoderDecoderState(self.config.n_decoder_layers, memory, mask)

    def step(self, tokens: Tensor, state: EncoderDecoderState) -> Tensor:
        """Feed decoder ``tokens`` ``(B, n)`` after what ``state`` holds; logits ``(B, n, V)``."""
        logits, _, _, _ = self.decode(tokens, state.memory, state.context_mask, cache=state)
        state.memory = None  # the cross-attention keys/values are in the cache now
        return logits

    @torch.no_grad()
    def greedy(self, source: list[int], max_new_tokens: int = 128) -> list[int]:
        """Greedy translation of one source id list (start token first, end token last when
        reached); what :meth:`inspect` uses when no target is given."""
        setup = self.prepare_decoding([source])
        state = self.new_state(setup.state_batch)
        out = list(setup.prompts[0])
        max_len = 1 + max_new_tokens
        for _ in range(max_new_tokens):
            tok = torch.tensor([out[-1:]], device=self.lm_head.weight.device)
            logits = self.step(tok, state)[:, -1]
            if setup.process is not None:
                logits = setup.process(logits, len(out), max_len)
            out.append(int(logits.argmax(-1)))
            if out[-1] == self.config.eos_id:
                break
        return out

    # -- inspection ------------------------------------------------------------------------

    @torch.no_grad()
    def inspect(
        self, tokenizer: Any, text: str, target: str | Sequence[int] | None = None
    ) -> dict[str, Any]:
        """The fields of the :class:`~attnlm.inspect.record.InspectionRecord` of translating
        ``text`` (``attnlm.inspect.record.inspect`` builds the record; this layer cannot)
        (greedy when ``target`` is None; ``target`` may be a text or target ids without the
        start token, as a decoder produced them, an end token appended when missing).
        ``tokenizer``: a :class:`~attnlm.data.pairs.PairTokenizers` or one tokenizer for both
        sides. The rows (``tokens``) are the tokens the decoder emits at each step (the target
        and the end token), Bahdanau et al.'s alignment view; keys of cross-attention are the
        source tokens."""
        from attnlm.data.pairs import PairTokenizers

        c = self.config
        pairs = tokenizer
        if not isinstance(pairs, PairTokenizers):
            pairs = PairTokenizers.from_tokenizers(tokenizer)
        source = pairs.encode_source(text)
        if not pairs.tokens(text, "source"):
            raise InputError("the source text is empty after tokenization")
        was = self.training
        self.eval()
        try:
            if target is None:
                out = self.greedy(source)
            elif isinstance(target, str):
                out = [c.bos_id, *pairs.tokens(target, "target"), c.eos_id]
            else:  # target ids as decoding produced them (no start token)
                out = [c.bos_id, *(int(i) for i in target)]
            if out[-1] != c.eos_id:
                out.append(c.eos_id)
            device = self.lm_head.weight.device
            src = torch.tensor([source], device=device)
            tgt_in = torch.tensor([out[:-1]], device=device)
            res = self(src, tgt_in, return_attention=True, return_hidden=True)
        finally:
            self.train(was)

        def labels(ids: list[int], side: str) -> list[str]:
            tok = pairs.source if side == "source" else pairs.target
            sp = pairs.source_ids if side == "source" else pairs.target_ids
            names = {sp.pad: pairs.config.pad, sp.bos: pairs.config.bos, sp.eos: pairs.config.eos}
            from attnlm.tokenizers import token_label

            return [names[i] if i in names else token_label(tok, i) for i in ids]

        first = lambda ts: [t[0].float().cpu() for t in ts]  # noqa: E731 - drop the batch axis
        return dict(
            family="transformer",
            tokens=labels(out[1:], "target"),
            ids=out[1:],
            attentions=first(res.attentions),
            hidden_states=first(res.hidden_states),
            source_tokens=labels(source, "source"),
            source_ids=source,
            cross_attentions=first(res.cross_attentions),
            encoder_attentions=first(res.encoder_attentions),
            encoder_hidden_states=first(res.encoder_hidden_states),
        )

    # -- utilities -----------------------------------------------------------------------------

    def num_params(self) -> int:
        """Number of parameters (shared and tied matrices counted once)."""
        return count_params(self)

    @classmethod
    def from_hf(cls, path: str | Path) -> Transformer:
        """Load a ``MarianMTModel`` folder (``config.json`` with ``model_type: "marian"`` and
        ``model.safetensors`` or ``pytorch_model.bin``), in eval mode. The decoding settings
        (``bad_words_ids`` = padding, ``forced_eos_token_id``) follow
        ``generation_config.json`` when the folder has one."""
        path = Path(path)
        config = config_from_hf(read_hf_config(path), _generation_config(path), str(path))
        state = state_from_hf(read_hf_weights(path), config)
        optional = ("lm_head.weight",) if config.tie_output else ()
        if config.share_embeddings:
            optional += ("tgt_emb.weight",)  # the same module as src_emb
        return load_mapped_state(cls(config), state, path, optional)

    def save_hf(self, path: str | Path, max_position_embeddings: int = 512) -> None:
        """Write this model as a ``MarianMTModel`` folder (``config.json``,
        ``generation_config.json``, ``model.safetensors``) that
        ``transformers.MarianMTModel.from_pretrained`` loads."""
        hf_config, generation = config_to_hf(self.config, max_position_embeddings)
        state = state_to_hf(self.state_dict(), self.config)
        write_hf_folder(path, hf_config, state)
        import json

        (Path(path) / "generation_config.json").write_text(
            json.dumps(generation, indent=2) + "\n", encoding="utf-8"
        )


# ---------------------------------------------------------------------------------------------
# The Hugging Face Marian layout (``MarianMTModel.save_pretrained``). config.json: ``d_model``,
# ``encoder_layers``, ``decoder_layers``, ``encoder_attention_heads``, ``encoder_ffn_dim``, ...,
# ``activation_function`` ("swish" in the OPUS-MT models), ``scale_embedding``,
# ``normalize_before`` absent (post-norm), ``share_encoder_decoder_embeddings``,
# ``decoder_vocab_size``, ``pad_token_id`` = ``decoder_start_token_id``, ``eos_token_id``.
# Weights: ``model.shared.weight`` (one matrix for both sides and the LM head when shared),
# ``model.encoder.layers.{i}.self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``,
# ``fc1``, ``fc2``, ``final_layer_norm``; decoder layers also ``encoder_attn.*`` and
# ``encoder_attn_layer_norm``; ``final_logits_bias`` (1, V); the sinusoidal position tables
# are not stored. Attention projections are separate q, k, v (ours are fused qkv / kv).

_ACT_FROM_HF = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu",
                "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}  # fmt: skip
_ACT_TO_HF = {"silu": "swish", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new"}

_LAYER_PLAIN = [  # (ours, Marian) per layer, both stacks
    ("ln_1", "self_attn_layer_norm"),
    ("attn.out_proj", "self_attn.out_proj"),
    ("mlp.fc", "fc1"),
    ("mlp.proj", "fc2"),
    ("ln_2", "final_layer_norm"),
]
_CROSS_PLAIN = [
    ("ln_cross", "encoder_attn_layer_norm"),
    ("cross_attn.q_proj", "encoder_attn.q_proj"),
    ("cross_attn.out_proj", "encoder_attn.out_proj"),
]


def _generation_config(path: Path) -> dict[str, Any]:
    file = path / "generation_config.json"
    if not file.is_file():
        return {}
    import json

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{file}: invalid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def config_from_hf(
    hf: dict, generation: dict | None = None, where: str = "config.json"
) -> TransformerConfig:
    """Our :class:`TransformerConfig` from a Marian ``config.json`` (and
    ``generation_config.json``) dict; layouts we do not implement are ConfigErrors."""
    if hf.get("model_type") != "marian":
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'marian'")
    generation = generation or {}
    if hf.get("normalize_before", False) or hf.get("normalize_embedding", False):
        raise ConfigError(f"{where}: pre-norm or embedding-norm Marian layouts are not supported")
    if hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads"):
        raise ConfigError(f"{where}: encoder and decoder head counts differ")
    if hf.get("encoder_ffn_dim") != hf.get("decoder_ffn_dim"):
        raise ConfigError(f"{where}: encoder and decoder feed-forward widths differ")
    act = hf.get("activation_function", "gelu")
    if act not in _ACT_FROM_HF:
        raise ConfigError(f"{where}: activation_function {act!r} is not supported")
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
        if forced not in (None, eos, [eos]):
            raise ConfigError(f"{where}: forced_eos_token_id {forced!r} differs from eos")
        return TransformerConfig(
            vocab_size=vocab if shared else dec_vocab,
            src_vocab_size=None if shared else vocab,
            d_model=int(hf["d_model"]),
            n_head=int(hf["encoder_attention_heads"]),
            n_encoder_layers=int(hf["encoder_layers"]),
            n_decoder_layers=int(hf["decoder_layers"]),
            d_ff=int(hf["encoder_ffn_dim"]),
            norm="post",
            activation=_ACT_FROM_HF[act],
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
        "model_type": "marian",
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
        "forced_eos_token_id": c.eos_id if c.force_eos else None,
        "is_encoder_decoder": True,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    generation = {
        "decoder_start_token_id": c.bos_id,
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
        "forced_eos_token_id": c.eos_id if c.force_eos else None,
        "bad_words_ids": [[c.pad_id]] if c.mask_pad else None,
        "max_length": max_position_embeddings,
    }
    return hf, {k: v for k, v in generation.items() if v is not None}


def _layer_map(config: TransformerConfig) -> list[tuple[str, str]]:
    """(our prefix, Marian prefix) of every plain (unfused) linear and norm."""
    out = []
    for stack, hf_stack, n, cross in (
        ("encoder", "model.encoder", config.n_encoder_layers, False),
        ("decoder", "model.decoder", config.n_decoder_layers, True),
    ):
        for i in range(n):
            pairs = _LAYER_PLAIN + (_CROSS_PLAIN if cross else [])
            out += [(f"{stack}.{i}.{o}", f"{hf_stack}.layers.{i}.{h}") for o, h in pairs]
    return out


def _fused(config: TransformerConfig) -> list[tuple[str, list[str]]]:
    """(our fused projection, the Marian projections concatenated into it)."""
    out = []
    for stack, hf_stack, n in (
        ("encoder", "model.encoder", config.n_encoder_layers),
        ("decoder", "model.decoder", config.n_decoder_layers),
    ):
        for i in range(n):
            base = f"{hf_stack}.layers.{i}"
            out.append(
                (f"{stack}.{i}.attn.qkv_proj", [f"{base}.self_attn.{p}_proj" for p in "qkv"])
            )
            if stack == "decoder":
                out.append((f"{stack}.{i}.cross_attn.kv_proj",
                            [f"{base}.encoder_attn.{p}_proj" for p in "kv"]))  # fmt: skip
    return out


def state_from_hf(hf_state: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """Map a Marian state dict onto our parameter names (fusing q/k/v projections)."""
    state = dict(hf_state)

    def take(key: str) -> Tensor:
        if key not in state:
            raise InputError(f"Marian weights are missing {key!r}")
        return state.pop(key)

    out: dict[str, Tensor] = {}
    for ours, hf in _layer_map(config):
        out[f"{ours}.weight"] = take(f"{hf}.weight")
        out[f"{ours}.bias"] = take(f"{hf}.bias")
    for ours, parts in _fused(config):
        out[f"{ours}.weight"] = torch.cat([take(f"{p}.weight") for p in parts], dim=0)
        out[f"{ours}.bias"] = torch.cat([take(f"{p}.bias") for p in parts], dim=0)
    if config.share_embeddings:
        shared = state.pop("model.shared.weight", None)
        if shared is None:
            shared = take("model.encoder.embed_tokens.weight")
        out["src_emb.weight"] = shared
    else:
        out["src_emb.weight"] = take("model.encoder.embed_tokens.weight")
        out["tgt_emb.weight"] = take("model.decoder.embed_tokens.weight")
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "model.shared.weight"):  # fmt: skip
        state.pop(key, None)  # tied copies of the shared matrix
    head = state.pop("lm_head.weight", None)
    if not config.tie_output:
        if head is None:
            raise InputError("Marian weights are missing 'lm_head.weight'")
        out["lm_head.weight"] = head
    bias = state.pop("final_logits_bias", None)
    out["logits_bias"] = (
        torch.zeros(config.vocab_size) if bias is None else bias.reshape(-1).to(torch.float32)
    )
    leftover = [k for k in state if not k.endswith("embed_positions.weight")]
    if leftover:
        raise InputError(f"unexpected Marian weights: {', '.join(sorted(leftover)[:5])}")
    return out


def state_to_hf(ours: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """Our state dict in Marian names (splitting the fused projections)."""
    out: dict[str, Tensor] = {}
    for o, hf in _layer_map(config):
        out[f"{hf}.weight"] = ours[f"{o}.weight"]
        out[f"{hf}.bias"] = ours[f"{o}.bias"]
    for o, parts in _fused(config):
        for name, w, b in zip(
            parts,
            ours[f"{o}.weight"].chunk(len(parts), dim=0),
            ours[f"{o}.bias"].chunk(len(parts), dim=0),
        ):
            out[f"{name}.weight"], out[f"{name}.bias"] = w, b
    if config.share_embeddings:
        out["model.shared.weight"] = ours["src_emb.weight"]
    else:
        out["model.encoder.embed_tokens.weight"] = ours["src_emb.weight"]
        out["model.decoder.embed_tokens.weight"] = ours["tgt_emb.weight"]
    bias = ours.get("logits_bias")
    out["final_logits_bias"] = (
        torch.zeros(1, config.vocab_size) if bias is None else bias.reshape(1, -1)
    )
    return out


def _describe(c: TransformerConfig) -> str:
    return (
        f"encoder-decoder Transformer, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
        f"H={c.n_head}, d={c.d_model}, vocab={c.vocab_size}"
        + (f"/{c.src_vocab_size}" if c.src_vocab_size is not None else "")
        + f", {c.norm}-norm, shared embeddings={'yes' if c.share_embeddings else 'no'}"
    )


FAMILY = Family(
    type="transformer",
    config=TransformerConfig,
    model=Transformer,
    objective="seq2seq",
    capabilities=frozenset({"translate"}),
    description="encoder-decoder Transformer for translation (Vaswani et al. 2017; Marian)",
    hf_types=("marian",),
    describe=_describe,
)
