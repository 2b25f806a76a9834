"""Loading a Hugging Face folder's safetensors weights straight into a built model.

``transformers`` and a plain ``load_state_dict`` hold the model's own tensors and a second
copy read from the file (and, for renamed or transposed weights, a third): a 124M-parameter
model peaks at two to three times its 475 MiB. Here each tensor's bytes are read from the file
into the parameter that holds them (``readinto`` its memory; rows of a fused ``qkv`` weight in
place), so the peak is the model itself plus the largest transposed or converted tensor. The
file is read, not mapped, so its pages stay in the page cache rather than in the process.

The safetensors format (``safetensors`` documents it): an 8-byte little-endian header length
``N``, a JSON header of ``N`` bytes mapping each name to ``{"dtype", "shape", "data_offsets":
[begin, end]}`` (offsets into the data that follows the header; ``"__metadata__"`` holds
strings), then the data. ``safetensors.safe_open`` checks every header first (offsets within
the file and contiguous, sizes equal to shape x dtype); :func:`index` checks the same numbers
again before any byte is read into memory.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlm.base.errors import InputError
from attnlm.base.foreign import check_finite, foreign_reader
from attnlm.models.hf.mapping import (
    Layout,
    check_weight_shape,
    copy_differs,
    place,
    refuse_missing,
)

#: safetensors dtype names -> torch dtypes (those a model's weights can have)
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
MAX_HEADER = 100 * 2**20  # bytes of JSON header (the library's own limit)


@dataclass(frozen=True)
class Stored:
    """One tensor of a safetensors file: its dtype, shape and byte range in the file."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


@foreign_reader("safetensors")
def index(file: Path) -> dict[str, Stored]:
    """Every tensor of ``file`` by name, its header checked by ``safetensors`` and here (a
    damaged or lying header is one InputError line naming the file)."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt"):  # the library's checks of the whole header
        pass
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
        if not 0 < n <= min(MAX_HEADER, size - 8):
            raise InputError(f"{file}: not a safetensors file (header length {n})")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise InputError(f"{file}: the safetensors header is not a JSON object")
    start, out = 8 + n, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(entry.get("dtype")) if isinstance(entry, dict) else None
        shape, offsets = (entry.get("shape"), entry.get("data_offsets")) if dtype else (0, 0)
        ok = (
            dtype is not None
            and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
            and isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= size - start
        )  # fmt: skip
        if not ok or offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
            raise InputError(f"{file}: tensor {name!r} has a bad dtype, shape or byte range")
        out[name] = Stored(file, dtype, tuple(shape), start + offsets[0], start + offsets[1])
    return out


def _read(stored: Stored, dest: Tensor) -> None:
    """The stored bytes into ``dest`` (contiguous, the stored dtype and size)."""
    view = dest.view(-1).view(torch.uint8).numpy()  # dest's own memory, writable
    with open(stored.file, "rb") as f:
        f.seek(stored.begin)
        if f.readinto(memoryview(view)) != stored.end - stored.begin:
            raise InputError(f"{stored.file}: the file ends inside a tensor")


def _read_new(stored: Stored) -> Tensor:
    out = torch.empty(stored.shape, dtype=stored.dtype)
    _read(stored, out)
    return out


def stream_weights(
    model: nn.Module, path: Path, layout: Layout, tensors: dict[str, Stored]
) -> nn.Module:
    """Read the folder ``path``'s safetensors ``tensors`` (:func:`index` of each file, by
    name) into ``model``'s tensors through ``layout`` (the checks and messages of
    :func:`~attnlm.models.hf.folder.load_mapped_state`); the model in eval mode."""
    stored = {layout.canonical(name): entry for name, entry in tensors.items()}
    targets = model.state_dict(keep_vars=True)
    filled: set[str] = set()
    with torch.no_grad():
        for p in place(layout, list(stored)):
            parts = [stored[key] for key in p.parts]
            if p.rule.copy:
                if not torch.equal(_read_new(parts[0]), targets[p.ours]):
                    raise copy_differs(layout, p)
                continue
            check_weight_shape(path, p.ours, _shape(p, parts), targets)
            dest = targets[p.ours].detach()
            _fill(p, parts, dest)
            if p.rule.offset:
                dest.add_(p.rule.offset)  # Gemma's norms: ours hold 1 + w
            check_finite({p.ours: dest}, path)
            filled.add(p.ours)
    refuse_missing(path, [k for k in targets if k not in filled], layout.optional)
    from attnlm.base.device import release_free_memory

    release_free_memory()  # the transposed temporaries' pages, which the C heap would keep
    return model.eval()


def _shape(p, parts: list[Stored]) -> tuple[int, ...]:
    """Our tensor's shape once the parts are joined, transposed or flattened."""
    shape = parts[0].shape
    if len(parts) > 1:
        if any(len(s.shape) != len(shape) or s.shape[1:] != shape[1:] for s in parts):
            return tuple(s.shape for s in parts)  # parts that do not join: a shape mismatch
        shape = (sum(s.shape[0] for s in parts), *shape[1:])
    if p.rule.transpose and len(shape) == 2:
        shape = shape[::-1]
    return (math.prod(shape),) if p.rule.row else tuple(shape)


def _fill(p, parts: list[Stored], dest: Tensor) -> None:
    """The parts' bytes into ``dest``: each part read in place (into its rows of a fused
    tensor) when its dtype and layout are ``dest``'s, else through a temporary (converted,
    joined and transposed as the rule says)."""
    if not p.rule.transpose and dest.is_contiguous() and dest.dim() > 0:
        row = 0
        for part in parts:
            rows = part.shape[0] if len(parts) > 1 else dest.shape[0]
            target = dest[row : row + rows]
            if part.dtype == dest.dtype and math.prod(part.shape) == target.numel():
                _read(part, target)
            else:
                target.copy_(_read_new(part).reshape(target.shape))
            row += rows
        return
    values = [_read_new(part) for part in parts]
    value = values[0] if len(values) == 1 else torch.cat(values, dim=0)
    if p.rule.transpose and value.dim() == 2:
        value = value.t()
    dest.copy_(value.reshape(dest.shape))
