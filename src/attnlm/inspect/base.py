"""The inspection record: what one forward pass shows, for any model family.

Built by :func:`attnlm.inspect.record.inspect` (and, for encoder-decoders,
:func:`attnlm.inspect.translation.inspect_translation`); read by heatmaps, the contextual
embedding commands and the web explorer. Its own module so that both builders import it
without importing each other.

Shape legend (the batch dimension is removed: one text per record)
    H  heads
    T  tokens of the text (decoder side for an encoder-decoder)
    S  source tokens (encoder side)
    C  model width
    V  vocabulary size
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlm.base.errors import InputError


@dataclass
class InspectionRecord:
    """What one forward pass shows (built by :func:`attnlm.inspect.record.inspect` and, for
    encoder-decoders, :func:`attnlm.inspect.translation.inspect_translation`). ``attentions``: per
    layer ``(H, T, T)``; ``hidden_states``: ``L + 1`` tensors ``(T, C)`` (embedding output first);
    ``cross_attentions``: per decoder layer ``(H, T, S)`` and ``encoder_attentions`` per
    encoder layer ``(H, S, S)`` for encoder-decoders; ``source_tokens`` their ``S`` labels;
    ``logits`` ``(T, V)`` the model's output at each position."""

    family: str
    tokens: list[str]
    ids: list[int]
    attentions: list[Tensor]
    hidden_states: list[Tensor]
    source_tokens: list[str] | None = None
    source_ids: list[int] | None = None
    cross_attentions: list[Tensor] | None = None
    encoder_attentions: list[Tensor] | None = None
    encoder_hidden_states: list[Tensor] | None = None
    logits: Tensor | None = None  # (T, V): the next-token (or target) logits at each position

    @property
    def n_layers(self) -> int:
        return len(self.attentions)

    @property
    def n_heads(self) -> int:
        return int(self.attentions[0].shape[0]) if self.attentions else 0

    def maps(self, kind: str = "self") -> tuple[list[Tensor], list[str], list[str]]:
        """Attention maps of one kind with their query and key labels: ``self`` (the text's
        self-attention), ``cross`` (target queries over source keys) or ``encoder``."""
        if kind == "self" and self.attentions:  # an RNN translation model has none
            return self.attentions, self.tokens, self.tokens
        if kind == "cross" and self.cross_attentions:
            return self.cross_attentions, self.tokens, self.source_tokens or []
        if kind == "encoder" and self.encoder_attentions:
            src = self.source_tokens or []
            return self.encoder_attentions, src, src
        raise InputError(f"this {self.family} model has no {kind} attention")

    def to_json(self, digits: int = 5) -> dict[str, Any]:
        """The record as JSON data: ``{"family", "tokens", "attention": [layer][head][query]
        [key]}`` plus ``source_tokens``, ``cross_attention`` and ``encoder_attention`` for
        encoder-decoders (the web explorer's and the HTML export's format)."""

        def nest(maps: list[Tensor]) -> list:
            return [torch.round(m.float(), decimals=digits).tolist() for m in maps]

        out: dict[str, Any] = {
            "family": self.family,
            "tokens": self.tokens,
            "attention": nest(self.attentions),
        }
        if self.source_tokens is not None:
            out["source_tokens"] = self.source_tokens
        if self.cross_attentions is not None:
            out["cross_attention"] = nest(self.cross_attentions)
        if self.encoder_attentions is not None:
            out["encoder_attention"] = nest(self.encoder_attentions)
        return out


def family_or_none(model: Any) -> Any:
    """The registry family of ``model``, or None for a model of no family."""
    from attnlm.models.registry import family_of

    try:
        return family_of(model)
    except Exception:  # noqa: BLE001
        return None


def require(model: Any, capability: str, command: str) -> None:
    """A one-line error unless ``model``'s family can do ``capability`` (for ``command``)."""
    fam = family_or_none(model)
    if fam is None or capability not in fam.capabilities:
        name = fam.type if fam is not None else type(model).__name__
        raise InputError(f"{command} needs a model that can {capability}; a {name} model cannot")
