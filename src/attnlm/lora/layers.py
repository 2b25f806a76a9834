"""LoRA: low-rank adapters beside frozen linear layers (Hu et al., 2021, "LoRA: Low-Rank
Adaptation of Large Language Models").

A frozen weight ``W`` ``(out, in)`` gets a trainable update of rank ``r``::

    y = x Wᵀ + b + (α / r) · dropout(x) Aᵀ Bᵀ        A: (r, in), B: (out, r)

``A`` starts Kaiming-uniform (``a = √5``, as ``nn.Linear`` and peft), ``B`` at zero, so an
adapted model gives exactly the base model's outputs until the first update. Merging writes
``W + (α / r) B A`` into a plain linear layer (:func:`merge_lora`): the same function, no
extra cost at inference.

attnlm fuses projections (``qkv_proj`` holds ``[W_Q; W_K; W_V]``, SwiGLU's ``fc`` holds
``[W_gate; W_up]``), so one :class:`LoRALinear` may carry several adapters, each on a slice of
the output rows: an adapter on ``q`` of the fused projection is exactly an adapter on a
separate ``q_proj`` (as in Hugging Face's Llama). Target names, the same for every family
built from :mod:`attnlm.nn` parts (gpt, llama, bert, transformer):

=========  ===========================================================================
``q``      query rows of ``attn.qkv_proj`` (cross-attention: ``q_proj``)
``k, v``   key / value rows of ``attn.qkv_proj`` (cross-attention: of ``kv_proj``)
``qkv``    one adapter over the whole fused ``qkv_proj`` (peft on GPT-2's fused ``c_attn``)
``o``      ``attn.out_proj``
``gate``   gate rows of SwiGLU's ``fc`` (llama only)
``up``     up rows of SwiGLU's ``fc``; the whole ``fc`` of a GELU/ReLU feed-forward
``down``   the feed-forward's ``proj``
``all``    every name above the model has except ``qkv`` (peft's ``all-linear``: not the LM head)
=========  ===========================================================================

Training (autograd recording, the base frozen, no dropout active) takes one
:class:`torch.autograd.Function` per layer (:func:`lora_linear`): the base product, the
adapters' ``x Aᵀ`` for all slices at once and each slice's ``z_i B_iᵀ`` added into its own rows
of the output, and a hand-written backward that adds the adapters' share of ``dx`` into the
base's in place; no zero-padded ``B``, no concatenation, and only ``x`` and ``z`` saved. The
plain path above computes the same numbers (tested against it).

An adapted causal decoder (gpt, llama) computes its training loss ``Decoder.loss_chunk`` rows
at a time (:func:`attnlm.nn.fused.chunked_head_loss`), because its head is frozen and its
logits serve the loss alone: the ``(B T, V)`` logits, log-softmax and gradient are never held
at once (``ModelOutput.logits`` is then None under autograd).

Shape legend
    N  rows (tokens)
    K  adapters on one layer (slices), r their rank
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.nn import fused, grad_precision
from attnlm.nn.attention import MultiHeadAttention
from attnlm.nn.blocks import FeedForward, SwiGLU

__all__ = [
    "TARGETS",
    "LoRAConfig",
    "LoRALinear",
    "apply_lora",
    "has_lora",
    "load_lora_state_dict",
    "lora_linear",
    "lora_state_dict",
    "merge_lora",
    "parse_targets",
]

TARGETS = ("q", "k", "v", "qkv", "o", "gate", "up", "down")
ALL = ("q", "k", "v", "o", "gate", "up", "down")
DEFAULT_TARGETS = ("q", "v")  # peft's default for Llama, BERT and Marian
DEFAULT_ALPHA = 8.0  # peft's LoraConfig default (lora_alpha=8)
# Rows of the training loss per chunk on an adapted causal decoder (its head is frozen and the
# logits serve the loss alone): a (1024, V) block instead of three (B T, V) arrays


def parse_targets(text: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``"q,v"`` (or a sequence of names) -> ``("q", "v")``; ``all`` expands to :data:`ALL`.
    Unknown names and ``qkv`` together with ``q``/``k``/``v`` raise ConfigError."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    names = [t for t in names if t]
    if not names:
        raise ConfigError("--lora-targets: give at least one of " + ",".join(TARGETS) + ",all")
    out: list[str] = []
    for name in names:
        if name == "all":
            out += ALL
        elif name in TARGETS:
            out.append(name)
        else:
            raise ConfigError(
                f"--lora-targets: unknown target {name!r} (known: {','.join(TARGETS)},all)"
            )
    out = list(dict.fromkeys(out))
    if "qkv" in out and set(out) & {"q", "k", "v"}:
        raise ConfigError("--lora-targets: qkv already covers q, k and v; give one or the other")
    return tuple(out)


@dataclass(frozen=True)
class LoRAConfig:
    """The adapters of a run: rank ``r``, ``alpha`` (scale ``alpha / r``), ``dropout`` on the
    adapters' input, and the target names (:data:`TARGETS`). Invalid values raise
    ConfigError naming the flag."""

    r: int
    alpha: float = DEFAULT_ALPHA
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ConfigError(f"--lora must be a positive whole number (the rank), got {self.r!r}")
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a <= 0:
            raise ConfigError(f"--lora-alpha must be a positive number, got {a!r}")
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= d < 1.0:
            raise ConfigError(f"--lora-dropout must be in [0, 1), got {d!r}")
        object.__setattr__(self, "alpha", float(a))
        object.__setattr__(self, "dropout", float(d))
        object.__setattr__(self, "targets", parse_targets(self.targets))

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    def to_dict(self) -> dict:
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout,
                "targets": list(self.targets)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> LoRAConfig:
        try:
            return cls(int(data["r"]), float(data["alpha"]), float(data["dropout"]),
                       tuple(data["targets"]))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"incomplete or malformed ({e})") from None  # run.py names it


class LoRALinear(nn.Linear):
    """A frozen linear layer with low-rank adapters on slices of its output rows.

    Keeps the layer's own ``weight`` ``(out, in)`` and ``bias`` (the same parameters, so tied
    weights stay tied and the state-dict keys do not change) and adds ``lora_A[name]``
    ``(r, in)`` and ``lora_B[name]`` ``(rows, r)`` per adapter, ``slices[name] = (start,
    stop)`` its output rows. ``forward(x (..., in)) -> (..., out)``: the base product
    (on the fused CPU kernel when the layer had it) plus ``scale · dropout(x) Aᵀ Bᵀ``, the
    adapters' ``A`` stacked so that all of them take one product ``(N, K r)`` and one
    block-diagonal ``B``."""

    def __init__(
        self,
        base: nn.Linear,
        slices: dict[str, tuple[int, int]],
        r: int,
        alpha: float,
        dropout: float = 0.0,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.fused = isinstance(base, fused.Linear)
        self.r, self.scale = r, alpha / r
        self.slices = dict(slices)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        dev, dtype = base.weight.device, base.weight.dtype
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        for name, (start, stop) in self.slices.items():
            a = torch.empty(r, self.in_features, device=dev, dtype=dtype)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # nn.Linear's (and peft's) init
            self.lora_A[name] = nn.Parameter(a)
            self.lora_B[name] = nn.Parameter(torch.zeros(stop - start, r, device=dev, dtype=dtype))

    def _base(self, x: Tensor) -> Tensor:
        if self.fused:
            return fused.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def delta_weight(self) -> Tensor:
        """``scale · B A`` laid into the rows of each slice: ``(out, in)``."""
        delta = self.weight.new_zeros(self.out_features, self.in_features)
        for name, (start, stop) in self.slices.items():
            delta[start:stop] = self.lora_B[name] @ self.lora_A[name]
        return delta * self.scale

    def _stacked_b(self) -> Tensor:
        """The adapters' ``B`` as one ``(out, K r)`` matrix: ``B_i`` at the rows of slice
        ``i`` and the columns of adapter ``i``, zeros elsewhere."""
        names = list(self.slices)
        if len(names) == 1:
            start, stop = self.slices[names[0]]
            b = self.lora_B[names[0]]
            if start == 0 and stop == self.out_features:
                return b
            return F.pad(b, (0, 0, start, self.out_features - stop))
        cols = []
        for name in names:
            start, stop = self.slices[name]
            cols.append(F.pad(self.lora_B[name], (0, 0, start, self.out_features - stop)))
        return torch.cat(cols, dim=1)  # (out, K r)

    def _fast(self, x: Tensor) -> bool:
        """Whether :func:`lora_linear` computes this call: autograd records (not under
        autocast or the compiler, which pick their own kernels), the base is frozen, and no
        dropout is active on the adapters' input."""
        frozen = not self.weight.requires_grad and (
            self.bias is None or not self.bias.requires_grad
        )
        no_drop = isinstance(self.lora_dropout, nn.Identity) or not self.training
        plain = not torch.is_autocast_enabled(x.device.type) and not torch.compiler.is_compiling()
        return frozen and no_drop and plain and torch.is_grad_enabled()

    def forward(self, x: Tensor) -> Tensor:
        if self._fast(x):
            names = list(self.slices)
            return lora_linear(x, self.weight, self.bias, [self.lora_A[n] for n in names],
                               [self.lora_B[n] for n in names],
                               [self.slices[n] for n in names], self.scale)  # fmt: skip
        y = self._base(x)  # (..., out)
        names = list(self.slices)
        if len(names) == 1:
            a = self.lora_A[names[0]]
        else:
            a = torch.cat([self.lora_A[n] for n in names], dim=0)  # (K r, in)
        z = F.linear(self.lora_dropout(x), a)  # (..., K r)
        b = self._stacked_b()  # (out, K r)
        shape = y.shape
        y2, z2 = y.reshape(-1, shape[-1]), z.reshape(-1, z.shape[-1])  # (N, out), (N, K r)
        return torch.addmm(y2, z2, b.t(), alpha=self.scale).view(shape)

    def merged(self) -> nn.Linear:
        """A plain linear layer (the fused kernel's when this one had it) with weight
        ``W + scale · B A``; the base weight itself is left as it is."""
        cls = fused.Linear if self.fused else nn.Linear
        out = cls(self.in_features, self.out_features, bias=self.bias is not None,
                  device=self.weight.device, dtype=self.weight.dtype)  # fmt: skip
        with torch.no_grad():
            out.weight.copy_(self.weight + self.delta_weight())
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out

    def extra_repr(self) -> str:
        spans = ", ".join(f"{n}={a}:{b}" for n, (a, b) in self.slices.items())
        return (
            f"{self.in_features} -> {self.out_features}, r={self.r}, scale={self.scale:g}, {spans}"
        )


