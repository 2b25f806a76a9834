"""Sentence embeddings as sentence-transformers makes them (Reimers & Gurevych, 2019, as
all-MiniLM-L6-v2 is configured): the last hidden states averaged over non-padding tokens, then
L2-normalised (:func:`sentence_embeddings`, ``attnlm embed``); :func:`cosine_matrix` of the
result.

Shapes: ``N`` sentences, ``C`` model width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.base.foreign import foreign_reader, load_json
from attnlm.inspect.base import require

SENTENCE_MAX_LENGTH = 256  # sentence-transformers' max_seq_length of all-MiniLM-L6-v2


@foreign_reader("sentence_bert_config.json")
def sentence_bert_max_length(cfg: Path) -> int:
    """``max_seq_length`` of a sentence-transformers ``sentence_bert_config.json``."""
    value = load_json(cfg, "sentence_bert_config.json").get("max_seq_length", SENTENCE_MAX_LENGTH)
    if type(value) is not int or value < 1:
        raise InputError(f"{cfg}: max_seq_length must be a positive integer, got {value!r}")
    return value


def sentence_max_length(folder: str | Path | None, model: Any) -> int:
    """The sentence-embedding input limit: ``max_seq_length`` of a sentence-transformers
    ``sentence_bert_config.json`` in ``folder`` when present, else 256 (capped by the
    model's positions)."""
    limit = SENTENCE_MAX_LENGTH
    if folder is not None:
        cfg = Path(folder) / "sentence_bert_config.json"
        if cfg.is_file():  # present but damaged is refused, not silently replaced by 256
            limit = sentence_bert_max_length(cfg)
    block = getattr(getattr(model, "config", None), "block_size", None)
    return min(limit, int(block)) if block else limit


@torch.no_grad()
def sentence_embeddings(
    model: Any,
    tokenizer: Any,
    sentences: list[str],
    max_length: int = SENTENCE_MAX_LENGTH,
    batch_size: int = 32,
) -> Tensor:
    """L2-normalised mean-pooled sentence embeddings ``(N, C)`` (see the module docstring):
    each sentence as ``[CLS] s [SEP]`` cut to ``max_length`` tokens, the mean of the last
    hidden states over its non-padding tokens, divided by its L2 norm."""
    require(model, "embed", "embed")
    if not sentences:
        raise InputError("give at least one sentence")
    if not hasattr(tokenizer, "encode_batch_for_model") or not hasattr(model, "encode"):
        raise InputError("embed needs an encoder with a BERT-style tokenizer")
    device = model_device(model)
    rows = []
    with eval_mode(model):
        for i in range(0, len(sentences), batch_size):
            enc = tokenizer.encode_batch_for_model(sentences[i : i + batch_size], None, max_length)
            ids, mask, types = (
                torch.tensor(enc[k], device=device)
                for k in ("input_ids", "attention_mask", "token_type_ids")
            )
            last, _, _ = model.encode(ids, mask, types)  # (B, T, C)
            m = mask.unsqueeze(-1).to(last.dtype)  # (B, T, 1)
            mean = (last * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, C)
            rows.append(nn.functional.normalize(mean.float(), p=2, dim=1, eps=1e-12))
    return torch.cat(rows)


def cosine_matrix(x: Tensor) -> Tensor:
    """Cosine similarity ``(N, N)`` between the rows of ``x`` ``(N, C)``."""
    x = nn.functional.normalize(x.float(), p=2, dim=-1, eps=1e-12)
    return x @ x.T
