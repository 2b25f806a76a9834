"""The word2vec settings, named and defaulted as gensim's ``Word2Vec``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlm.base.errors import ConfigError
from attnlm.base.validate import docs_budget, fraction, positive


@dataclass(frozen=True)
class Word2VecConfig:
    """Settings, named and defaulted as gensim's ``Word2Vec`` (``sg=True`` is skip-gram)."""

    dim: int = 100
    window: int = 5
    negative: int = 5
    min_count: int = 5
    epochs: int = 5
    sg: bool = True
    sample: float = 1e-3
    alpha: float = 0.025
    min_alpha: float = 0.0001
    seed: int = 1
    workers: int = 1
    batch: int = 4096  # centre words per batched step
    noise_share: int = 8  # CBOW: centre words of a batch that share their noise words

    def __post_init__(self) -> None:
        counts = ("dim", "window", "negative", "min_count", "epochs", "workers", "batch")
        positive(self, *counts, "noise_share", where="word2vec")
        if docs_budget() is not None:  # the doc tests: one pass whatever --epochs says
            object.__setattr__(self, "epochs", 1)
        fraction(self, "sample", where="word2vec")
        if not (0 <= self.min_alpha <= self.alpha) or not math.isfinite(self.alpha):
            raise ConfigError(
                f"word2vec needs 0 <= min_alpha <= alpha, got {self.min_alpha} and {self.alpha}"
            )