class _LoRALinear(torch.autograd.Function):
    """``y = x Wᵀ + b``, then ``y[:, slice_i] += scale · z_i B_iᵀ`` with ``z = x [A_1; ...]ᵀ``
    ``(N, K r)``, ``W`` and ``b`` frozen. Backward, with ``dz_i = dy[:, slice_i] B_i``:
    ``dx = dy W + scale · dz [A_1; ...]``, ``dA = scale · dzᵀ x`` (split per adapter),
    ``dB_i = scale · dy[:, slice_i]ᵀ z_i``."""

    @staticmethod
    def forward(ctx, x, weight, bias, spans, scale, k, *ab):
        a_list, b_list = ab[:k], ab[k:]
        x2 = x.reshape(-1, x.shape[-1])  # (N, in)
        y = fused.linear(x2, weight, bias)  # (N, out); autograd does not record in here
        a = a_list[0] if k == 1 else torch.cat(a_list, dim=0)  # (K r, in)
        z = F.linear(x2, a)  # (N, K r)
        r = a_list[0].shape[0]
        for i, (start, stop) in enumerate(spans):
            y[:, start:stop].addmm_(z[:, i * r : (i + 1) * r], b_list[i].t(), alpha=scale)
        ctx.save_for_backward(x2, weight, a, z, *b_list)
        ctx.spans, ctx.scale, ctx.k, ctx.r, ctx.x_shape = spans, scale, k, r, x.shape
        ctx.bf16 = grad_precision.bf16_grads(x)  # inside grad_precision.bf16_backward
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        with grad_precision.products_in_bf16(ctx.bf16):
            return _LoRALinear._backward(ctx, dy)

    @staticmethod
    def _backward(ctx, dy):
        x2, weight, a, z, *b_list = ctx.saved_tensors
        spans, scale, k, r = ctx.spans, ctx.scale, ctx.k, ctx.r
        dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
        parts = [dy2[:, start:stop].mm(b) for (start, stop), b in zip(spans, b_list)]
        dz = parts[0] if k == 1 else torch.cat(parts, dim=1)  # (N, K r)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = fused._grad_mm(ctx.bf16)(dy2, weight.t())  # dy W: (N, in)
            dx = dx.addmm_(dz, a, alpha=scale).view(ctx.x_shape)  # the adapters' share
        da = dz.t().mm(x2).mul_(scale)  # (K r, in)
        db = [dy2[:, start:stop].t().mm(z[:, i * r : (i + 1) * r]).mul_(scale)
              for i, (start, stop) in enumerate(spans)]  # fmt: skip
        return (dx, None, None, None, None, None, *da.split(r, dim=0), *db)


