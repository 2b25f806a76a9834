"""Where a GGUF file's tensors go in our models (:class:`Part`), and llama.cpp's rotary row
order: read by the PyTorch loader (:mod:`.loader`), written by :mod:`.writer`, and read by the
C engine without PyTorch (:mod:`attnlm.runtime.engine_gguf`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

Rows = TypeVar("Rows")  # a numpy array or a torch tensor: both reshape and swap axes alike


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


def unpermute_rows(rows: Rows, heads: int) -> Rows:
    """q or k rows ``(heads · D, C)`` (a numpy array or a torch tensor: codes, scales or floats)
    from llama.cpp's order into the rotate-half order of
    :class:`~attnlm.nn.positional.RotaryEmbedding`, in a contiguous array.

    Hugging Face's Llama rotates feature ``i`` with ``i + D/2`` of each head; llama.cpp rotates
    adjacent pairs ``(2i, 2i + 1)`` (Meta's original layout), so its converter stores head
    ``h``'s row ``half · D/2 + i`` at ``2i + half``: ours ``[h, half, i]`` = the file's
    ``[h, i, half]``."""
    n, width = rows.shape
    d = n // heads
    return rows.reshape(heads, d // 2, 2, width).swapaxes(1, 2).reshape(n, width)


def permute_rows(rows: Rows, heads: int) -> Rows:
    """The inverse of :func:`unpermute_rows`: our rotate-half order -> llama.cpp's interleaved
    one (file row ``(h, i, half)`` = our row ``(h, half, i)``), for writing a file."""
    n, width = rows.shape
    d = n // heads
    return rows.reshape(heads, 2, d // 2, width).swapaxes(1, 2).reshape(n, width)
