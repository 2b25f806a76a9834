"""The batch protocol every training objective serves (:mod:`attnlm.loading.objectives`):
``Batch`` (a dict of tensors, targets under ``targets``), :class:`BatchSource` (one split
under one objective: ``draw``, ``collate``, ``sequential``) and :func:`count_targets`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from attnlm.models.base import IGNORE_INDEX

Batch = dict[str, Tensor]


class BatchSource:
    """One split under one objective (see the module docstring)."""

    chars_per_target: float | None = None

    def draw(self, n: int, generator: torch.Generator) -> Batch:  # pragma: no cover - protocol
        raise NotImplementedError

    def collate(self, draw: Batch) -> Batch:  # pragma: no cover - protocol
        raise NotImplementedError

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """``collate(draw(n, generator))``: a random batch of ``n`` examples."""
        return self.collate(self.draw(n, generator))

    def sequential(self, batch_size: int) -> Iterator[Batch]:  # pragma: no cover - protocol
        raise NotImplementedError

    def tokens_per_example(self) -> int:
        """Input tokens per example (for tokens/s); the window for windowed objectives."""
        return 1

    def state_dict(self) -> dict[str, Any] | None:
        """What a source that keeps a position between draws (e.g. :class:`StreamBatches`)
        needs to continue exactly after a resume; None for stateless sources. The trainer
        stores it in the checkpoint's ``state.pt``."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def count_targets(batch: Batch) -> int:
    """Number of predicted targets in a batch (those not equal to ``IGNORE_INDEX``)."""
    return int((batch["targets"] != IGNORE_INDEX).sum())
