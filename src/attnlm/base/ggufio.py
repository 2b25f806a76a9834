"""GGUF files (llama.cpp's model format): the header, the metadata and the tensor table, read
with one pass over the header, and each tensor's bytes read on demand.

The layout (GGUF version 2 and 3, little-endian; ``gguf``'s ``GGUFReader`` is the reference
reader and the tests compare every field and tensor with it)::

    "GGUF"  uint32 version  uint64 tensor_count  uint64 kv_count
    kv_count x   (string key, uint32 value type, value)
    tensor_count x (string name, uint32 n_dims, uint64 dims[n_dims], uint32 type, uint64 offset)
    padding to ``general.alignment`` (default 32), then the tensor data; each tensor at
    data start + offset.

A string is ``uint64 length`` + UTF-8 bytes; an array is ``uint32 item type``, ``uint64 count``
and the items. Dims are in ggml order (the first is the fastest-varying), so a tensor's numpy
shape is the dims reversed: a ``(out, in)`` matrix is stored with dims ``[in, out]``.

Why not ``GGUFReader`` itself: it builds a numpy memmap view for every array element, which for
a 49,152-token vocabulary and its merges is about a million views (2 s on a busy core, longer
than reading and dequantizing the whole SmolLM2 model). Here string arrays are sliced from one
memory map with ``struct``, numeric arrays are ``numpy.frombuffer`` views copied once, and
every count and length is checked against the bytes left before anything is allocated, so a
truncated file or an absurd array length is a one-line :class:`~attnlm.base.errors.InputError`.

What a file must be before any tensor is read (the hostile-file corpus,
``tests/base/test_hostile_files.py``, has a case for each): counts, string and array lengths
within the bytes left; known value types, arrays nested at most :data:`MAX_ARRAY_DEPTH` deep;
metadata keys and tensor names unique and UTF-8; 1 to 4 dimensions, each 1..2^40, and a shape
whose elements fit in the bytes after its offset; a ggml type id ggml defines
(:data:`TENSOR_TYPES`), rows a whole number of blocks; offsets aligned, every tensor inside the
file and no two tensors sharing a byte. Sizes are Python integers, so nothing wraps. What the
architecture reads (shapes against the config, block counts) is checked by
:mod:`attnlm.models.gguf` before the PyTorch loader or the C engine reads a tensor.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlm.base.errors import InputError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 4  # arrays of arrays: llama.cpp reads none; gguf-py's reader nests freely

# GGUF value types: id -> (name, struct format or None, size in bytes; strings and arrays vary)
VALUE_TYPES: dict[int, tuple[str, str | None, int]] = {
    0: ("uint8", "<B", 1),
    1: ("int8", "<b", 1),
    2: ("uint16", "<H", 2),
    3: ("int16", "<h", 2),
    4: ("uint32", "<I", 4),
    5: ("int32", "<i", 4),
    6: ("float32", "<f", 4),
    7: ("bool", "<?", 1),
    8: ("string", None, 8),  # at least the uint64 length
    9: ("array", None, 12),  # at least the item type and count
    10: ("uint64", "<Q", 8),
    11: ("int64", "<q", 8),
    12: ("float64", "<d", 8),
}
STRING, ARRAY = 8, 9
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip

# ggml tensor types: id -> (name, elements per block, bytes per block), every type ggml defines
# (ggml.h's ``ggml_type`` and ``ggml_type_traits``; ``gguf.GGML_QUANT_SIZES`` holds the same
# facts, and a test compares them). Ids missing here (4, 5, 31-33, 36-38: types ggml removed;
# anything beyond) are refused when the header is read: no tensor of unknown size is accepted.
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}  # fmt: skip


def type_name(type_id: int) -> str:
    """The ggml name of a tensor type id (``Q4_K``); ``unknown (N)`` for an id ggml lacks."""
    if type_id in TENSOR_TYPES:
        return TENSOR_TYPES[type_id][0]
    return f"unknown ({type_id})"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``shape`` in numpy order (the file's dims reversed),
    ``type`` the ggml type id, ``offset`` its first byte in the file, ``nbytes`` its size
    (every tensor's bytes lie inside the file and overlap no other tensor's)."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)  # Python integers: never wraps


class _Cursor:
    """Little-endian reads from a buffer, each checked against the bytes left."""

    def __init__(self, buf: Any, size: int, where: str) -> None:
        self.buf, self.size, self.pos, self.where = buf, size, 0, where

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise InputError(
                f"{self.where}: truncated or corrupt GGUF file ({what} needs {n:,} bytes at "
                f"byte {self.pos:,}, {self.size - self.pos:,} left)"
            )

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{self.where}: {what} is not valid UTF-8") from None


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    """One metadata value of type ``vtype``: a Python scalar, a ``str``, or for an array a
    numpy array (numbers; ``bool`` arrays as ``bool``) or a list (strings, nested arrays, at
    most :data:`MAX_ARRAY_DEPTH` deep)."""
    if vtype not in VALUE_TYPES:
        raise InputError(f"{cur.where}: metadata key {key!r} has unknown value type {vtype}")
    if vtype == STRING:
        return cur.string(f"metadata key {key!r}")
    if vtype != ARRAY:
        value = cur.unpack(VALUE_TYPES[vtype][1], f"metadata key {key!r}")  # type: ignore[arg-type]
        return bool(value) if vtype == 7 else value
    itype = cur.unpack("<I", f"metadata key {key!r}")
    count = cur.unpack("<Q", f"metadata key {key!r}")
    if itype not in VALUE_TYPES:
        raise InputError(f"{cur.where}: metadata key {key!r} is an array of unknown type {itype}")
    least = VALUE_TYPES[itype][2]  # every item takes at least this many bytes
    if count * least > cur.size - cur.pos:
        raise InputError(
            f"{cur.where}: metadata key {key!r} declares an array of {count:,} items, more "
            f"than the {cur.size - cur.pos:,} bytes left in the file can hold"
        )
    if itype == STRING:
        return _strings(cur, count, key)
    if itype == ARRAY:
        if depth + 1 >= MAX_ARRAY_DEPTH:
            raise InputError(
                f"{cur.where}: metadata key {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep"
            )
        return [_value(cur, ARRAY, f"{key}[{i}]", depth + 1) for i in range(count)]
    arr = np.frombuffer(cur.buf, dtype=_NUMPY[itype], count=count, offset=cur.pos).copy()
    cur.pos += count * least
    return arr.astype(bool) if itype == 7 else arr


def _strings(cur: _Cursor, count: int, key: str) -> list[str]:
    """``count`` strings, sliced straight from the buffer (the hot loop of a vocabulary)."""
    buf, pos, size, out = cur.buf, cur.pos, cur.size, []
    unpack = struct.Struct("<Q").unpack_from
    try:
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                raise struct.error
            out.append(buf[pos : pos + n].decode("utf-8"))
            pos += n
    except struct.error:
        raise InputError(
            f"{cur.where}: truncated or corrupt GGUF file (metadata key {key!r}: string "
            f"{len(out):,} of {count:,} runs past the end)"
        ) from None
    except UnicodeDecodeError:
        raise InputError(
            f"{cur.where}: metadata key {key!r}: string {len(out):,} is not valid UTF-8"
        ) from None
    cur.pos = pos
    return out


class GGUFFile:
    """The header of a GGUF file, parsed on construction (see the module docstring).

    ``metadata``: ``{key: value}`` in file order; ``value_types``: ``{key: GGUF value type id}``
    (for arrays, ``(9, item type)``); ``tensors``: ``{name: TensorInfo}`` in file order;
    ``version``, ``alignment``, ``data_offset``, ``file_size``. Tensor bytes are read by
    :meth:`raw` (a fresh array per call, so nothing of the file stays mapped)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        where = str(self.path)
        try:
            with open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size < 24:
                    raise InputError(f"{where}: not a GGUF file ({self.file_size} bytes)")
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    self._parse(_Cursor(mm, self.file_size, where))
        except OSError as e:
            raise InputError(f"{where}: cannot read the GGUF file ({e.strerror or e})") from None

    def _parse(self, cur: _Cursor) -> None:
        where = cur.where
        magic = bytes(cur.buf[0:4])
        if magic != MAGIC:
            raise InputError(f"{where}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
        cur.pos = 4
        self.version = cur.unpack("<I", "the version")
        if self.version not in VERSIONS:
            raise InputError(
                f"{where}: GGUF version {self.version} is not supported (versions 2 and 3)"
            )
        n_tensors = cur.unpack("<Q", "the tensor count")
        n_kv = cur.unpack("<Q", "the metadata count")
        if n_kv * 13 > cur.size or n_tensors * 24 > cur.size:  # the least each entry takes
            raise InputError(
                f"{where}: corrupt GGUF header ({n_kv:,} metadata entries and {n_tensors:,} "
                f"tensors cannot fit in {cur.size:,} bytes)"
            )
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("a metadata key")
            if key in self.metadata:
                raise InputError(f"{where}: metadata key {key!r} appears twice")
            vtype = cur.unpack("<I", f"metadata key {key!r}")
            start = cur.pos
            self.metadata[key] = _value(cur, vtype, key)
            if vtype == ARRAY:  # (array, item type): the item type is the first uint32
                self.value_types[key] = (ARRAY, struct.unpack_from("<I", cur.buf, start)[0])
            else:
                self.value_types[key] = vtype
        self.alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            not isinstance(self.alignment, int)
            or self.alignment <= 0
            or self.alignment & (self.alignment - 1)
        ):
            raise InputError(f"{where}: general.alignment {self.alignment!r} is not a power of 2")
        infos = []
        for _ in range(n_tensors):
            name = cur.string("a tensor name")
            n_dims = cur.unpack("<I", f"tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise InputError(f"{where}: tensor {name!r} has {n_dims} dimensions (1 to 4)")
            dims = [cur.unpack("<Q", f"tensor {name!r}") for _ in range(n_dims)]
            ttype = cur.unpack("<I", f"tensor {name!r}")
            offset = cur.unpack("<Q", f"tensor {name!r}")
            infos.append((name, tuple(reversed(dims)), ttype, offset))
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, ttype, offset in infos:
            if name in self.tensors:
                raise InputError(f"{where}: tensor {name!r} appears twice")
            self.tensors[name] = self._info(name, shape, ttype, offset)
        self._check_overlaps()

    def _check_overlaps(self) -> None:
        """No two tensors share a byte (llama.cpp's writer lays them out one after another;
        a file whose tensors overlap was made to read one tensor's bytes as another's)."""
        spans = sorted((i.offset, i.offset + i.nbytes, i.name)
                       for i in self.tensors.values())  # fmt: skip
        for (_, end, before), (start, _, name) in zip(spans, spans[1:]):
            if start < end:
                raise InputError(
                    f"{self.path}: tensors {before!r} and {name!r} overlap (byte {start:,} "
                    f"belongs to both)"
                )

    def _info(self, name: str, shape: tuple[int, ...], ttype: int, offset: int) -> TensorInfo:
        where = str(self.path)
        if any(d <= 0 or d > 1 << 40 for d in shape):
            raise InputError(f"{where}: tensor {name!r} has an invalid shape {list(shape)}")
        if ttype not in TENSOR_TYPES:
            raise InputError(
                f"{where}: tensor {name!r} has ggml type id {ttype}, which is no ggml type "
                "(a damaged file, or one newer than this attnlm)"
            )
        _, block, size = TENSOR_TYPES[ttype]
        if shape[-1] % block:
            raise InputError(
                f"{where}: tensor {name!r} ({type_name(ttype)}) has rows of {shape[-1]} "
                f"elements, not a multiple of its block size {block}"
            )
        nbytes = math.prod(shape) // block * size
        if offset % self.alignment:
            raise InputError(f"{where}: tensor {name!r} is not aligned (offset {offset})")
        start = self.data_offset + offset
        # every ggml type takes at least a bit per element, also those this reader cannot size
        if math.prod(shape) > 8 * max(self.file_size - start, 0):
            raise InputError(
                f"{where}: tensor {name!r} of shape {list(shape)} ({math.prod(shape):,} "
                f"elements) cannot fit in the {max(self.file_size - start, 0):,} bytes after "
                f"its offset"
            )
        if start + nbytes > self.file_size:
            raise InputError(
                f"{where}: truncated GGUF file (tensor {name!r} ends at byte {start + nbytes:,}, "
                f"the file has {self.file_size:,})"
            )
        return TensorInfo(name, shape, ttype, start, nbytes)

    # -- reading -------------------------------------------------------------------------------

    def raw(self, name: str | TensorInfo) -> np.ndarray:
        """The bytes of one tensor as a ``uint8`` array, read from the file (a fresh copy)."""
        info = name if isinstance(name, TensorInfo) else self.tensors[name]
        out = np.empty(info.nbytes, dtype=np.uint8)
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            got = f.readinto(memoryview(out))
        if got != info.nbytes:
            raise InputError(f"{self.path}: truncated GGUF file (tensor {info.name!r})")
        return out

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    def __iter__(self) -> Iterator[str]:
        return iter(self.metadata)

    def bytes_per_type(self) -> dict[str, tuple[int, int]]:
        """``{type name: (tensors, bytes)}`` over every tensor (for ``params``-style counts)."""
        out: dict[str, tuple[int, int]] = {}
        for info in self.tensors.values():
            n, b = out.get(info.type_name, (0, 0))
            out[info.type_name] = (n + 1, b + info.nbytes)
        return out


def read_header(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse the header of the GGUF file at ``path`` (:class:`GGUFFile`)."""
    return GGUFFile(path)


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False
