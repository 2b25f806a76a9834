"""What every model family shares: the forward output record, the summed token loss, the
parameter counter.

The forward contract (docs/architecture.md): ``model(**batch)`` returns a :class:`ModelOutput`
with ``loss_sum`` (cross-entropy summed over the targets), ``n_targets`` (how many targets were
summed, ignoring ``IGNORE_INDEX``), ``loss`` (their mean) and the logits; attention weights and
hidden states only when asked for. The trainer normalises gradients by the number of targets
in a whole optimizer step, so batches with different numbers of targets (masked LM,
sequence-to-sequence) weigh every target equally.

Shape legend
    B  batch size
    T  target (decoder) length
    S  source (encoder) length
    H  heads
    V  vocabulary size
    C  model width
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.base.errors import InputError

IGNORE_INDEX = -100  # targets with this value are not predicted (padding, unmasked positions)


@dataclass
class ModelOutput:
    """What a model family's ``forward`` returns.

    ``logits`` ``(B, T, V)`` (None from a training forward that computed its loss a chunk of
    rows at a time, ``Decoder.loss_chunk``); ``loss`` (mean cross-entropy over counted
    targets), ``loss_sum`` and ``n_targets`` when targets were given; ``attentions``: one
    ``(B, H, T, S)`` weight tensor per layer of self-attention (encoder layers for an
    encoder-only model, decoder layers for an encoder-decoder) when asked; ``hidden_states``:
    ``L + 1`` tensors ``(B, T, C)`` (the embedding output, then each layer's output) when
    asked; ``cross_attentions`` ``(B, H, T, S)`` per decoder layer and ``encoder_attentions``
    for encoder-decoder models.
    """

    logits: Tensor
    loss: Tensor | None = None
    loss_sum: Tensor | None = None
    n_targets: Tensor | None = None
    attentions: list[Tensor] | None = None
    hidden_states: list[Tensor] | None = None
    cross_attentions: list[Tensor] | None = None
    encoder_attentions: list[Tensor] | None = None
    encoder_hidden_states: list[Tensor] | None = None


def check_targets(targets: Tensor, ids: Tensor) -> None:
    """Targets aligned with the input ids (same shape), or a one-line InputError."""
    if targets.shape != ids.shape:
        raise InputError(
            f"targets must have the shape of ids {tuple(ids.shape)}, got {tuple(targets.shape)}"
        )


def token_loss(
    logits: Tensor, targets: Tensor, label_smoothing: float = 0.0
) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-entropy of ``logits`` ``(..., V)`` against ``targets`` ``(...)``.

    Returns ``(mean, sum, count)`` over the targets that are not :data:`IGNORE_INDEX`; the mean
    of no targets is 0 (not NaN) so an empty micro-batch cannot poison a step.
    """
    if targets.shape != logits.shape[:-1]:
        raise InputError(
            f"targets must have shape {tuple(logits.shape[:-1])}, got {tuple(targets.shape)}"
        )
    flat = targets.reshape(-1)
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        flat,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
        label_smoothing=label_smoothing,
    )
    count = (flat != IGNORE_INDEX).sum()
    return total / count.clamp(min=1), total, count


def count_params(
    model: nn.Module,
    trainable_only: bool = False,
    exclude: tuple[nn.Module | nn.Parameter | None, ...] = (),
) -> int:
    """Number of distinct parameters of ``model`` (a tied matrix counted once), leaving out
    frozen ones when ``trainable_only`` and those of the modules or parameters in
    ``exclude``. The one parameter counter of the package: weights kept in a decode-time
    format (:class:`~attnlm.quant.layers.QuantLinear`: bfloat16, q8, q4 codes held as
    buffers) count as the values they stand for, so a model counts the same whatever format
    holds its weights."""
    skip = set()
    for item in exclude:
        if isinstance(item, nn.Parameter):
            skip.add(id(item))
        elif item is not None:
            skip.update(id(p) for p in item.parameters())
            skip.update(id(m) for m in item.modules())
    n = sum(
        p.numel()
        for p in model.parameters()
        if id(p) not in skip and (p.requires_grad or not trainable_only)
    )
    if trainable_only:
        return n  # stored weights are buffers: never trained
    return n + sum(_stored_values(m) for m in model.modules() if id(m) not in skip)


def _stored_values(module: nn.Module) -> int:
    """The weight and bias values a quantized layer stands for (0 for any other module)."""
    from attnlm.quant.layers import QuantLinear

    if not isinstance(module, QuantLinear):
        return 0
    bias = module.bias.numel() if module.bias is not None else 0
    return module.out_features * module.in_features + bias


