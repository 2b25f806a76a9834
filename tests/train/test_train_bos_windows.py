"""Text windows of a fine-tune start with the BOS of a tokenizer that puts one before a text
(Gemma's GGUF vocabulary: ``add_bos_token``), as ``attnlm eval`` and llama.cpp's perplexity
read such a model; a tokenizer that puts none (Qwen's) keeps plain windows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from attnlm.base.ggufio import GGUFFile
from attnlm.loading.objectives import make_objective
from attnlm.tokenizers.gguf import GGUFTokenizer
from attnlm.train.run import _sources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"


class _Split:
    def __init__(self, ids: np.ndarray) -> None:
        self.ids, self.chars_per_token = ids, 3.0

    def open(self) -> np.ndarray:
        return self.ids


def _batch(arch: str, block: int = 8):
    tok = GGUFTokenizer.from_gguf(GGUFFile(FIXTURES / f"{arch}-Q8_0.gguf"))
    ids = np.asarray(tok.encode("the quick brown fox jumps over the lazy dog " * 20), np.int64)
    data = SimpleNamespace(tokenizer=tok, train=_Split(ids), val=_Split(ids[::-1].copy()))
    objective = make_objective("causal", tok, SimpleNamespace(block_size=block))
    train, val = _sources(objective, data, "text", block)
    batch = train.collate(train.draw(16, torch.Generator().manual_seed(0)))
    return tok, ids, batch, val


def test_windows_of_a_bos_tokenizer_start_with_it():
    tok, ids, batch, val = _batch("gemma3")
    assert tok.add_bos and tok.bos_id is not None
    x, y = batch["ids"], batch["targets"]
    assert x.shape == (16, 8) and bool((x[:, 0] == tok.bos_id).all())
    assert bool((x[:, 1:] == y[:, :-1]).all())  # then the text, each token predicted once
    assert not bool((ids == tok.bos_id).any())  # (the BOS is not in the text itself)
    first = next(val.sequential(4))
    assert bool((first["ids"][:, 0] == tok.bos_id).all())


def test_windows_of_a_tokenizer_without_bos_are_plain():
    tok, ids, batch, _ = _batch("qwen2")
    assert not tok.add_bos
    x = batch["ids"].numpy()
    text = ids.tolist()
    for row in x:  # every window is a slice of the text
        assert any(text[i : i + 8] == row.tolist() for i in range(len(text)))
