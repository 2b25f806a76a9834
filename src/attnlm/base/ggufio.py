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
"""

from __future__ import annotations

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

# ggml tensor types this reader can size: id -> (name, elements per block, bytes per block).
# (gguf.GGML_QUANT_SIZES holds the same facts for every type; a type missing here is reported
# by its name from gguf.GGMLQuantizationType when the package knows it.)
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}


def type_name(type_id: int) -> str:
    """The ggml name of a tensor type id (``Q4_K``), from ``gguf`` for types we cannot size."""
    if type_id in TENSOR_TYPES:
        return TENSOR_TYPES[type_id][0]
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(type_id).name
    except (ImportError, ValueError):
        return f"type {type_id}"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``shape`` in numpy order (the file's dims reversed),
    ``type`` the ggml type id, ``offset`` its first byte in the file, ``nbytes`` its size
    (``None`` for a type this reader cannot size)."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int
    nbytes: int | None

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


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


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    """One metadata value of type ``vtype``: a Python scalar, a ``str``, or for an array a
    numpy array (numbers; ``bool`` arrays as ``bool``) or a list (strings, nested arrays)."""
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
        return [_value(cur, ARRAY, f"{key}[{i}]") for i in range(count)]
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

    def _info(self, name: str, shape: tuple[int, ...], ttype: int, offset: int) -> TensorInfo:
        where = str(self.path)
        if any(d <= 0 or d > 1 << 40 for d in shape):
            raise InputError(f"{where}: tensor {name!r} has an invalid shape {list(shape)}")
        nbytes = None
        if ttype in TENSOR_TYPES:
            _, block, size = TENSOR_TYPES[ttype]
            if shape[-1] % block:
                raise InputError(
                    f"{where}: tensor {name!r} ({type_name(ttype)}) has rows of {shape[-1]} "
                    f"elements, not a multiple of its block size {block}"
                )
            nbytes = int(np.prod(shape, dtype=object)) // block * size
        if offset % self.alignment:
            raise InputError(f"{where}: tensor {name!r} is not aligned (offset {offset})")
        start = self.data_offset + offset
        if nbytes is not None and start + nbytes > self.file_size:
            raise InputError(
                f"{where}: truncated GGUF file (tensor {name!r} ends at byte {start + nbytes:,}, "
                f"the file has {self.file_size:,})"
            )
        return TensorInfo(name, shape, ttype, start, nbytes)

    # -- reading -------------------------------------------------------------------------------

    def raw(self, name: str | TensorInfo) -> np.ndarray:
        """The bytes of one tensor as a ``uint8`` array, read from the file (a fresh copy)."""
        info = name if isinstance(name, TensorInfo) else self.tensors[name]
        if info.nbytes is None:
            raise InputError(
                f"{self.path}: tensor {info.name!r} has type {info.type_name}, which is not "
                "supported"
            )
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
            out[info.type_name] = (n + 1, b + (info.nbytes or 0))
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