def check_ids(ids: Tensor, vocab_size: int, name: str = "ids") -> None:
    """Shape ``(B, T)``, integer dtype and (on CPU, outside ``torch.compile``) the id range.
    On a GPU the range check would cost a host sync per call; an id out of range then fails
    inside the embedding instead."""
    if ids.dim() != 2:
        raise InputError(f"{name} must be (B, T), got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex():
        raise InputError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if ids.shape[1] == 0:
        raise InputError(f"{name} is empty: need at least one token")
    if ids.device.type == "cpu" and not torch.compiler.is_compiling():
        lo, hi = (int(v) for v in torch.aminmax(ids)) if ids.numel() else (0, 0)  # one pass
        if lo < 0 or hi >= vocab_size:
            bad = hi if hi >= vocab_size else lo
            raise InputError(f"token id {bad} is out of range for model.vocab_size={vocab_size}")


CAPABILITIES = ("generate", "fill-mask", "translate", "embed")
OBJECTIVES = ("causal", "causal-stream", "masked", "seq2seq")


RELATIVE_POSITIONS = frozenset({"rope", "alibi", "none", "sinusoidal"})  # extend past the window


@dataclass(frozen=True)
class Decoding:
    """What the decoders (:mod:`attnlm.generate`) may do with a family's models.

    ``positions``: the position scheme (:data:`attnlm.nn.positional.POSITIONS`), or a function
    of the config (``gpt`` lets each config choose). ``window``: whether ``config.block_size``
    bounds the context a model sees; False when the decoding state carries any length
    (recurrent and n-gram states, an encoder-decoder's sinusoidal decoder).
    ``static_state``: ``new_state`` takes ``max_len`` and allocates its buffers once
    (:mod:`attnlm.nn.static_cache`).
    ``fixed_state``: ``forward`` honours a static state in fixed mode, so a one-token step
    compiles into one graph (:mod:`attnlm.runtime.compiled`). ``prefix_step``: that step also
    compiles over the filled prefix with dynamic shapes (the CPU default). ``drafts``: the
    state is a plain key/value cache whose newest positions can be dropped, so greedy
    decoding may check draft tokens (:mod:`attnlm.generate.lookahead`).
    """

    positions: str | Callable[[Any], str] = "learned"
    window: bool = True
    static_state: bool = False
    fixed_state: bool = False
    prefix_step: bool = False
    drafts: bool = False

    def scheme(self, config: Any) -> str:
        """The position scheme of ``config``."""
        return self.positions(config) if callable(self.positions) else self.positions

    def context(self, config: Any) -> int | None:
        """The window of a model of ``config`` (None: any length)."""
        return int(config.block_size) if self.window else None

    def slides(self, config: Any) -> bool:
        """Whether the decoding state may slide past the window (relative or no positions)
        rather than recomputing the last window at every step (learned positions)."""
        return self.scheme(config) in RELATIVE_POSITIONS

    def compiles(self, config: Any) -> bool:
        """Whether a model of ``config`` has a compiled one-token step (ALiBi has none)."""
        return self.fixed_state and self.scheme(config) != "alibi"


#: A model whose decoding state carries any length (recurrent, n-gram and HMM states): no
#: positions, no window.
RECURRENT = Decoding(positions="none", window=False)


@dataclass(frozen=True)
class Family:
    """A model family as the registry knows it (see :mod:`attnlm.models.registry`).

    ``type``: the name in ``[model] type = ...`` of presets and checkpoints. ``config``: its
    frozen config dataclass (``vocab_size`` is filled from the tokenizer). ``model``: the
    ``nn.Module`` class, built as ``model(config)``. ``objective``: the training objective's
    name (``causal``, ``causal-stream``, ``masked`` or ``seq2seq``, see
    :mod:`attnlm.loading.objectives`). ``capabilities``: what the family can do (``generate``,
    ``fill-mask``, ``translate``, ``embed``). ``describe``: one line about a config for logs and
    ``attnlm params``. ``decoding``: what the decoders may do with its models (:class:`Decoding`).
    """

    type: str
    config: type
    model: type
    objective: str = "causal"
    capabilities: frozenset[str] = frozenset({"generate"})
    description: str = ""
    describe: Callable[[Any], str] | None = field(default=None, compare=False)
    decoding: Decoding = field(default_factory=Decoding)

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"family {self.type}: unknown capabilities {sorted(unknown)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"family {self.type}: unknown objective {self.objective!r}")


@dataclass
class DecodingSetup:
    """What a decoder starts from for a list of sources (``model.prepare_decoding``).

    ``prompts``: the first decoder tokens of each row (a language model's prompt; an
    encoder-decoder's start token); ``state_batch``: what ``model.new_state`` conditions on
    (padded source ids and mask), None for a language model; ``eos_id``: the token that ends
    a hypothesis; ``keep_prompt``: whether results include the prompt (the decoder start
    token of an encoder-decoder, as ``transformers`` returns it); ``process``: an optional
    ``process(scores (N, V), length, max_length) -> scores`` applied to each step's next-token
    scores (log-probabilities in beam search, logits in greedy/sampled decoding), with
    ``length`` the tokens so far (prompt or start token included) and ``max_length`` the
    limit: the place for a family's logits processors (``transformers``' ``bad_words_ids``,
    ``forced_eos_token_id``), applied as ``generate`` applies them.
    """

    prompts: list[list[int]]
    state_batch: dict[str, Tensor] | None = None
    eos_id: int | None = None
    keep_prompt: bool = False
    process: Callable[[Tensor, int, int], Tensor] | None = None

    def select(self, rows: list[int]) -> DecodingSetup:
        """The setup of a subset of rows (their prompts and state-batch rows)."""
        batch = None
        if self.state_batch is not None:
            index = torch.tensor(rows, dtype=torch.long)
            batch = {k: v.index_select(0, index.to(v.device)) for k, v in self.state_batch.items()}
        prompts = [self.prompts[r] for r in rows]
        return DecodingSetup(prompts, batch, self.eos_id, self.keep_prompt, self.process)
