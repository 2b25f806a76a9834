"""Memory-mapped reading of attnlm's binary n-gram files (uncompressed ``.npz``, no pickle).

:meth:`attnlm.ngram.model.NgramModel.save` writes a zip archive of ``.npy`` members, stored
without compression (``numpy.savez``). Each member's array data therefore lies in the file
as is: after the zip local header (30 bytes, the name, the extra field) comes the ``.npy``
header and then the raw array. :func:`map_npz` maps every member with ``numpy.memmap``
(read-only), so opening a model costs a few header reads whatever its size; pages are read
when a query touches them. Object arrays (pickles) are refused.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # zip local file header, 30 bytes
_LOCAL_MAGIC = b"PK\x03\x04"


def map_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an uncompressed ``.npz`` as a read-only memory map (name -> array).
    Raises ``ValueError`` (compressed member, object array, bad header) or ``OSError`` /
    ``zipfile.BadZipFile``."""
    p = Path(path)
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(p) as z, open(p, "rb") as f:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"member {info.filename} is compressed (cannot be mapped)")
            f.seek(info.header_offset)
            head = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
            if head[0] != _LOCAL_MAGIC:
                raise ValueError(f"bad zip header for {info.filename}")
            f.seek(info.header_offset + _LOCAL_HEADER.size + head[9] + head[10])
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            if dtype.hasobject:
                raise ValueError(f"member {info.filename} holds Python objects")
            name = info.filename[: -len(".npy")]
            count = int(np.prod(shape))
            if count == 0:
                out[name] = np.empty(shape, dtype=dtype)
                continue
            member_end = info.header_offset + _LOCAL_HEADER.size + head[9] + head[10]
            if f.tell() + count * dtype.itemsize > member_end + info.file_size:
                raise ValueError(f"member {info.filename} is truncated")
            order = "F" if fortran else "C"
            mm = np.memmap(p, dtype=dtype, mode="r", offset=f.tell(), shape=shape, order=order)
            out[name] = np.asarray(mm)  # a plain ndarray view; it keeps the map alive
    return out
