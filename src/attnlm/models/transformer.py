"""The encoder-decoder Transformer for translation (Vaswani et al., 2017, "Attention Is All
You Need"), loading and writing Hugging Face Marian (``MarianMTModel``) folders.

source ids -> embedding * sqrt(C) + sinusoidal positions -> N encoder blocks (self-attention
over the source, padding masked) -> memory. target ids (``[start] + target``) -> embedding *
sqrt(C) + positions -> N decoder blocks (causal self-attention, cross-attention over the
memory) -> LM head (tied to the target embedding) -> logits for the next target token.

Options: post-norm (the paper, Marian) or pre-norm (then a final norm after each stack),
shared source/target embeddings, label smoothing (Szegedy et al., 2016; the paper uses 0.1).
The file reads top to bottom: the config, the model (encoder, decoder, loss, decoding
protocol), its Marian import/export, the registry entry. Beside it: the decoding state
(:mod:`attnlm.models.transformer_state`), inspection (:mod:`attnlm.models.transformer_inspect`)
and the Marian layout (:mod:`attnlm.models.hf.marian`).

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
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlm.errors import ConfigError, InputError
from attnlm.models.base import (
    IGNORE_INDEX,
    Decoding,
    DecodingSetup,
    Family,
    ModelOutput,
    check_ids,
    check_targets,
    count_params,
    token_loss,
)
from attnlm.models.hf import marian
from attnlm.models.hf.folder import (
    load_hf_weights,
    read_generation_config,
    read_hf_config,
    write_hf_folder,
)
from attnlm.models.hf.mapping import to_hf
from attnlm.models.transformer_inspect import inspect_translation
from attnlm.models.transformer_state import EncoderDecoderState
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
    force_eos: bool = True  # the last allowed token is forced (Marian's forced_eos_token_id)
    forced_eos_id: int | None = None  # the token forced there; None: eos_id

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
        for name in ("pad_id", "bos_id", "eos_id", "forced_eos_id"):
            value = getattr(self, name)
            if name == "forced_eos_id" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{name} must be a token id >= 0, got {value!r}")

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
        self,
        emb: nn.Embedding,
        ids: Tensor,
        start: int = 0,
        packing: Packing | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Scaled embeddings plus positions ``start..`` (or the tensor ``positions`` ``(T,)``),
        dropout: ``(B, T, C)``, or ``(N, C)`` of the tokens ``packing`` keeps."""
        if positions is None:
            pe = self.pos.span(start, ids.shape[1], ids.device)  # (T, C): positions start..
        else:  # a fixed decoding state: positions are a device tensor, the same graph each step
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
        (B, T, V), self-attention per layer, cross-attention per layer, hidden states)``.
        A cache in fixed mode (a compiled step, :mod:`attnlm.generate.compiled`): positions
        from its cursor, attention over its whole buffers with the unwritten slots masked."""
        check_ids(tgt_in, self.config.vocab_size, "tgt_in")
        if getattr(cache, "fixed", False):
            x = self._embed(self.tgt_emb, tgt_in, positions=cache.positions(tgt_in.shape[1]))
            mask, is_causal = cache.visible(tgt_in.shape[1], x.dtype), False  # (T, max_len)
        else:
            start = cache.position if cache is not None else 0
            x = self._embed(self.tgt_emb, tgt_in, start)
            mask, is_causal = None, True
        self_w, cross_w, hidden = [], [], [x]
        for layer, block in enumerate(self.decoder):
            x, w, cw = block(
                x,
                mask=mask,
                is_causal=is_causal,
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

    # -- inspection: model.inspect(tokenizer, text, target=None), see transformer_inspect ----

    inspect = inspect_translation

    # -- utilities -----------------------------------------------------------------------------

    def num_params(self) -> int:
        """Number of parameters (shared and tied matrices counted once)."""
        return count_params(self)

    # -- Hugging Face Marian folders (the layout: attnlm.models.hf.marian) --------------------

    @classmethod
    def from_hf(cls, path: str | Path) -> Transformer:
        """Load a ``MarianMTModel`` folder (``config.json`` with ``model_type: "marian"`` and
        ``model.safetensors`` or ``pytorch_model.bin``), in eval mode. The decoding settings
        (``bad_words_ids`` = padding, ``forced_eos_token_id``) follow
        ``generation_config.json`` when the folder has one."""
        path = Path(path)
        fields = marian.config_from_hf(
            read_hf_config(path), read_generation_config(path), str(path)
        )
        config = TransformerConfig(**fields)
        return load_hf_weights(cls(config), path, marian.layout(config))

    def save_hf(self, path: str | Path, max_position_embeddings: int = 512) -> None:
        """Write this model as a ``MarianMTModel`` folder (``config.json``,
        ``generation_config.json``, ``model.safetensors``) that
        ``transformers.MarianMTModel.from_pretrained`` loads."""
        hf_config, generation = marian.config_to_hf(self.config, max_position_embeddings)
        state = to_hf(marian.layout(self.config), self.state_dict())
        write_hf_folder(path, hf_config, state, generation)


# -- registry entry ---------------------------------------------------------------------------


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
    hf_types=(marian.MODEL_TYPE,),
    describe=_describe,
    decoding=Decoding(positions="sinusoidal", window=False, static_state=True, fixed_state=True),
)