def lora_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    a: list[Tensor],
    b: list[Tensor],
    spans: list[tuple[int, int]],
    scale: float,
) -> Tensor:
    """A frozen linear layer with adapters, in one autograd step: ``x`` ``(..., in)``, the
    base ``weight`` ``(out, in)`` and ``bias``, adapter ``i``'s ``a[i]`` ``(r, in)`` and
    ``b[i]`` ``(stop - start, r)`` on output rows ``spans[i]``; returns ``(..., out)``, the
    numbers of :meth:`LoRALinear.forward`'s plain path."""
    return _LoRALinear.apply(x, weight, bias, tuple(spans), scale, len(a), *a, *b)


# -- where the targets sit in each kind of module ---------------------------------------------


def _attention_slots(m: MultiHeadAttention) -> dict[str, dict[str, tuple[int, int]]]:
    """Linear attribute -> {target name: output rows} for one attention module."""
    C, Ckv = m.d_model, m.d_kv
    Q = m.d_q  # the queries' rows: H D (C unless the head width is chosen)
    if m.cross:
        return {
            "q_proj": {"q": (0, Q), "qkv": (0, Q)},
            "kv_proj": {"k": (0, Ckv), "v": (Ckv, 2 * Ckv), "qkv": (0, 2 * Ckv)},
            "out_proj": {"o": (0, C)},
        }
    return {
        "qkv_proj": {
            "q": (0, Q),
            "k": (Q, Q + Ckv),
            "v": (Q + Ckv, Q + 2 * Ckv),
            "qkv": (0, Q + 2 * Ckv),
        },  # fmt: skip
        "out_proj": {"o": (0, C)},
    }


