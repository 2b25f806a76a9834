"""One inspection record of a forward pass, for any model family.

:func:`inspect` runs a model on a text and returns an :class:`InspectionRecord`: the tokens as
the model sees them, per-layer per-head attention weights (self-attention; for an
encoder-decoder also the encoder's and the decoder's cross-attention with the source tokens)
and per-layer hidden states. Heatmaps (``attnlm attention``), the contextual-embedding
commands and the web explorer all read this record, so a new family is inspectable as soon as
its ``forward`` returns the weights.

Encoder-decoders (objective ``seq2seq``), whose forward pass needs a source and a target, go
through :func:`attnlm.inspect.translation.inspect_translation`; the others are run as
``model(ids=..., return_attention=True, return_hidden=True)``. The record class lives in
:mod:`attnlm.inspect.base` (importable from here too).

Shape legend (the batch dimension is removed: one text per record)
    H  heads
    T  tokens of the text (decoder side for an encoder-decoder)
    S  source tokens (encoder side)
    C  model width
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.inspect.base import InspectionRecord
from attnlm.inspect.translation import inspect_translation
from attnlm.tokenizers import encode_text, token_label

__all__ = ["InspectionRecord", "inspect"]


def _family_name(model: Any) -> str:
    from attnlm.models.registry import family_of

    try:
        return family_of(model).type
    except Exception:  # noqa: BLE001 - an unregistered module
        return type(model).__name__


def with_bos(tokenizer: Any, text: str, ids: list[int]) -> list[int]:
    """``ids`` (the plain encoding of ``text``) with the BOS first where the tokenizer adds one
    (Gemma's: :func:`attnlm.tokenizers.base.special_encoder`, as ``generate`` and
    TransformerLens' ``prepend_bos``); else ``ids`` as they are."""
    from attnlm.tokenizers.base import special_encoder

    bos = getattr(tokenizer, "bos_id", None)
    if not ids or bos is None or ids[0] == bos or getattr(tokenizer, "add_bos", None) is False:
        return ids
    full = special_encoder(tokenizer)(text)
    return full if full[:1] == [bos] and full[1:] == ids else ids


def model_input(model: Any, tokenizer: Any, text: str) -> tuple[list[int], dict[str, list[int]]]:
    """The ids a model sees for ``text`` (cut to the model's window) and any extra inputs.

    Encoders trained with the masked objective whose tokenizer builds model input
    (``encode_for_model``: BERT's WordPiece) get ``[CLS] text [SEP]``, or a sentence pair
    ``[CLS] a [SEP] b [SEP]`` with token types when the text holds ``[SEP]``; other models
    get the plain ids, the BOS first where the tokenizer adds one (:func:`with_bos`)."""
    block = getattr(getattr(model, "config", None), "block_size", None)
    if _objective(model) == "masked" and hasattr(tokenizer, "encode_for_model"):
        a, sep, b = text.partition("[SEP]")
        a, b = a.strip(), b.replace("[SEP]", " ").strip()
        if not a:
            raise InputError("the text is empty; give a sentence (or 'A [SEP] B')")
        enc = tokenizer.encode_for_model(a, b if sep and b else None, max_length=block)
        return enc["input_ids"], {"token_type_ids": enc["token_type_ids"]}
    ids = with_bos(tokenizer, text, encode_text(tokenizer, text, "the text"))
    if not ids:
        raise InputError("the text is empty after tokenization; give at least one character")
    if block is not None:
        ids = ids[: int(block)]
    return ids, {}


def _objective(model: Any) -> str | None:
    from attnlm.models.registry import family_of

    try:
        return family_of(model).objective
    except Exception:  # noqa: BLE001 - an unregistered module
        return None


@torch.no_grad()
def inspect(
    model: Any, tokenizer: Any, text: str, *, target: str | Sequence[int] | None = None
) -> InspectionRecord:
    """Run ``model`` on ``text`` and record tokens, attention and hidden states (see the
    module docstring). ``target``: the target side for encoder-decoders, a text or the
    target ids a decoder produced (translated greedily when it is None). Texts longer than
    the model's window are cut to the window."""
    if _objective(model) == "seq2seq":
        return inspect_translation(model, tokenizer, text, target)
    if target is not None:
        raise InputError("a target text only applies to translation models")
    ids, extra = model_input(model, tokenizer, text)
    device = model_device(model)
    x = torch.tensor([ids], device=device)
    extra = {k: torch.tensor([v], device=device) for k, v in extra.items()}
    with eval_mode(model):
        out = model(ids=x, **extra, return_attention=True, return_hidden=True)
    if not out.attentions:
        raise InputError(f"{_family_name(model)} models return no attention weights")
    return InspectionRecord(
        family=_family_name(model),
        tokens=[token_label(tokenizer, i) for i in ids],
        ids=list(ids),
        attentions=[a[0].float().cpu() for a in out.attentions],
        hidden_states=[h[0].float().cpu() for h in (out.hidden_states or [])],
        logits=out.logits[0].float().cpu() if out.logits is not None else None,
    )
