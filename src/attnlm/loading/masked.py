"""The masked-LM objective (Devlin et al., 2019; :mod:`attnlm.loading.objectives`): 15% of
the tokens chosen, 80% ``[MASK]``, 10% a random token, 10% unchanged; optionally whole words."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlm.base.errors import ConfigError
from attnlm.data.windows import Windows
from attnlm.loading.batches import Batch, BatchSource
from attnlm.models.base import IGNORE_INDEX


@dataclass(frozen=True)
class MaskingConfig:
    """BERT's masking: choose ``rate`` of the maskable tokens; of those, ``mask_frac`` become
    ``[MASK]``, ``random_frac`` a random token, the rest stay unchanged. ``whole_word``: a word
    split into pieces (continuations start with ``##``) is chosen or left as a whole."""

    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...] = ()
    rate: float = 0.15
    mask_frac: float = 0.8
    random_frac: float = 0.1
    whole_word: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.rate < 1:
            raise ConfigError(f"masking rate must be in (0, 1), got {self.rate}")
        if self.mask_frac < 0 or self.random_frac < 0 or self.mask_frac + self.random_frac > 1:
            raise ConfigError("mask_frac and random_frac must be >= 0 and sum to at most 1")
        if not 0 <= self.mask_id < self.vocab_size:
            raise ConfigError(f"mask id {self.mask_id} is outside the vocabulary")


def mask_tokens(
    ids: Tensor, noise: Tensor, cfg: MaskingConfig, word_start: Tensor | None = None
) -> Batch:
    """Apply BERT masking to ``ids`` ``(B, T)`` using uniform ``noise`` ``(3, B, T)`` (one
    plane to choose, one to pick the replacement kind, one for the random token).

    Returns ``{"ids": corrupted, "targets": original at chosen positions else -100}``. With
    ``word_start`` ``(B, T)`` bool (whole-word masking) a position copies the choice of the
    piece that starts its word. Special ids are never chosen.
    """
    choose_u, kind_u, token_u = noise[0], noise[1], noise[2]
    if word_start is not None:
        # index of the word start at or before each position; take that position's draw
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        start_idx = torch.where(word_start, pos, torch.zeros_like(pos)).cummax(dim=1).values
        choose_u = choose_u.gather(1, start_idx)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    for s in cfg.special_ids:
        maskable &= ids != s
    chosen = (choose_u < cfg.rate) & maskable
    targets = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    to_mask = chosen & (kind_u < cfg.mask_frac)
    to_random = chosen & (kind_u >= cfg.mask_frac) & (kind_u < cfg.mask_frac + cfg.random_frac)
    random_ids = (token_u * cfg.vocab_size).long().clamp(max=cfg.vocab_size - 1)
    out = torch.where(to_mask, torch.full_like(ids, cfg.mask_id), ids)
    out = torch.where(to_random, random_ids, out)
    return {"ids": out, "targets": targets}


class MaskedWindows(BatchSource):
    """Windows of a token array with BERT masking; ``sequential`` uses fixed noise."""

    def __init__(
        self,
        ids: np.ndarray,
        block_size: int,
        cfg: MaskingConfig,
        word_start_ids: np.ndarray | None = None,
        eval_seed: int = 0,
    ) -> None:
        # windows of block_size + 1 ids give block_size inputs (the last id is unused)
        self.windows = Windows(ids, block_size)
        self.cfg = cfg
        self.word_start = word_start_ids  # (V,) bool: id begins a word (whole-word masking)
        self.eval_seed = eval_seed

    def _word_start(self, x: Tensor) -> Tensor | None:
        if not self.cfg.whole_word or self.word_start is None:
            return None
        return torch.from_numpy(self.word_start)[x]

    def draw(self, n: int, generator: torch.Generator) -> Batch:
        starts = self.windows.sample_starts(n, generator)
        noise = torch.rand(n, 3, self.windows.block_size, generator=generator)
        return {"starts": starts, "noise": noise}

    def collate(self, draw: Batch) -> Batch:
        x, _ = self.windows.batch(draw["starts"])
        return mask_tokens(x, draw["noise"].transpose(0, 1), self.cfg, self._word_start(x))

    def sequential(self, batch_size: int) -> Iterator[Batch]:
        gen = torch.Generator().manual_seed(self.eval_seed)
        for x, _ in self.windows.sequential(batch_size):
            noise = torch.rand(3, *x.shape, generator=gen)
            yield mask_tokens(x, noise, self.cfg, self._word_start(x))

    def tokens_per_example(self) -> int:
        return self.windows.block_size


def word_start_table(tokenizer: Any) -> np.ndarray:
    """``(V,)`` bool: whether each token id begins a word, i.e. is not a WordPiece
    continuation (``##ing``; the tokenizer's ``continuing_prefix``). Whole-word masking
    needs a tokenizer that marks continuations."""
    prefix = getattr(tokenizer, "continuing_prefix", None)
    if not prefix or not hasattr(tokenizer, "token_text"):
        raise ConfigError(
            "whole-word masking needs a tokenizer that marks word continuations (wordpiece)"
        )
    pieces = [tokenizer.token_text(i) for i in range(tokenizer.vocab_size)]
    return np.array([not p.startswith(prefix) for p in pieces], dtype=bool)


class MaskedLM:
    """Masked-token prediction (BERT). Needs a tokenizer with a mask id (``mask_id``) or an
    explicit :class:`MaskingConfig`."""

    name = "masked"
    data = "text"

    def __init__(
        self, tokenizer: Any = None, model_config: Any = None, masking: MaskingConfig | None = None
    ) -> None:
        self.block_size = int(getattr(model_config, "block_size", 0) or 0)
        if masking is None:
            mask_id = getattr(tokenizer, "mask_id", None)
            if mask_id is None:
                raise ConfigError(
                    "the masked-LM objective needs a tokenizer with a [MASK] token (e.g. wordpiece)"
                )
            specials = tuple(
                i
                for i in (getattr(tokenizer, f"{n}_id", None) for n in ("pad", "cls", "sep"))
                if i is not None
            ) + (mask_id,)
            vocab = int(getattr(model_config, "vocab_size", 0) or tokenizer.vocab_size)
            whole = bool(getattr(model_config, "whole_word_masking", False))
            masking = MaskingConfig(mask_id, vocab, specials, whole_word=whole)
        self.masking = masking
        self.tokenizer = tokenizer

    def source(
        self, ids: np.ndarray, chars_per_token: float | None = None, block_size: int | None = None
    ) -> MaskedWindows:
        block = block_size or self.block_size
        if block < 1:
            raise ConfigError("the masked objective needs model.block_size (window length)")
        word_start = None
        if self.masking.whole_word and self.tokenizer is not None:
            word_start = word_start_table(self.tokenizer)
        return MaskedWindows(ids, block, self.masking, word_start)
