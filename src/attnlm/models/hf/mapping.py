"""One declarative mapping between our parameter names and a Hugging Face layout's.

A layout is a table of :class:`Rule` s, one per module (or tensor) of ours, applied in both
directions by one pair of functions: :func:`to_ours` (a Hugging Face state dict -> ours, for
``from_hf``) and :func:`to_hf` (ours -> a Hugging Face state dict, for ``save_hf``). A rule
names our key and the Hugging Face key(s) and says how the tensor changes on the way:

- ``transpose``: GPT-2's ``Conv1D`` stores a weight ``(in, out)``, ``nn.Linear`` ``(out, in)``;
- several Hugging Face keys: separate ``q``, ``k``, ``v`` projections ``(C, C)`` each, fused
  into our ``qkv_proj`` ``(3C, C)`` by concatenation along dim 0 (and split back by chunks,
  or by ``sizes`` when the parts differ: grouped-query attention's ``(C + 2 C_kv, C)``);
- ``row``: a bias stored as a ``(1, V)`` row (Marian's ``final_logits_bias``), ours ``(V,)``;
- ``optional``: may be absent (the model keeps its initial value; :attr:`Layout.defaults`
  fills it on export); ``also``: other names the tensor may be stored under (read only);
- ``copy``: a Hugging Face copy of a tensor of ours (BERT's tied MLM decoder): checked equal
  on import, never written.

Per-layer tables name keys relative to one layer and :func:`layers` expands them for layers
``0..n-1`` under prefixes with ``{i}`` (``blocks.{i}.`` / ``h.{i}.``). A :class:`Layout` adds
what holds for the whole state dict: the model prefix of task models (``transformer.``,
``bert.``), key renames of older checkpoints, keys that carry nothing to load (buffers, unused
heads, tied copies) and our keys that alias another tensor (a tied LM head).

This module knows no model family and no architecture: :mod:`.gpt2`, :mod:`.bert`,
:mod:`.marian` and :mod:`.llama` hold the tables. It also holds the one name mapping their
configs share: the activation functions (``hidden_act`` / ``activation_function``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlm.base.errors import ConfigError, InputError

PARAMS = ("weight", "bias")  # a Linear's or LayerNorm's tensors
WEIGHT = ("weight",)  # an embedding's
WHOLE = ("",)  # the rule's names are whole keys

# Hugging Face activation names -> ours, and back (the GELU tanh approximation is GPT-2's)
ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu"}  # fmt: skip
ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def activation_from_hf(
    hf: Mapping[str, Any],
    key: str,
    default: str,
    where: str,
    names: Mapping[str, str] = ACT_FROM_HF,
) -> str:
    """Our activation for ``config.json``'s ``key`` (``default`` when absent); a ConfigError
    when we have no equivalent."""
    act = hf.get(key, default)
    if act not in names:
        raise ConfigError(f"{where}: {key} {act!r} is not supported")
    return names[act]


@dataclass(frozen=True)
class Rule:
    """Our module ``ours`` <-> the Hugging Face module(s) ``hf``: for each name in ``params``
    the key ``<ours>.<param>`` <-> ``<hf>.<param>`` (``WHOLE``: the names are the keys).

    ``hf`` as a tuple: our tensor is their concatenation along dim 0 (fused q, k, v).
    ``transpose``: stored transposed (a 2-D weight; 1-D biases are unaffected). ``row``: stored
    as a ``(1, N)`` row. ``prefixed``: under the layout's model prefix (False for task heads
    such as ``lm_head`` or ``cls.predictions``). ``optional``: may be absent. ``also``: other
    Hugging Face names to read it from when ``hf`` is absent (the missing-weight message names
    the last). ``copy``: a Hugging Face copy of our ``ours`` (checked equal when present, not
    written; listed after the rule of ``ours``). ``error``: the message when it is missing
    (or, for a copy, differs), instead of the generic one. ``sizes``: the rows of each part
    of a fused tensor when they are not equal. ``offset``: our tensor is theirs plus this
    (Gemma's RMSNorm stores ``w`` and multiplies by ``1 + w``; ours holds ``1 + w``)."""

    ours: str
    hf: str | tuple[str, ...]
    params: tuple[str, ...] = PARAMS
    transpose: bool = False
    row: bool = False
    prefixed: bool = True
    optional: bool = False
    also: tuple[str, ...] = ()
    copy: bool = False
    error: str = ""
    sizes: tuple[int, ...] = ()
    offset: float = 0.0  # ours = theirs + offset (Gemma's norms store w, compute 1 + w)

    @property
    def parts(self) -> tuple[str, ...]:
        return (self.hf,) if isinstance(self.hf, str) else self.hf

    def keys(self) -> Iterator[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        """``(our key, Hugging Face keys, alternative keys)`` of each parameter."""
        for p in self.params:
            yield (
                _key(self.ours, p),
                tuple(_key(h, p) for h in self.parts),
                tuple(_key(a, p) for a in self.also),
            )


def _key(module: str, param: str) -> str:
    return f"{module}.{param}" if param else module


def layers(rules: list[Rule], n: int, ours: str, hf: str) -> list[Rule]:
    """``rules`` (names relative to one layer) for layers ``0..n-1``: our names under
    ``ours``, theirs under ``hf``, both formatted with the layer index ``i``
    (``layers(BLOCK, 2, "blocks.{i}.", "h.{i}.")``)."""
    return [
        replace(
            r,
            ours=ours.format(i=i) + r.ours,
            hf=tuple(hf.format(i=i) + h for h in r.parts),
            also=tuple(hf.format(i=i) + a for a in r.also),
        )
        for i in range(n)
        for r in rules
    ]


@dataclass(frozen=True)
class Layout:
    """A Hugging Face architecture's state dict for one config of ours.

    ``name``: the architecture in messages (``"GPT-2 weights are missing ..."``). ``rules``:
    every tensor (layers expanded). ``prefix``: the base model's key prefix in the task model
    written (``transformer.`` in ``GPT2LMHeadModel``), added on export to ``prefixed`` rules.
    ``renames``: ``(regex, replacement)`` applied in turn to every key on import (the prefix
    removed where present, as a bare base model has none; old checkpoints' names).
    ``ignore``: ``fnmatch`` patterns of Hugging Face keys that carry nothing to load (mask
    buffers, unused heads, tied copies). ``tied``: our keys that are another key's tensor (a
    tied LM head; not stored). ``defaults``: our tensors exported when the model has none."""

    name: str
    rules: list[Rule]
    prefix: str = ""
    renames: tuple[tuple[str, str], ...] = ()
    ignore: tuple[str, ...] = ()
    tied: tuple[str, ...] = ()
    defaults: Mapping[str, Tensor] = field(default_factory=dict)

    @property
    def optional(self) -> tuple[str, ...]:
        """Our keys an import may leave out (tied ones and optional rules')."""
        absent = [o for r in self.rules if r.optional for o, _, _ in r.keys()]
        return (*self.tied, *absent)

    def canonical(self, key: str) -> str:
        """The name an imported Hugging Face key is matched under (``renames`` applied)."""
        for pattern, replacement in self.renames:
            key = re.sub(pattern, replacement, key)
        return key


@dataclass(frozen=True)
class Placement:
    """Where one tensor of ours comes from: the Hugging Face keys (canonical names) of its
    ``parts`` (concatenated along dim 0 when several) and the ``rule`` that says how it
    changes on the way (``transpose``, ``row``; a ``copy`` is only checked)."""

    ours: str
    parts: tuple[str, ...]
    rule: Rule


def place(layout: Layout, keys: Iterator[str] | list[str]) -> list[Placement]:
    """The plan of :func:`to_ours` for a state dict holding ``keys`` (canonical names): one
    :class:`Placement` per tensor of ours, in the rules' order; a missing or unexpected key is
    an InputError naming it (keys in ``layout.ignore`` are dropped)."""
    left = dict.fromkeys(keys)
    plan: list[Placement] = []

    def take(rule: Rule, key: str) -> str:
        if key not in left:
            raise InputError(rule.error or f"{layout.name} weights are missing {key!r}")
        del left[key]
        return key

    for rule in layout.rules:
        for ours, names, also in rule.keys():
            if rule.copy:
                if names[0] in left:
                    plan.append(Placement(ours, (take(rule, names[0]),), rule))
                continue
            if also and names[0] not in left:
                names = (next((a for a in also if a in left), also[-1]),)
            if rule.optional and names[0] not in left:
                continue
            plan.append(Placement(ours, tuple(take(rule, key) for key in names), rule))
    leftover = [k for k in left if not any(fnmatchcase(k, p) for p in layout.ignore)]
    if leftover:
        raise InputError(f"unexpected {layout.name} weights: {', '.join(sorted(leftover)[:5])}")
    return plan


def copy_differs(layout: Layout, placement: Placement) -> InputError:
    """The error of a Hugging Face copy (``Rule.copy``) that is not its tied original."""
    rule, key = placement.rule, placement.parts[0]
    return InputError(rule.error or f"{layout.name} weights: {key!r} is not the same tensor "
                      f"as its tied original")  # fmt: skip


def check_weight_shape(path: Path, key: str, shape: tuple, expected: dict[str, Tensor]) -> None:
    """A weight read as ``key`` with ``shape`` is one of the model's (``expected``: its state
    dict), of the shape its config gives; else one InputError line naming it."""
    if key not in expected:
        raise InputError(f"{path}: unexpected weight {key!r}")
    if shape != tuple(expected[key].shape):
        raise InputError(f"{path}: weight {key!r} has shape {shape}, config.json implies "
                         f"{tuple(expected[key].shape)}")  # fmt: skip


def refuse_missing(path: Path, missing: list[str], optional: tuple[str, ...]) -> None:
    """One InputError line naming the first of the model's weights the folder lacks (those in
    ``optional``, a tied head, may be absent)."""
    missing = [k for k in missing if k not in optional]
    if missing:
        raise InputError(f"{path}: weights missing for {', '.join(missing[:5])}")


def to_ours(layout: Layout, hf_state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face state dict in our names (see :func:`place` for the errors)."""
    state = {layout.canonical(k): v for k, v in hf_state.items()}
    out: dict[str, Tensor] = {}
    for p in place(layout, list(state)):
        tensors = [state.pop(key) for key in p.parts]  # fused q, k, v: (C, C) each
        if p.rule.copy:
            if not torch.equal(tensors[0], out[p.ours]):
                raise copy_differs(layout, p)
            continue
        tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)  # (3C, C)
        if p.rule.transpose:
            tensor = tensor.t()  # Conv1D (in, out) -> Linear (out, in)
        if p.rule.offset:
            tensor = tensor.float() + p.rule.offset  # (Gemma's 1 + w, computed in float32)
        out[p.ours] = tensor.reshape(-1) if p.rule.row else tensor  # (1, N) -> (N,)
    return out


def to_hf(layout: Layout, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Our state dict in the Hugging Face names (fused tensors split back into views)."""
    state = {**layout.defaults, **state}
    out: dict[str, Tensor] = {}
    for rule in layout.rules:
        if rule.copy:
            continue
        prefix = layout.prefix if rule.prefixed else ""
        for ours, names, _ in rule.keys():
            if ours not in state and rule.optional:
                continue
            tensor = state[ours]
            if rule.offset:
                tensor = tensor - rule.offset
            if rule.transpose:
                tensor = tensor.t()  # Linear (out, in) -> Conv1D (in, out)
            if rule.row:
                tensor = tensor.reshape(1, -1)  # (N,) -> (1, N)
            # fused (3C, C) -> q, k, v (C, C) each (or rows of ``sizes``), views
            if rule.sizes:
                parts = tensor.split(list(rule.sizes), dim=0)
            else:
                parts = tensor.chunk(len(names), dim=0) if len(names) > 1 else (tensor,)
            for key, part in zip(names, parts, strict=True):
                out[prefix + key] = part
    return out
