"""The packed teacher-forced loss of the encoder-decoder
:class:`~attnlm.models.transformer.Transformer`: a training fast path beside the model, so the
model's own forward stays the lecture's (encode, decode, loss on the padded batch).

Every per-token layer (embedding, projections, feed-forward, norms, dropout, head) runs on the
real tokens only (:class:`~attnlm.nn.packing.Packing`): the source tokens the source mask keeps,
and the target positions up to each row's last counted target (later positions feed no counted
one under the causal mask). Attention runs on the padded layout. Equal to the padded forward's
loss (tested); the data-dependent number of kept tokens makes it an eager-mode path.

Shape legend
    B  batch size
    S  source length
    T  target length
    N  kept tokens (N_src, N_tgt), or counted targets
    C  model width
    V  target vocabulary size
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlm.models.base import IGNORE_INDEX, ModelOutput, check_ids, check_targets, token_loss
from attnlm.nn.masks import padding_mask
from attnlm.nn.packing import Packing


def packing_applies(targets: Tensor | None, wants_more: bool) -> bool:
    """Whether a forward takes the packed path: a loss is asked for, nothing per position
    besides it (``wants_more``: attention weights or hidden states), and no ``torch.compile``
    (whose graphs need static shapes)."""
    return targets is not None and not wants_more and not torch.compiler.is_compiling()


def packed_loss(
    model: Any, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None, targets: Tensor
) -> ModelOutput:
    """The teacher-forced loss of ``model`` (a :class:`~attnlm.models.transformer.Transformer`)
    on ``src`` ``(B, S)``, ``tgt_in`` and ``targets`` ``(B, T)``, with logits ``(N, V)`` of the
    counted targets in row-major order."""
    src_mask = model._source_mask(src, src_mask)
    check_ids(tgt_in, model.config.vocab_size, "tgt_in")
    check_targets(targets, tgt_in)
    counted = targets != IGNORE_INDEX  # (B, T)
    enc = Packing(src_mask)
    dec = Packing(counted.flip(1).cumsum(1).flip(1) > 0)  # up to the last counted target
    x = model._embed(model.src_emb, src, packing=enc)  # (N_src, C)
    mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
    for block in model.encoder:
        x = block(x, mask=mask, packing=enc)[0]
    memory = model.enc_ln(x)
    y = model._embed(model.tgt_emb, tgt_in, packing=dec)  # (N_tgt, C)
    for block in model.decoder:
        y = block(
            y,
            is_causal=True,
            context=memory,
            context_mask=mask,
            packing=dec,
            context_packing=enc,
        )[0]
    y = y[dec.take(counted)]  # (N, C): the counted targets among the kept positions
    logits = model.lm_head(model.dec_ln(y))  # (N, V)
    if model.logits_bias is not None:
        logits = logits + model.logits_bias
    loss, loss_sum, n_targets = token_loss(logits, targets[counted], model.config.label_smoothing)
    return ModelOutput(logits=logits, loss=loss, loss_sum=loss_sum, n_targets=n_targets)
