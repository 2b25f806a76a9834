"""The encoder-decoder Transformer for translation (Vaswani et al., 2017, "Attention Is All
You Need").

source ids -> embedding * sqrt(C) + sinusoidal positions -> N encoder blocks (self-attention
over the source, padding masked) -> memory. target ids (``[start] + target``) -> embedding *
sqrt(C) + positions -> N decoder blocks (causal self-attention, cross-attention over the
memory) -> LM head (tied to the target embedding) -> logits for the next target token.

Options: post-norm (the paper, Marian) or pre-norm (then a final norm after each stack),
shared source/target embeddings, label smoothing (Szegedy et al., 2016; the paper uses 0.1).
The file reads top to bottom: the config, the model (encoder, decoder, loss, decoding
protocol), the registry entry. Beside it: the decoding state
(:mod:`attnlm.models.transformer_state`).

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
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import above_zero, fraction, non_negative, one_of, positive
from attnlm.models.base import (
    Decoding,
    DecodingSetup,
    Family,
    ModelOutput,
    check_ids,
    count_params,
    token_loss,
)
from attnlm.models.transformer_packed import packed_loss, packing_applies
from attnlm.models.transformer_state import EncoderDecoderState
from attnlm.nn.attention import KVCache, MultiHeadAttention, Packing, padding_mask
from attnlm.nn.blocks import (
    ACTIVATIONS,
    NORMS,
    FeedForward,
    TransformerBlock,
    block_class,
    dropout_layer,
)
from attnlm.nn.cache import NoCache
from attnlm.nn.positional import SinusoidalPositionalEncoding

LAYOUTS = ("interleaved", "split")


@dataclass(frozen=True)
class TransformerConfig:
    """Shape and options of a :class:`Transformer` encoder-decoder. Invalid values raise
    :class:`~attnlm.base.errors.ConfigError` naming the field (``model.<field>``).

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
    force_eos: bool = True  # the last allowed token is forced (Marian's forced_eos_token_id)
    forced_eos_id: int | None = None  # the token forced there; None: eos_id

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "d_model", "n_head", "n_encoder_layers", "n_decoder_layers")
        positive(self, "src_vocab_size", "d_ff", optional=True)
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})"
            )
        one_of(self, "norm", NORMS)
        one_of(self, "activation", ACTIVATIONS)
        one_of(self, "positions_layout", LAYOUTS)
        fraction(self, "dropout", "attention_dropout", "label_smoothing")
        above_zero(self, "layer_norm_eps")
        if self.share_embeddings and self.source_vocab != self.vocab_size:
            raise ConfigError(
                f"model.share_embeddings needs one vocabulary, but model.src_vocab_size="
                f"{self.src_vocab_size} and model.vocab_size={self.vocab_size}"
            )
        non_negative(self, "pad_id", "bos_id", "eos_id")
        non_negative(self, "forced_eos_id", optional=True)

    @property
    def forced_eos(self) -> int:
        """The token forced at the last position of a decode (``force_eos``)."""
        return self.eos_id if self.forced_eos_id is None else self.forced_eos_id

    def check_ids(self) -> None:
        """The special ids fit the target vocabulary (checked when the model is built: before
        the data is known, presets validate with a stand-in vocabulary size)."""
        for name in ("pad_id", "bos_id", "eos_id", "forced_eos_id"):
            if (getattr(self, name) or 0) >= self.vocab_size:
                raise ConfigError(
                    f"model.{name} must be a token id below model.vocab_size={self.vocab_size}, "
                    f"got {getattr(self, name)}"
                )

    @property
    def source_vocab(self) -> int:
        return self.vocab_size if self.src_vocab_size is None else self.src_vocab_size


def _attention(c: TransformerConfig, cross: bool = False) -> MultiHeadAttention:
    return MultiHeadAttention(
        c.d_model, c.n_head, cross=cross, bias=c.bias, dropout=c.attention_dropout
    )


