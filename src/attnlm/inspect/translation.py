"""The inspection record of one translation, for every encoder-decoder family (the
Transformer of :mod:`attnlm.models.transformer`, the RNN of :mod:`attnlm.models.rnn_seq2seq`).

Translate ``text`` greedily through :func:`attnlm.generate.translate.translate_ids` (or take
the ``target`` given), then run one teacher-forced forward pass asking for attention weights
and hidden states, and keep what the model returns: the decoder's cross-attention over the
source (Bahdanau et al.'s 2015 alignment view) always; decoder self-attention, encoder
self-attention and hidden states where the family has them (the Transformer; the RNN decoder
returns its one cross-attention map and its readout vectors). The record's rows are the target
tokens the decoder emits at each step (the end token included), its keys the source tokens (the
end token the source rule adds included).

``tokenizer``: a :class:`~attnlm.data.pairs.PairTokenizers`, or one tokenizer for both sides
(wrapped as one, its special ids read from the tokenizer).

Shape legend (the batch dimension is removed: one text per record)
    H  heads (1 for the RNN's single attention)
    T  target tokens (decoder steps)
    S  source tokens
    C  model width
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.data.pairs import PairTokenizers
from attnlm.generate.translate import translate_ids
from attnlm.inspect.base import InspectionRecord
from attnlm.tokenizers import token_label

DEFAULT_MAX_NEW_TOKENS = 128  # length limit of the greedy translation when the config has none


#: The longest source or target an inspection takes, in tokens: the record keeps every layer's
#: (H, T, T) attention, so memory grows with the square of the length (1,024 tokens: about
#: 200 MB for a 6-layer, 8-head model); a longer text is refused, never cut silently.
MAX_INSPECT_TOKENS = 1024


def _check_length(n: int, side: str) -> None:
    if n > MAX_INSPECT_TOKENS:
        raise InputError(
            f"the {side} text is {n:,} tokens long; inspecting attention takes at most "
            f"{MAX_INSPECT_TOKENS:,} (the weights grow with the square of the length)"
        )


@torch.no_grad()
def inspect_translation(
    model: Any, tokenizer: Any, text: str, target: str | Sequence[int] | None = None
) -> InspectionRecord:
    """The :class:`~attnlm.inspect.base.InspectionRecord` of ``model`` translating ``text``:
    greedy when ``target`` is None (at most ``config.max_target_len`` new tokens, else
    :data:`DEFAULT_MAX_NEW_TOKENS`; the rows end where decoding ended), otherwise
    teacher-forcing ``target``, a text or target ids without the start token as a decoder
    produced them (an end token appended when missing). Per layer: ``cross_attentions``
    ``(H, T, S)``, and where the family returns them ``attentions`` ``(H, T, T)``,
    ``encoder_attentions`` ``(H, S, S)``, ``hidden_states`` ``(T, C)`` and
    ``encoder_hidden_states`` ``(S, C)``. The model runs in eval mode; its mode is restored."""
    from attnlm.models.registry import family_of

    c = model.config
    pairs = tokenizer if isinstance(tokenizer, PairTokenizers) else None
    if pairs is None:
        pairs = PairTokenizers.from_tokenizers(tokenizer)
    if not pairs.tokens(text, "source"):
        raise InputError("the source text is empty after tokenization")
    source = pairs.encode_source(text)
    _check_length(len(source), "source")
    with eval_mode(model):
        if target is None:  # as decoded: no end token when the length limit came first
            limit = getattr(c, "max_target_len", None) or DEFAULT_MAX_NEW_TOKENS
            out = translate_ids(model, [source], max_new_tokens=limit)[0][1:]
        else:
            if isinstance(target, str):
                out = pairs.tokens(target, "target")
                if not out:
                    raise InputError("the target text is empty after tokenization")
            else:  # target ids as decoding produced them (no start token)
                out = [int(i) for i in target]
            _check_length(len(out), "target")
            if not out or out[-1] != c.eos_id:
                out.append(c.eos_id)
        device = model_device(model)
        src = torch.tensor([source], device=device)  # (1, S)
        tgt_in = torch.tensor([[c.bos_id, *out[:-1]]], device=device)  # (1, T)
        res = model(
            src=src, src_mask=None, tgt_in=tgt_in, return_attention=True, return_hidden=True
        )  # one row: no padding to mask
    if not res.cross_attentions:
        raise InputError(f"{type(model).__name__} returns no cross-attention weights")

    def first(ts: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        return [t[0].float().cpu() for t in ts or ()]  # drop the batch axis

    return InspectionRecord(
        family=family_of(model).type,
        tokens=_labels(pairs, out, "target"),
        ids=out,
        attentions=first(res.attentions),
        hidden_states=first(res.hidden_states),
        source_tokens=_labels(pairs, source, "source"),
        source_ids=source,
        cross_attentions=first(res.cross_attentions),
        encoder_attentions=first(res.encoder_attentions) or None,
        encoder_hidden_states=first(res.encoder_hidden_states) or None,
    )


def _labels(pairs: PairTokenizers, ids: list[int], side: str) -> list[str]:
    """Token labels of ``ids``: the pair's special ids by their strings (``</s>``), the rest
    as the side's tokenizer shows them (``<id>`` where it has no entry)."""
    tok = pairs.source if side == "source" else pairs.target
    sp = pairs.source_ids if side == "source" else pairs.target_ids
    names = {sp.pad: pairs.config.pad, sp.bos: pairs.config.bos, sp.eos: pairs.config.eos}

    def label(i: int) -> str:
        if i in names:
            return names[i]
        try:
            return token_label(tok, i)
        except (IndexError, KeyError, ValueError):
            return f"<{i}>"

    return [label(i) for i in ids]