def _slots(module: nn.Module) -> dict[str, dict[str, tuple[int, int]]] | None:
    if isinstance(module, MultiHeadAttention):
        return _attention_slots(module)
    if isinstance(module, SwiGLU):
        F_ = module.proj.in_features
        return {
            "fc": {"gate": (0, F_), "up": (F_, 2 * F_)},
            "proj": {"down": (0, module.proj.out_features)},
        }
    if isinstance(module, FeedForward):
        return {"fc": {"up": (0, module.fc.out_features)},
                "proj": {"down": (0, module.proj.out_features)}}  # fmt: skip
    return None


def available_targets(model: nn.Module) -> tuple[str, ...]:
    """The target names ``model`` has layers for, in :data:`TARGETS` order."""
    found: set[str] = set()
    for module in model.modules():
        for names in (_slots(module) or {}).values():
            found.update(names)
    return tuple(t for t in TARGETS if t in found)


def _check_float_weights(model: nn.Module) -> None:
    """Adapters add ``B A`` to float weights: a model stored in q8/q4/bf16 for decoding
    (:mod:`attnlm.quant`) has none to add to, or to merge into."""
    from attnlm.quant.layers import weights_format

    fmt = weights_format(model)  # read off its layers
    if fmt != "f32":
        raise InputError(
            f"LoRA adapters need float32 weights and this model's are {fmt} (decode-time "
            "weights): load it with --weights f32 (weights='f32')"
        )


