"""The inspection record of :class:`~attnlm.models.rnn_seq2seq.RNNSeq2Seq`: translate (or
teacher-force) one text and keep the decoder's attention over the source, Bahdanau et al.'s
(2015) alignment view. The record's rows are the target tokens the decoder emits at each step
(the end token included), its keys the source tokens (their end token included).

``RNNSeq2Seq.inspect`` calls :func:`inspect_translation`; the helpers read the tokenizer, which
is either one tokenizer shared by both sides or a pair with ``.source`` and ``.target``
(:class:`attnlm.data.pairs.PairTokenizers`). This layer cannot import ``attnlm.inspect``, so
the record class comes from :mod:`attnlm.models.base`.

Shape legend (the batch dimension is removed: one text per record)
    T  target tokens (decoder steps)
    S  source tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from attnlm.errors import InputError
from attnlm.models.base import InspectionRecord

if TYPE_CHECKING:
    from attnlm.models.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig


@torch.no_grad()
def inspect_translation(
    model: RNNSeq2Seq, tokenizer: Any, text: str, target: str | Sequence[int] | None = None
) -> InspectionRecord:
    """The :class:`~attnlm.inspect.record.InspectionRecord` of ``model`` translating ``text``
    (greedy), or teacher-forcing ``target`` (a text, or target ids without the start token as
    a decoder produced them, an end token appended when missing): ``source_tokens`` (the
    source with its end token), ``tokens`` (the target tokens predicted, ``eos`` included) and
    ``cross_attentions`` ``[(1, T, S)]``. The model runs in eval mode; its mode is restored."""
    c = model.config
    src_tok, tgt_tok = _sides(tokenizer)
    src_ids = _encode(tokenizer, "source", src_tok, text, c.eos_id)
    was_training = model.training
    model.eval()
    try:
        if target is None:
            out_ids = model.greedy([src_ids])[0]
        elif isinstance(target, str):
            out_ids = _encode(tokenizer, "target", tgt_tok, target, None) + [c.eos_id]
        else:  # target ids as decoding produced them (no start token)
            out_ids = [int(i) for i in target]
            if not out_ids or out_ids[-1] != c.eos_id:
                out_ids.append(c.eos_id)
        batch = model.source_batch([src_ids])
        tgt_in = torch.tensor([[c.bos_id, *out_ids[:-1]]], device=batch["src"].device)
        out = model(**batch, tgt_in=tgt_in, return_attention=True)
    finally:
        model.train(was_training)
    assert out.cross_attentions is not None
    src_specials = _special_labels(tokenizer, "source", c)
    tgt_specials = _special_labels(tokenizer, "target", c)
    return InspectionRecord(
        family="rnn-seq2seq",
        tokens=[_label(tgt_tok, i, tgt_specials) for i in out_ids],
        ids=list(out_ids),
        attentions=[],
        hidden_states=[],
        source_tokens=[_label(src_tok, i, src_specials) for i in src_ids],
        source_ids=list(src_ids),
        cross_attentions=[out.cross_attentions[0][0].float().cpu()],  # (1, T, S)
    )


# ---------------------------------------------------------------------------------------------
# Tokenizer helpers: one shared tokenizer or a pair (.source / .target)


def _sides(tokenizer: Any) -> tuple[Any, Any]:
    if hasattr(tokenizer, "source") and hasattr(tokenizer, "target"):
        return tokenizer.source, tokenizer.target
    return tokenizer, tokenizer


def _encode(tokenizer: Any, side: str, tok: Any, text: str, eos: int | None) -> list[int]:
    """Ids of ``text``: a pair tokenizer's own rule for ``side`` (``encode(text, side)`` adds
    the start / end tokens its config gives; the target's start token is dropped here since
    the decoder adds it), else the plain tokenizer's ids plus ``eos`` when given."""
    from attnlm.tokenizers import encode_text

    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "source_ids"):
        ids = list(tokenizer.encode(text, side))
        sp = getattr(tokenizer, f"{side}_ids")
        if side == "target":
            ids = [i for i in ids if i not in (sp.bos, sp.eos)]
    else:
        ids = encode_text(tok, text, f"the {side} text") + ([eos] if eos is not None else [])
    if not ids:
        raise InputError(f"the {side} text is empty after tokenization")
    return ids


def _special_labels(tokenizer: Any, side: str, config: RNNSeq2SeqConfig) -> dict[int, str]:
    sp = getattr(tokenizer, f"{side}_ids", None)
    cfg = getattr(tokenizer, "config", None)
    if sp is not None and cfg is not None and hasattr(cfg, "pad"):
        return {sp.pad: cfg.pad, sp.bos: cfg.bos, sp.eos: cfg.eos}
    return {config.pad_id: "<pad>", config.bos_id: "<s>", config.eos_id: "</s>"}


def _label(tok: Any, i: int, specials: dict[int, str]) -> str:
    from attnlm.tokenizers import token_label

    if i in specials and i >= getattr(tok, "vocab_size", i + 1):
        return specials[i]
    try:
        return token_label(tok, i)
    except (IndexError, KeyError, ValueError):
        return specials.get(i, f"<{i}>")
