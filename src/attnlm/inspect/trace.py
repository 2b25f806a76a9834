"""Every activation of a decoder by name, and interventions on them, in one forward pass.

Names and layouts are TransformerLens's, so that its tutorials and users' code transfer::

    hook_embed, hook_pos_embed                         (B, T, C)
    blocks.{L}.hook_resid_pre / hook_resid_mid / hook_resid_post   (B, T, C)
    blocks.{L}.ln1.hook_scale, ln2.hook_scale          (B, T, 1)  the norm's divisor
    blocks.{L}.ln1.hook_normalized, ln2.hook_normalized (B, T, C)  before its weight and bias
    blocks.{L}.attn.hook_q                             (B, T, H, D)   before rotary positions
    blocks.{L}.attn.hook_k, hook_v                     (B, T, Hkv, D)  (Hkv: key/value heads)
    blocks.{L}.attn.q_norm.hook_scale, hook_normalized (B, T, H, 1|D)  per-head q norm (Qwen3,
                                                       Gemma 3; k_norm.* likewise), before rotary
    blocks.{L}.attn.hook_rot_q, hook_rot_k             (B, T, H|Hkv, D)  after them (rotary only)
    blocks.{L}.attn.hook_attn_scores                   (B, H, T, S)  scaled; masked keys hold
                                                       the dtype's lowest value
    blocks.{L}.attn.hook_pattern                       (B, H, T, S)  the softmax
    blocks.{L}.attn.hook_z                             (B, T, H, D)  each head's mixed values
    blocks.{L}.attn.hook_result                        (B, T, H, C)  each head's write into the
                                                       residual (its slice of W_O, no bias)
    blocks.{L}.ln1_post.hook_scale, hook_normalized    a sandwich block's post-attention norm
                                                       (Gemma; ln2_post.* after the MLP)
    blocks.{L}.hook_attn_out                           (B, T, C)  (after ln1_post)
    blocks.{L}.mlp.hook_pre                            (B, T, F)  before the activation (the
                                                       gate, for a gated MLP)
    blocks.{L}.mlp.hook_pre_linear                     (B, T, F)  a gated MLP's linear branch
    blocks.{L}.mlp.hook_post                           (B, T, F)  after the activation (x up)
    blocks.{L}.mlp.hook_expert_weights                 (B, T, k)  a mixture of experts (in
    blocks.{L}.mlp.hook_expert_indices                 (B, T, k)  place of the three above):
                                                       each position's k experts, in order of
                                                       probability, and their weights
    blocks.{L}.hook_mlp_out                            (B, T, C)
    ln_final.hook_scale, ln_final.hook_normalized
    hook_logits                                        (B, T, V)

(``B`` batch, ``T`` positions, ``S`` keys, ``C`` width, ``H`` heads, ``D`` head width, ``F``
the MLP's width, ``V`` the vocabulary.)

**Nothing changes when no trace runs.** The decoder's forward takes ``trace=None``; with a
:class:`Tracer` it runs its blocks through :meth:`Tracer.block`, which calls the same modules
and kernels in the same order and only *reads* what lies on that path (the residual stream,
q/k/v, ``z``, the MLP's inner activations). What the fast path does not form (the attention
pattern under the fused kernel, a norm's scale, each head's result) is computed beside it, for
the names asked only, so the logits of a trace that only captures are bit-identical to a plain
forward (tested). An intervention on such a name switches that one sublayer to its explicit
formula, whose output then carries the edit. The model is never modified.

**Interventions** (:class:`Intervention`): ``set``, ``add``, ``scale``, ``zero``, ``mean``
(the mean over the batch and positions of this run) or ``patch`` (the same activation from
another run: a :class:`Trace`), on a whole activation, one ``head`` and/or one ``position``;
or any function ``tensor -> tensor`` (a TransformerLens hook). They apply in the pass, before
the activation is captured or used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnlm.base.errors import InputError
from attnlm.inspect.trace_attention import attention, norm_apply, norm_mean, norm_parts

OPS = ("set", "add", "scale", "zero", "mean", "patch", "fn")

BLOCK_POINTS = (
    "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k",
    "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_attn_scores",
    "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out", "hook_resid_mid",
    "ln2.hook_scale", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_pre_linear",
    "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
)  # fmt: skip
#: names whose tensors have a head axis, and where it is (in the layouts above)
HEAD_AXIS = {"attn.hook_q": 2, "attn.hook_k": 2, "attn.hook_v": 2, "attn.hook_rot_q": 2,
             "attn.hook_rot_k": 2, "attn.hook_z": 2, "attn.hook_result": 2,
             "attn.q_norm.hook_scale": 2, "attn.q_norm.hook_normalized": 2,
             "attn.k_norm.hook_scale": 2, "attn.k_norm.hook_normalized": 2,
             "attn.hook_attn_scores": 1, "attn.hook_pattern": 1}  # fmt: skip
#: the query-position axis where it is not 1
POSITION_AXIS = {"attn.hook_attn_scores": 2, "attn.hook_pattern": 2}


@dataclass(frozen=True)
class Intervention:
    """An edit of activation ``name`` during the pass (see the module docstring): ``op`` one
    of :data:`OPS`; ``value`` the tensor (``set``, ``add``), the factor (``scale``), the
    :class:`Trace` to take the activation from (``patch``) or the function (``fn``);
    ``head`` / ``position`` narrow it to one head or one (query) position."""

    name: str
    op: str
    value: Any = None
    head: int | None = None
    position: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise InputError(f"intervention {self.op!r} is not one of {', '.join(OPS)}")


def set_(name: str, value: Any, **where: int) -> Intervention:
    return Intervention(name, "set", value, **where)


def add(name: str, value: Any, **where: int) -> Intervention:
    return Intervention(name, "add", value, **where)


def scale(name: str, factor: float, **where: int) -> Intervention:
    return Intervention(name, "scale", factor, **where)


def zero(name: str, **where: int) -> Intervention:
    return Intervention(name, "zero", None, **where)


def mean_ablate(name: str, **where: int) -> Intervention:
    return Intervention(name, "mean", None, **where)


def patch(name: str, source: Mapping[str, Tensor], **where: int) -> Intervention:
    return Intervention(name, "patch", source, **where)


def hook(name: str, fn: Callable[[Tensor], Tensor]) -> Intervention:
    return Intervention(name, "fn", fn)


def _local(name: str) -> str:
    """``blocks.3.attn.hook_z`` -> ``attn.hook_z`` (a block's own name)."""
    parts = name.split(".")
    return ".".join(parts[2:]) if parts[0] == "blocks" else name


def _select(t: Tensor, name: str, head: int | None, position: int | None) -> tuple:
    """The index of the slice of ``t`` (activation ``name``) at ``head`` / ``position``."""
    index: list[Any] = [slice(None)] * t.dim()
    local = _local(name)
    if head is not None:
        axis = HEAD_AXIS.get(local)
        if axis is None:
            raise InputError(f"{name} has no head axis (heads: {', '.join(HEAD_AXIS)})")
        if not -t.shape[axis] <= head < t.shape[axis]:
            raise InputError(f"head {head} is out of range for {name} ({t.shape[axis]} heads)")
        index[axis] = head
    if position is not None:
        axis = POSITION_AXIS.get(local, 1)
        if not -t.shape[axis] <= position < t.shape[axis]:
            raise InputError(f"position {position} is out of range for {name} "
                             f"({t.shape[axis]} positions)")  # fmt: skip
        index[axis] = position
    return tuple(index)


def _apply(iv: Intervention, t: Tensor) -> Tensor:
    """``t`` with the intervention applied (a new tensor; ``t`` is left as it was)."""
    if iv.op == "fn":  # its own copy: a function may edit it in place (TransformerLens's way)
        out = iv.value(t.clone())
        if not isinstance(out, Tensor) or out.shape != t.shape:
            raise InputError(f"a hook on {iv.name} must return a tensor of shape {tuple(t.shape)}")
        return out
    out = t.clone()
    idx = _select(t, iv.name, iv.head, iv.position)
    part = out[idx]
    if iv.op == "zero":
        new = torch.zeros_like(part)
    elif iv.op == "scale":
        new = part * float(iv.value)
    elif iv.op == "mean":
        dims = [0, POSITION_AXIS.get(_local(iv.name), 1)] if iv.position is None else [0]
        dims = [d - sum(1 for a in _dropped(idx) if a < d) for d in dims]
        new = part.mean(dim=dims, keepdim=True).expand_as(part)
    else:
        if iv.op == "patch" and iv.name not in iv.value:
            raise InputError(f"patching {iv.name}: the source run did not capture it")
        value = iv.value[iv.name] if iv.op == "patch" else iv.value
        value = torch.as_tensor(value, dtype=t.dtype, device=t.device)
        if iv.op == "patch":
            if value.shape != t.shape:
                raise InputError(f"patching {iv.name}: the source is {tuple(value.shape)}, this "
                                 f"run {tuple(t.shape)} (the texts must tokenize to the same "
                                 f"length)")  # fmt: skip
            value = value[idx]
        new = part + value if iv.op == "add" else value.expand_as(part)
    out[idx] = new
    return out


def _dropped(idx: tuple) -> list[int]:
    """Axes an integer index removes."""
    return [a for a, i in enumerate(idx) if isinstance(i, int)]


@dataclass
class Tracer:
    """What one traced pass captures (``names``: a set, or None for every name) and the
    edits it applies (``interventions``); :attr:`captured` fills as the pass runs."""

    names: set[str] | None = None
    interventions: Sequence[Intervention] = ()
    captured: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._edits: dict[str, list[Intervention]] = {}
        for iv in self.interventions:
            self._edits.setdefault(iv.name, []).append(iv)
        self.applied: set[str] = set()

    def wants(self, name: str) -> bool:
        """Whether ``name`` is captured or edited (so worth computing off the fast path)."""
        return name in self._edits or self.names is None or name in self.names

    def edits(self, name: str) -> bool:
        return name in self._edits

    def point(self, name: str, t: Tensor) -> Tensor:
        """Activation ``name``: edited (when asked), captured (when asked), returned."""
        for iv in self._edits.get(name, ()):
            t = _apply(iv, t)
            self.applied.add(name)
        if self.names is None or name in self.names:
            # no copy of a fresh contiguous result: nothing in the pass edits one in place (an
            # intervention edits a copy); a view into a larger tensor (q, k, v) is copied out
            self.captured[name] = t.detach().contiguous()
        return t

    # -- the decoder's parts -------------------------------------------------------------------

    def norm(self, prefix: str, norm: Any, x: Tensor) -> Tensor:
        """``norm(x)`` with ``PREFIX.hook_scale`` and ``PREFIX.hook_normalized``."""
        s, n = f"{prefix}.hook_scale", f"{prefix}.hook_normalized"
        if not (self.wants(s) or self.wants(n)) or isinstance(norm, torch.nn.Identity):
            return norm(x)  # (no norm, no points: OLMo 2's pre-norms)
        scale_, normalized = norm_parts(norm, x)
        scale_ = self.point(s, scale_)
        edited = self.edits(s) or self.edits(n)
        if edited:
            normalized = (x - norm_mean(norm, x)) / scale_ if self.edits(s) else normalized
        normalized = self.point(n, normalized)
        return norm_apply(norm, normalized) if edited else norm(x)

    def block(self, block: Any, x: Tensor, layer: int, attend: dict[str, Any]) -> Tensor:
        """One pre-norm block (:class:`attnlm.nn.blocks.TransformerBlock`) with every point."""
        p = f"blocks.{layer}"
        x = self.point(f"{p}.hook_resid_pre", x)
        h = self.norm(f"{p}.ln1", block.ln_1, x)
        h = self.attention(p, block.attn, h, layer, attend)
        post = getattr(block, "ln_post_attn", None)  # a sandwich block's post-norms (Gemma)
        if post is not None:
            h = self.norm(f"{p}.ln1_post", post, h)
        h = self.point(f"{p}.hook_attn_out", block.scaled(block.drop(h)))
        x = self.point(f"{p}.hook_resid_mid", x + h)
        h = self.norm(f"{p}.ln2", block.ln_2, x)
        h = self.mlp(p, block.mlp, h)
        if post is not None:
            h = self.norm(f"{p}.ln2_post", block.ln_post_mlp, h)
        h = self.point(f"{p}.hook_mlp_out", block.scaled(h))
        return self.point(f"{p}.hook_resid_post", x + h)

    def mlp(self, p: str, mlp: Any, h: Tensor) -> Tensor:
        from attnlm.nn.blocks import ACTIVATIONS, SwiGLU

        if getattr(mlp, "experts", None) is not None:  # a mixture of experts
            rows = h.reshape(-1, h.shape[-1])
            weights, chosen = mlp.route(rows)
            shape = (*h.shape[:-1], -1)
            weights = self.point(f"{p}.mlp.hook_expert_weights", weights.reshape(shape))
            chosen = self.point(f"{p}.mlp.hook_expert_indices", chosen.reshape(shape))
            k = mlp.n_used
            return mlp.mix(rows, weights.reshape(-1, k), chosen.reshape(-1, k)).reshape(h.shape)
        pre = mlp.fc(h)
        if isinstance(mlp, SwiGLU):  # gated (SwiGLU, GeGLU)
            gate, up = pre.chunk(2, dim=-1)
            g = self.point(f"{p}.mlp.hook_pre", gate)
            u = self.point(f"{p}.mlp.hook_pre_linear", up)
            if self.edits(f"{p}.mlp.hook_pre") or self.edits(f"{p}.mlp.hook_pre_linear"):
                post = ACTIVATIONS[mlp.gated_act](g) * u
            else:
                post = mlp.gate(pre)
        else:
            pre = self.point(f"{p}.mlp.hook_pre", pre)
            post = mlp.act(pre)
        post = self.point(f"{p}.mlp.hook_post", post)
        return mlp.drop(mlp.proj(post))

    def attention(self, p: str, attn: Any, h: Tensor, layer: int, attend: dict[str, Any]):
        """Self-attention of a block with its points (see :func:`attention`)."""
        return attention(self, p, attn, h, layer, attend)


# -- the public call --------------------------------------------------------------------------


class Trace(dict):
    """The captured activations (name -> tensor, TransformerLens layouts) and ``logits``
    ``(B, T, V)``, ``tokens`` (the ids) of one traced pass."""

    logits: Tensor
    tokens: Tensor


def hook_names(model: Any) -> list[str]:
    """Every name a trace of ``model`` can capture, in the order of the pass."""
    _check_traceable(model)
    names = ["hook_embed"]
    if getattr(model, "pos_emb", None) is not None:
        names.append("hook_pos_embed")
    rotary = getattr(model, "rotary", None) is not None
    for layer, block in enumerate(model.blocks):
        turned = rotary and not getattr(block.attn, "nope", False)  # NoPE layers: no rotation
        names += [f"blocks.{layer}.{point}" for point in _block_points(block, turned)]
    return [*names, "ln_final.hook_scale", "ln_final.hook_normalized", "hook_logits"]


def _block_points(block: Any, rotary: bool) -> list[str]:
    """The points of one block, in the order of the pass: :data:`BLOCK_POINTS` with the
    optional parts' (q/k norms before the rotation, post-norms after each sublayer)."""
    from attnlm.nn.blocks import SwiGLU

    points = []
    moe = getattr(block.mlp, "experts", None) is not None
    bare = isinstance(block.ln_1, torch.nn.Identity)  # no pre-norms (OLMo 2)
    for point in BLOCK_POINTS:
        if point.startswith("attn.hook_rot") and not rotary:
            continue
        if bare and point.startswith(("ln1.", "ln2.")):
            continue
        if moe and point.startswith("mlp."):  # a mixture of experts: its routing instead
            if point == "mlp.hook_pre":
                points += ["mlp.hook_expert_weights", "mlp.hook_expert_indices"]
            continue
        if point == "mlp.hook_pre_linear" and not isinstance(block.mlp, SwiGLU):
            continue
        if point == "hook_attn_out" and getattr(block, "ln_post_attn", None) is not None:
            points += ["ln1_post.hook_scale", "ln1_post.hook_normalized"]
        if point == "hook_mlp_out" and getattr(block, "ln_post_mlp", None) is not None:
            points += ["ln2_post.hook_scale", "ln2_post.hook_normalized"]
        if point == "attn.hook_rot_q" or (point == "attn.hook_attn_scores" and not rotary):
            for name in ("q_norm", "k_norm"):
                if getattr(block.attn, name, None) is not None:
                    points += [f"attn.{name}.hook_scale", f"attn.{name}.hook_normalized"]
        points.append(point)
    return points


def _check_traceable(model: Any) -> None:
    from attnlm.nn.blocks import PostNormBlock, TransformerBlock

    blocks = getattr(model, "blocks", None)
    ok = (
        blocks is not None and hasattr(model, "lm_head")
        and all(type(b) is TransformerBlock or (isinstance(b, TransformerBlock)
                and not isinstance(b, PostNormBlock)) for b in blocks)
        and all(b.cross_attn is None for b in blocks)
    )  # fmt: skip
    if not ok:
        raise InputError(
            f"tracing needs a causal decoder (gpt, llama and the GGUF / Hugging Face models "
            f"built on them); this is a {type(model).__name__}"
        )


def _ids(model: Any, inputs: Any, tokenizer: Any) -> Tensor:
    if isinstance(inputs, str):
        if tokenizer is None:
            raise InputError("a text needs the tokenizer (trace(model, text, tokenizer=tok))")
        ids = torch.tensor([list(tokenizer.encode(inputs))])
    else:
        ids = torch.as_tensor(inputs)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise InputError(f"inputs must be a text or token ids (B, T), got shape {tuple(ids.shape)}")
    from attnlm.base.device import model_device

    return ids.to(model_device(model))


def trace(
    model: Any,
    inputs: Any,
    names: Iterable[str] | None = None,
    interventions: Iterable[Intervention] | None = None,
    *,
    tokenizer: Any = None,
    last_only: bool = False,
) -> Trace:
    """Run ``model`` once on ``inputs`` (a text with ``tokenizer``, or token ids ``(T,)`` /
    ``(B, T)``) and return the activations ``names`` (None: every name of
    :func:`hook_names`) with the ``interventions`` applied in the same pass (see the module
    docstring); ``result.logits`` are the pass's logits (the last position's only, ``(B, 1,
    V)``, with ``last_only``: the LM head and the final norm run on nothing else). Unknown
    names, heads or positions out of range are refused in one line."""
    _check_traceable(model)
    known = set(hook_names(model))
    wanted = None if names is None else set(names)
    interventions = list(interventions or ())
    for name in (wanted or set()) | {iv.name for iv in interventions}:
        if name not in known:
            raise InputError(f"unknown hook name {name!r} (attnlm trace --model M --names "
                             f"lists them; e.g. blocks.0.attn.hook_pattern)")  # fmt: skip
    tracer = Tracer(wanted, interventions)
    ids = _ids(model, inputs, tokenizer)
    with torch.inference_mode():
        logits = model(ids, trace=tracer, last_only=last_only).logits
    out = Trace(tracer.captured)
    out.logits, out.tokens = logits, ids
    return out