def _check_rank(model: nn.Module, r: int, wanted: tuple[str, ...]) -> None:
    """A rank above ``min(d_in, rows)`` of an adapted span adds nothing (``B A`` cannot have a
    higher rank than that) and only costs memory: ``--lora 99999999`` asked for 25 GB."""
    limit = None
    for module in model.modules():
        for attr, names in (_slots(module) or {}).items():
            base = getattr(module, attr)
            for t in wanted:
                if t in names:
                    lo, hi = names[t]
                    width = min(base.in_features, hi - lo)
                    limit = width if limit is None else min(limit, width)
    if limit is not None and r > limit:
        raise ConfigError(
            f"--lora {r}: the rank can be at most {limit} for this model (the smallest input "
            "width or output rows of the layers it adapts; a higher rank adds nothing)"
        )


def apply_lora(
    model: nn.Module,
    r: int | LoRAConfig,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: str | tuple[str, ...] = DEFAULT_TARGETS,
) -> nn.Module:
    """Freeze every parameter of ``model`` and put LoRA adapters on the ``targets`` (names of
    :data:`TARGETS`, ``"all"``), in place; returns ``model``. ``r`` is the rank (or a whole
    :class:`LoRAConfig`); ``alpha`` defaults to :data:`DEFAULT_ALPHA` (peft's), so the scale is
    ``alpha / r``. A target the model has no layer for (``gate`` on a GELU model) is refused
    in one line; with ``all``, only the names the model has are used."""
    if isinstance(r, LoRAConfig):
        cfg = r
    else:
        cfg = LoRAConfig(r, DEFAULT_ALPHA if alpha is None else alpha, dropout, targets)
    if has_lora(model):
        raise ConfigError("this model already has LoRA adapters")
    _check_float_weights(model)
    have = available_targets(model)
    wanted = cfg.targets
    if isinstance(targets, str) and "all" in targets.split(",") or tuple(wanted) == ALL:
        wanted = tuple(t for t in wanted if t in have)
    missing = [t for t in wanted if t not in have]
    if missing or not wanted:
        family = type(model).__name__
        raise ConfigError(
            f"--lora-targets: {','.join(missing) or 'nothing'} matches no layer of this "
            f"{family} model (its targets: {','.join(have) or 'none'})"
        )
    _check_rank(model, cfg.r, wanted)
    model.requires_grad_(False)  # (a causal decoder's frozen head: its loss in chunks)
    for module in list(model.modules()):
        for attr, names in (_slots(module) or {}).items():
            spans = {t: names[t] for t in wanted if t in names}
            if spans:
                base = getattr(module, attr)
                setattr(module, attr, LoRALinear(base, spans, cfg.r, cfg.alpha, cfg.dropout))
    return model


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors only (keys ``...lora_A.<name>`` / ``...lora_B.<name>``)."""
    return {k: v for k, v in model.state_dict().items() if ".lora_A." in k or ".lora_B." in k}


def load_lora_state_dict(model: nn.Module, state: dict[str, Tensor], where: str = "") -> None:
    """Copy adapter tensors into ``model`` (which has the same adapters): every adapter key
    must be there with its shape, and nothing else; else InputError naming ``where``."""
    own = lora_state_dict(model)
    where = f"{where}: " if where else ""
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise InputError(f"{where}the adapters do not fit this model ({what})")
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise InputError(
                f"{where}adapter {key} has shape {tuple(value.shape)}, the model wants "
                f"{tuple(own[key].shape)}"
            )
    with torch.no_grad():
        params = dict(model.named_parameters())
        for key, value in state.items():
            params[key].copy_(value)


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` of ``model`` by a plain linear layer with weight
    ``W + scale · B A`` (in place), and make every parameter trainable again, as in a model
    that never had adapters; returns ``model``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    model.requires_grad_(True)
    return model
