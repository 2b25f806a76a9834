"""Loading a saved n-gram model of either format: the binary ``.npz`` written by
:meth:`~attnlm.ngram.model.NgramModel.save` (memory-mapped, :mod:`attnlm.ngram.binary`) or an
ARPA file (:mod:`attnlm.ngram.arpa`)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.foreign import foreign_reader
from attnlm.ngram.arpa import read_arpa
from attnlm.ngram.binary import map_npz
from attnlm.ngram.counts import Vocabulary
from attnlm.ngram.model import FORMAT, AddKModel, BackoffModel, NgramModel


@foreign_reader("n-gram model")
def load_model(path: str | Path, mmap: bool = True) -> NgramModel:
    """Load a model saved by :meth:`NgramModel.save` (binary), or an ARPA file (``.arpa``,
    ``.arpa.gz`` or any file starting with ``\\data\\``). Binary arrays are memory-mapped
    read-only (``mmap=False``: read into memory)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"\x1f\x8b" or not magic.startswith(b"PK"):
        return read_arpa(p)
    try:
        if mmap:
            data = map_npz(p)
        else:
            with np.load(p, allow_pickle=False) as z:
                data = {name: z[name] for name in z.files}
        header = json.loads(bytes(data["header"]).decode("utf-8"))
        words = bytes(data["vocab"]).decode("utf-8").split("\n")
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as e:
        raise InputError(f"{p}: not an attnlm n-gram model ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InputError(f"{p}: not an attnlm n-gram model")
    try:
        return _from_arrays(header, words, data)
    except KeyError as e:
        raise InputError(f"{p}: incomplete n-gram model (missing {e.args[0]!r})") from None
    except (TypeError, ValueError, IndexError) as e:
        detail = " ".join(str(e).split()) or type(e).__name__
        raise InputError(f"{p}: corrupt n-gram model ({detail})") from None


def _check_arrays(header: dict, V: int, data: dict) -> None:
    """Refuse arrays that would load but give a wrong number: every array present, 1-D, of the
    right kind and length, keys sorted and in range, no NaN, no probability above 1."""
    N = header["order"]
    if isinstance(N, bool) or not isinstance(N, int) or not 1 <= N <= 64:
        raise ValueError(f"order {N!r} is not an integer in [1, 64]")
    if header["kind"] not in ("addk", "backoff"):
        raise ValueError(f"unknown kind {header['kind']!r}")
    values = ("counts",) if header["kind"] == "addk" else ("logp", "bo")
    parents = 1
    for k in range(1, N + 1):
        keys = np.asarray(data[f"keys{k}"])
        if keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise ValueError(f"keys{k} is not a 1-D integer array")
        if len(keys) and (keys[0] < 0 or keys[-1] >= parents * V or (np.diff(keys) <= 0).any()):
            raise ValueError(f"keys{k} are not sorted ids below {parents * V:,}")
        for name in values:
            a = np.asarray(data[f"{name}{k}"])
            if a.shape != keys.shape or a.dtype.kind not in "fiu":
                raise ValueError(f"{name}{k} is not {len(keys):,} numbers, one per key")
            if np.isnan(a).any() or np.isposinf(a).any():
                raise ValueError(f"{name}{k} holds NaN or infinite values")
            if name == "logp" and (a > 1e-6).any():
                raise ValueError(f"logp{k} holds a log-probability above 0")
            if name == "counts" and (a < 0).any():
                raise ValueError(f"counts{k} holds a negative count")
        parents = len(keys)
    if header["kind"] == "addk":
        k_val = header["k"]
        if isinstance(k_val, bool) or not isinstance(k_val, (int, float)) or not k_val > 0:
            raise ValueError(f"k {k_val!r} is not a positive number")


def _from_arrays(header: dict, words: list[str], data: dict) -> NgramModel:
    vocab = Vocabulary(words)
    _check_arrays(header, len(vocab), data)
    N = int(header["order"])
    keys = [data[f"keys{k}"] for k in range(1, N + 1)]
    if header["kind"] == "addk":
        counts = [data[f"counts{k}"] for k in range(1, N + 1)]
        return AddKModel(vocab, keys, counts, header["k"], header["pad"], header.get("meta"))
    return BackoffModel(
        vocab,
        keys,
        [data[f"logp{k}"] for k in range(1, N + 1)],
        [data[f"bo{k}"] for k in range(1, N + 1)],
        smoothing=header["smoothing"],
        pad=header["pad"],
        normalized=header["normalized"],
        meta=header.get("meta"),
    )
