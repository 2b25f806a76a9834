"""Masked-token predictions: the top-k tokens (softmax probabilities) at every ``[MASK]`` of a
text, for masked-LM families such as BERT (``attnlm fill-mask``, the explorer's fill-mask box)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.inspect.base import require
from attnlm.inspect.record import model_input
from attnlm.tokenizers import token_label


@dataclass
class MaskPrediction:
    """The top-k predictions at one ``[MASK]``: ``index`` (position in the model input,
    ``[CLS]`` = 0), ``tokens``, ``ids``, ``probs`` (softmax over the vocabulary)."""

    index: int
    tokens: list[str]
    ids: list[int]
    probs: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "predictions": [
                {"token": t, "id": i, "prob": round(p, 6)}
                for t, i, p in zip(self.tokens, self.ids, self.probs)
            ],
        }


@torch.no_grad()
def fill_mask(model: Any, tokenizer: Any, text: str, top_k: int = 5) -> list[MaskPrediction]:
    """Top-``top_k`` tokens for every ``[MASK]`` in ``text`` (as ``transformers``'
    fill-mask pipeline: softmax of the MLM logits at the mask positions)."""
    require(model, "fill-mask", "fill-mask")
    if getattr(model, "head", True) is None:
        raise InputError(
            "this model has no masked-LM head (a Hugging Face BertModel folder such as "
            "minilm): fill-mask needs a BertForMaskedLM folder or an attnlm bert checkpoint"
        )
    mask_id = getattr(tokenizer, "mask_id", None)
    if mask_id is None:
        raise InputError("the tokenizer has no [MASK] token")
    if top_k < 1:
        raise InputError(f"--top-k must be at least 1, got {top_k}")
    ids, extra = model_input(model, tokenizer, text)
    where = [i for i, t in enumerate(ids) if t == mask_id]
    block = getattr(getattr(model, "config", None), "block_size", None)
    cut = bool(block) and len(ids) >= int(block)  # model_input cut the text to the window
    if not where:
        if cut and "[MASK]" in text:
            raise InputError(
                f"every [MASK] falls beyond the model's window of {len(ids)} tokens: "
                "shorten the text before it"
            )
        raise InputError("the text has no [MASK] token (write [MASK] where a word is missing)")
    if cut and len(where) < text.count("[MASK]"):  # never drop the cut-off ones silently
        raise InputError(
            f"{text.count('[MASK]') - len(where)} of the {text.count('[MASK]')} [MASK] tokens "
            f"fall beyond the model's window of {len(ids)} tokens: shorten the text"
        )
    device = model_device(model)
    x = torch.tensor([ids], device=device)
    extra_t = {k: torch.tensor([v], device=device) for k, v in extra.items()}
    with eval_mode(model):
        logits = model(ids=x, **extra_t).logits[0]  # (T, V)
    probs = torch.softmax(logits[where].float(), dim=-1)  # (M, V)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    out = []
    for k, pos in enumerate(where):
        top_ids = top.indices[k].tolist()
        out.append(
            MaskPrediction(
                index=pos,
                tokens=[token_label(tokenizer, i) for i in top_ids],
                ids=top_ids,
                probs=top.values[k].tolist(),
            )
        )
    return out


def filled_text(tokenizer: Any, text: str, predictions: list[MaskPrediction]) -> str:
    """``text`` with each ``[MASK]`` replaced by its top prediction."""
    parts = text.split("[MASK]")
    out = [parts[0]]
    for pred, rest in zip(predictions, parts[1:]):
        out += [pred.tokens[0].removeprefix("##"), rest]
    return "".join(out)
