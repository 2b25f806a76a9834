"""Where a GGUF file's tensors go in our models (:class:`Part`), and llama.cpp's rotary row
order: read by the PyTorch loader (:mod:`.loader`), written by :mod:`.writer`, and read by the
C engine without PyTorch (:mod:`attnlm.runtime.engine_gguf`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

from attnlm.base.errors import InputError

Rows = TypeVar("Rows")  # a numpy array or a torch tensor: both reshape and swap axes alike


@dataclass(frozen=True)
class Part:
    """File tensor ``gguf`` -> our parameter ``ours`` (``""``: a tensor the architecture module
    has checked and that loads nothing, e.g. a stored copy of a tied matrix); ``rows``: the
    ``(start, stop)`` rows of ``ours`` it fills (fused q/k/v or gate/up), else all of it;
    ``heads``: undo llama.cpp's rotary row interleaving with this many heads (0: as stored);
    ``shape``: the file tensor's shape (numpy order) the config implies, checked by
    :func:`check_parts` before any byte is read (None: checked against the parameter);
    ``expert``: the part is matrix ``expert`` of a 3-D tensor of stacked experts'
    matrices (``blk.N.ffn_gate_exps``: ``(E, F, C)``), else None."""

    gguf: str
    ours: str
    rows: tuple[int, int] | None = None
    heads: int = 0
    shape: tuple[int, ...] | None = None
    expert: int | None = None


def part_bytes(raw: Any, info: Any, part: Part) -> tuple[Any, tuple[int, ...]]:
    """``(bytes, shape)`` of what ``part`` reads of the tensor ``info`` whose bytes are
    ``raw``: all of it, or one expert's matrix of a stacked 3-D tensor (its bytes are
    contiguous: whole blocks per row)."""
    if part.expert is None:
        return raw, tuple(info.shape)
    n_expert, *shape = info.shape
    return raw.reshape(n_expert, -1)[part.expert], tuple(shape)


_BLOCK = re.compile(r"blk\.(\d{1,9})\.")


def blocks_in(header: Any) -> int:
    """How many blocks the file's tensors hold: one more than the largest ``N`` of a
    ``blk.N.`` tensor name (0 without any)."""
    found = [int(m.group(1)) for name in header.tensors if (m := _BLOCK.match(name))]
    return max(found) + 1 if found else 0


def check_block_count(header: Any, key: str, n_layer: int) -> None:
    """``key`` (``<arch>.block_count``, ``n_layer``) must be the number of blocks the tensors
    hold: the config never sizes more layers than the file has bytes for."""
    have = blocks_in(header)
    if n_layer != have:
        raise InputError(
            f"{header.path}: {key} = {n_layer:,} but the file's tensors hold {have} block(s)"
        )


def check_parts(header: Any, parts: list[Part]) -> None:
    """Before a byte of a tensor is read: every tensor of ``parts`` is in the file, with the
    shape the config implies where the part names one, and the file has no other tensor;
    else InputError naming the first that is not."""
    where, used = header.path, set()
    for part in parts:
        info = header.tensors.get(part.gguf)
        if info is None:
            raise InputError(f"{where}: tensor {part.gguf!r} is missing")
        if part.shape is not None and tuple(info.shape) != tuple(part.shape):
            raise InputError(
                f"{where}: tensor {part.gguf!r} has shape {list(info.shape)}, expected "
                f"{list(part.shape)} from the metadata"
            )
        used.add(part.gguf)
    unused = [n for n in header.tensors if n not in used]
    if unused:
        raise InputError(
            f"{where}: tensor {unused[0]!r} is not part of a {header.get('general.architecture')} "
            f"model attnlm can build ({len(unused)} unused tensor(s))"
        )


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
