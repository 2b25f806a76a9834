"""Inspection of the encoder-decoder :class:`~attnlm.models.transformer.Transformer`: the
fields of an :class:`~attnlm.models.base.InspectionRecord` for one translation (decoder
self-attention, cross-attention over the source, encoder attention, hidden states), with the
source and target tokens labelled, as ``model.inspect`` returns them.

Shape legend
    H  heads
    T  target tokens (the decoder's input: start token, then the target)
    S  source tokens
    C  model width
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from attnlm.errors import InputError

if TYPE_CHECKING:
    from attnlm.models.transformer import Transformer


@torch.no_grad()
def inspect_translation(
    model: Transformer, tokenizer: Any, text: str, target: str | Sequence[int] | None = None
) -> dict[str, Any]:
    """The fields of the :class:`~attnlm.inspect.record.InspectionRecord` of translating
    ``text`` (``attnlm.inspect.record.inspect`` builds the record; this layer cannot)
    (greedy when ``target`` is None; ``target`` may be a text or target ids without the
    start token, as a decoder produced them, an end token appended when missing).
    ``tokenizer``: a :class:`~attnlm.data.pairs.PairTokenizers` or one tokenizer for both
    sides. The rows (``tokens``) are the tokens the decoder emits at each step (the target
    and the end token), Bahdanau et al.'s alignment view; keys of cross-attention are the
    source tokens. The tensors lose the batch axis: per layer, ``attentions`` ``(H, T, T)``,
    ``cross_attentions`` ``(H, T, S)``, ``encoder_attentions`` ``(H, S, S)``; hidden states
    ``(T, C)`` and ``(S, C)``."""
    from attnlm.data.pairs import PairTokenizers

    c = model.config
    pairs = tokenizer
    if not isinstance(pairs, PairTokenizers):
        pairs = PairTokenizers.from_tokenizers(tokenizer)
    source = pairs.encode_source(text)
    if not pairs.tokens(text, "source"):
        raise InputError("the source text is empty after tokenization")
    was = model.training
    model.eval()
    try:
        if target is None:
            out = model.greedy(source)
        elif isinstance(target, str):
            out = [c.bos_id, *pairs.tokens(target, "target"), c.eos_id]
        else:  # target ids as decoding produced them (no start token)
            out = [c.bos_id, *(int(i) for i in target)]
        if out[-1] != c.eos_id:
            out.append(c.eos_id)
        device = model.lm_head.weight.device
        src = torch.tensor([source], device=device)
        tgt_in = torch.tensor([out[:-1]], device=device)
        res = model(src, tgt_in, return_attention=True, return_hidden=True)
    finally:
        model.train(was)

    def labels(ids: list[int], side: str) -> list[str]:
        tok = pairs.source if side == "source" else pairs.target
        sp = pairs.source_ids if side == "source" else pairs.target_ids
        names = {sp.pad: pairs.config.pad, sp.bos: pairs.config.bos, sp.eos: pairs.config.eos}
        from attnlm.tokenizers import token_label

        return [names[i] if i in names else token_label(tok, i) for i in ids]

    first = lambda ts: [t[0].float().cpu() for t in ts]  # noqa: E731 - drop the batch axis
    return dict(
        family="transformer",
        tokens=labels(out[1:], "target"),
        ids=out[1:],
        attentions=first(res.attentions),
        hidden_states=first(res.hidden_states),
        source_tokens=labels(source, "source"),
        source_ids=source,
        cross_attentions=first(res.cross_attentions),
        encoder_attentions=first(res.encoder_attentions),
        encoder_hidden_states=first(res.encoder_hidden_states),
    )
