"""Where a GGUF file's tensors go in our models (:class:`Part`): read by the PyTorch loader
(:mod:`.loader`) and by the engine without PyTorch (:mod:`.engine`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """File tensor ``gguf`` -> our parameter ``ours`` (``""``: a tensor the architecture module
    has checked and that loads nothing, e.g. a stored copy of a tied matrix); ``rows``: the
    ``(start, stop)`` rows of ``ours`` it fills (fused q/k/v or gate/up), else all of it;
    ``heads``: undo llama.cpp's rotary row interleaving with this many heads (0: as stored)."""

    gguf: str
    ours: str
    rows: tuple[int, int] | None = None
    heads: int = 0
