"""Speculative decoding with a quantized copy of the model as the draft model.

A one-token decoding step on a CPU reads every weight once, so a float32 model decodes at the
speed its weights stream from memory. A copy of the same model with 4-bit weights streams a
sixth of the bytes and agrees with it on almost every greedy token. Speculative decoding
(Leviathan et al., 2023; Chen et al., 2023) lets the cheap copy guess the next ``k`` tokens one
at a time, then the float32 model checks all of them in one forward pass (a small matrix
product reads its weights once for all the guesses) and keeps the guesses while they equal its
own argmax. The output is the float32 model's greedy output, token for token (tested); only
the number of float32 passes falls. Because the guesses come from the model itself, this is
self-speculative decoding: no second checkpoint is needed.

:class:`ModelDrafter` is a ``propose(seq, k)`` for :func:`attnlm.generate.lookahead.
lookahead_loop` (which does the checking): the draft model keeps its own KV cache of the ids
it has seen and, each call, cuts it back to the common prefix with ``seq`` (the rejected
guesses) before feeding the rest. :func:`draft_model` builds the quantized copy; it shares
every float32 tensor the quantization leaves alone (norms), so it costs only its packed weights.

Used by :func:`attnlm.generate.decode` (``draft=``), :class:`attnlm.generate.chat.ChatSession`
(``draft=``) and ``attnlm generate|chat --draft q4|q8``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnlm.base.errors import InputError

if TYPE_CHECKING:
    from torch import nn

DRAFT_FORMATS = ("q8", "q4")


def draft_model(model: nn.Module, fmt: str = "q4") -> nn.Module:
    """A copy of ``model`` (a gpt or llama decoder with float32 weights) whose linear layers and
    embedding hold ``fmt`` weights (:func:`attnlm.quant.layers.quantize_weights`), for drafting.
    ``model`` is not changed; the copy shares its other tensors."""
    from attnlm.quant.layers import quantize_weights, weights_format

    if fmt not in DRAFT_FORMATS:
        raise InputError(f"a draft model is q8 or q4, not {fmt!r}")
    from attnlm.models.registry import decoding_of

    if not decoding_of(model).drafts:
        raise InputError(
            f"drafts need a decoder with a KV cache (gpt, llama), not {type(model).__name__}"
        )
    if weights_format(model) != "f32":
        raise InputError(
            f"a {fmt} draft speeds up float32 weights; this model decodes with "
            f"{weights_format(model)} weights (give --weights f32)"
        )
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return quantize_weights(copy.deepcopy(model, shared), fmt)


class ModelDrafter:
    """``propose(seq, k)``: ``k`` guesses of the tokens after ``seq``. Where the context holds
    ``k`` tokens to copy (:func:`~attnlm.generate.lookahead.lookup_draft`: text that repeats
    itself), those, at no cost; otherwise ``draft``'s greedy continuation: its cache cut back to
    what it holds of ``seq``, the shorter copy checked in one pass of the draft model and kept
    while it equals the draft's argmax, then one cached step per token."""

    def __init__(self, draft: nn.Module) -> None:
        from attnlm.runtime.planner import runner_for

        self.model = draft
        self.runner = runner_for(draft)  # the draft's own backend (the C step on the CPU)
        self.cache = self.runner.new_state()
        self.seen: list[int] = []  # the ids whose keys and values the cache holds

    def __call__(self, seq: Sequence[int], k: int) -> list[int]:
        import torch

        from attnlm.generate.lookahead import common_prefix, lookup_draft

        guess = lookup_draft(seq, k)
        if len(guess) == k or k <= 0:
            return guess
        keep = min(common_prefix(self.seen, seq), len(seq) - 1)  # feed one id at least
        self._cut(keep)
        with torch.inference_mode():
            preds = self._feed([*seq[keep:], *guess], len(guess) + 1)  # after seq, guess[j]
            taken = common_prefix(guess, preds)
            self._cut(len(seq) + taken)  # the rejected part of the copy
            out = [*guess[:taken], preds[taken]]
            while len(out) < k:
                out += self._feed(out[-1:], 1)
        return out

    def _cut(self, keep: int) -> None:
        """Keep the draft model's first ``keep`` positions."""
        from attnlm.generate.lookahead import drop_newest

        drop_newest(self.cache, len(self.seen) - keep)
        self.seen = self.seen[:keep]

    def _feed(self, ids: list[int], last: int) -> list[int]:
        """Feed ``ids``; the draft model's argmax after each of the ``last`` newest."""
        import torch

        from attnlm.base.device import model_device

        x = torch.tensor([ids], device=model_device(self.model))
        logits = self.runner.step(x, self.cache, last_only=last == 1)[0, -last:]  # (last, V)
        self.seen += ids
        return torch.argmax(logits, dim=-1).tolist()