def _norm(c: TransformerConfig) -> nn.LayerNorm:
    return nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)


def transformer_block(c: TransformerConfig, cross: bool = False) -> TransformerBlock:
    """An encoder block: self-attention, then the feed-forward network; with ``cross``, a
    decoder block: causal self-attention, cross-attention over the encoder's output (queries
    from the target, keys and values from the source), then the feed-forward network. Each
    sublayer has its LayerNorm after it (post-norm: the paper, Marian) or before (pre-norm)."""
    decoder = dict(cross_attn=_attention(c, cross=True), cross_norm=_norm(c)) if cross else {}
    return block_class(c.norm)(
        _attention(c),
        FeedForward(c.d_model, c.d_ff, activation=c.activation, bias=c.bias, dropout=c.dropout),
        sa_norm=_norm(c),
        mlp_norm=_norm(c),
        dropout=c.dropout,
        **decoder,
    )


class Transformer(nn.Module):
    """Encoder-decoder Transformer (see the module docstring).

    ``forward(src (B, S), src_mask (B, S) bool, tgt_in (B, T), targets (B, T)) ->
    ModelOutput`` with logits ``(B, T, V)``, the label-smoothed loss when ``targets`` are
    given, and on request decoder self-attention, cross-attention ``(B, H, T, S)`` and encoder
    attention per layer. Module names: ``src_emb``, ``tgt_emb`` (the same module when shared),
    ``pos`` (sinusoidal), ``encoder`` / ``decoder`` (:func:`transformer_block` lists, the
    decoder's with cross-attention), ``enc_ln`` / ``dec_ln`` (final norms of a
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
        self.encoder = nn.ModuleList(transformer_block(c) for _ in range(c.n_encoder_layers))
        self.decoder = nn.ModuleList(transformer_block(c, True) for _ in range(c.n_decoder_layers))
        # pre-norm stacks end in a norm of their own; post-norm blocks already end in one
        self.enc_ln = _norm(c) if c.norm == "pre" else nn.Identity()
        self.dec_ln = _norm(c) if c.norm == "pre" else nn.Identity()
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
        self,
        emb: nn.Embedding,
        ids: Tensor,
        positions: Tensor | None = None,
        packing: Packing | None = None,
    ) -> Tensor:
        """Scaled embeddings plus the sinusoids of ``positions`` ``(T,)`` (None: ``0..T-1``),
        dropout: ``(B, T, C)``, or ``(N, C)`` of the tokens ``packing`` keeps."""
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device)
        pe = self.pos(positions)  # (T, C)
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
        x = self._embed(self.src_emb, src)  # (B, S, C)
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
        (B, T, V), self-attention per layer, cross-attention per layer, hidden states)``.
        The cache (or none) gives the new tokens' positions and mask (a fixed state's hides
        its unwritten slots, for a compiled step; otherwise causal, applied by attention)."""
        check_ids(tgt_in, self.config.vocab_size, "tgt_in")
        state = NoCache() if cache is None else cache
        T = tgt_in.shape[1]
        x = self._embed(self.tgt_emb, tgt_in, state.positions(T, tgt_in.device))  # (B, T, C)
        mask = state.mask(T, x.dtype)  # (T, max_len) or None: causal, applied by attention
        attend = dict(mask=mask, is_causal=mask is None, cache=cache, need_weights=return_attention)
        self_w, cross_w, hidden = [], [], [x]
        for layer, block in enumerate(self.decoder):
            x, w, cw = block(x, layer=layer, context=memory, context_mask=context_mask, **attend)
            self_w.append(w)
            cross_w.append(cw)
            hidden.append(x)
        state.advance(T)
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
        if packing_applies(targets, return_attention or return_hidden):
            return packed_loss(self, src, tgt_in, src_mask, targets)  # the same loss, faster
        memory, mask, enc_w, enc_h = self.encode(src, src_mask, return_attention)
        logits, self_w, cross_w, hidden = self.decode(
            tgt_in, memory, mask, return_attention=return_attention
        )
        out = ModelOutput(
            logits=logits,
            attentions=self_w if return_attention else None,
            hidden_states=hidden if return_hidden else None,
            cross_attentions=cross_w if return_attention else None,
            encoder_attentions=enc_w if return_attention else None,
            encoder_hidden_states=enc_h if return_hidden else None,
        )
        if targets is not None:
            smoothing = self.config.label_smoothing
            out.loss, out.loss_sum, out.n_targets = token_loss(logits, targets, smoothing)
        return out

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
        position before ``max_length``, every token but the forced one (``forced_eos_id``,
        by default ``eos_id``) banned (``force_eos``): ``transformers``'
        ``NoBadWordsLogitsProcessor`` and ``ForcedEOSTokenLogitsProcessor`` as Marian's
        generation config sets them. A forced token other than ``eos_id`` does not end the
        row: it ends at the length limit, as in ``generate``."""
        c = self.config
        scores = scores.clone()
        if c.mask_pad:
            scores[:, c.pad_id] = float("-inf")
        if c.force_eos and length == max_length - 1:
            scores[:] = float("-inf")
            scores[:, c.forced_eos] = 0.0
        return scores

    def new_state(
        self,
        batch: dict[str, Tensor] | None = None,
        *,
        max_len: int | None = None,
        reuse: EncoderDecoderState | None = None,
    ) -> EncoderDecoderState:
        """Encode ``batch["src"]`` (with ``batch["src_mask"]``) once; the state holds the
        memory for the cross-attention and an empty decoder cache (``max_len``: its buffers
        hold that many target positions, allocated once; else they grow by doubling).
        ``reuse``: an earlier state, restarted on this batch (its buffers kept) when it has
        the same ``max_len`` and rows (a compiled step's state, read at fixed addresses)."""
        if batch is None or "src" not in batch:
            raise InputError("an encoder-decoder decodes from a source: pass {'src', 'src_mask'}")
        device = self.lm_head.weight.device
        src = batch["src"].to(device)
        src_mask = batch.get("src_mask")
        memory, mask, _, _ = self.encode(src, None if src_mask is None else src_mask.to(device))
        if (
            isinstance(reuse, EncoderDecoderState)
            and reuse.max_len == max_len
            and reuse.batch_size == memory.shape[0]
        ):
            reuse.restart(memory, mask)
            return reuse
        return EncoderDecoderState(self.config.n_decoder_layers, memory, mask, max_len)

    def step(self, tokens: Tensor, state: EncoderDecoderState) -> Tensor:
        """Feed decoder ``tokens`` ``(B, n)`` after what ``state`` holds; logits ``(B, n, V)``."""
        logits, _, _, _ = self.decode(tokens, state.memory, state.context_mask, cache=state)
        if state.memory is not None:
            state.memory = None  # the cross-attention keys/values are in the cache now
        return logits

    # -- utilities -----------------------------------------------------------------------------

    def num_params(self) -> int:
        """Number of parameters (shared and tied matrices counted once)."""
        return count_params(self)


# -- registry entry ---------------------------------------------------------------------------


def _describe(c: TransformerConfig) -> str:
    return (
        f"encoder-decoder Transformer, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
        f"H={c.n_head}, d={c.d_model}, vocab={c.vocab_size}"
        + (f"/{c.src_vocab_size}" if c.src_vocab_size is not None else "")
        + f", {c.norm}-norm, shared embeddings={'yes' if c.share_embeddings else 'no'}"
    )


FAMILY = Family(
    "transformer", TransformerConfig, Transformer, "seq2seq", frozenset({"translate"}),
    description="encoder-decoder Transformer for translation (Vaswani et al. 2017; Marian)",
    describe=_describe, decoding=Decoding("sinusoidal", False, static_state=True, fixed_state=True),
)  # fmt: skip
