"""Token id files and training windows (self-supervision: predict the next token).

The corpus is tokenized once into a flat array of ids, stored as a raw memory-mapped file
(``uint16`` when the vocabulary fits in 65,536 ids, ``uint32`` otherwise) next to its tokenizer.
A small JSON file beside it records the dtype, the number of ids and the number of characters
the ids stand for, so bits per character can be computed without the text.

Windows: a training example is ``x = ids[i : i + T]`` and ``y = ids[i + 1 : i + T + 1]``
(targets shifted by one), with random starts ``i``. Evaluation walks the array in
non-overlapping windows so that every id after the first is predicted exactly once.

Shapes: ``B`` batch, ``T`` block size (window length).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_open, atomic_write_text

if TYPE_CHECKING:  # torch is imported lazily so `attnlm data ...` stays quick
    import torch

UINT16_LIMIT = 2**16


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id below ``vocab_size``."""
    if vocab_size <= 0:
        raise InputError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= UINT16_LIMIT else np.dtype(np.uint32)


@dataclass(frozen=True)
class TokenFile:
    """A flat id array on disk: ``path`` (raw ids) and ``meta`` (JSON beside it)."""

    path: Path
    dtype: str
    n_tokens: int
    n_chars: int
    vocab_size: int

    @property
    def chars_per_token(self) -> float:
        return self.n_chars / max(self.n_tokens, 1)

    def open(self) -> np.memmap | np.ndarray:
        """Memory-map the ids read-only (an empty array when there are none)."""
        if self.n_tokens == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n_tokens,))


def _meta_path(path: Path) -> Path:
    return path.with_suffix(".json")


def write_token_file(
    ids: Sequence[int] | np.ndarray, path: str | os.PathLike[str], vocab_size: int, n_chars: int
) -> TokenFile:
    """Write ``ids`` as a raw array at ``path`` plus ``path.json`` metadata, each atomically."""
    return write_token_stream([ids], path, vocab_size, n_chars)


def write_token_stream(
    chunks: Iterable[Sequence[int] | np.ndarray],
    path: str | os.PathLike[str],
    vocab_size: int,
    n_chars: int | Callable[[], int],
) -> TokenFile:
    """Write the ids of ``chunks`` one after the other as one raw array at ``path`` (plus the
    ``path.json`` metadata), each file atomically. Only one chunk is in memory at a time, so a
    corpus encoded piece by piece (:func:`attnlm.tokenizers.iter_encode`) never becomes one
    list of ids. ``n_chars`` may be a function, called once the chunks are written (for a
    stream that counts its characters as it goes)."""
    path = Path(path)
    dtype = token_dtype(vocab_size)
    n = 0
    with atomic_open(path, "wb") as f:
        for chunk in chunks:
            arr = np.asarray(chunk)
            if arr.dtype.kind not in "ui":  # a list of ids (or anything else): check as int64
                arr = np.asarray(chunk, dtype=np.int64)
            negative = arr.dtype.kind == "i" and arr.size and arr.min() < 0
            if arr.size and (negative or arr.max() >= vocab_size):
                raise InputError(f"{path}: token id out of range for vocab_size {vocab_size}")
            f.write(memoryview(np.ascontiguousarray(arr.astype(dtype, copy=False))))
            n += int(arr.size)
    return write_token_meta(path, dtype, n, n_chars() if callable(n_chars) else n_chars, vocab_size)


def write_token_meta(
    path: str | os.PathLike[str], dtype: np.dtype, n_tokens: int, n_chars: int, vocab_size: int
) -> TokenFile:
    """Write the ``path.json`` metadata of the raw id array at ``path`` (atomically)."""
    path = Path(path)
    meta = {
        "dtype": np.dtype(dtype).name,
        "n_tokens": int(n_tokens),
        "n_chars": int(n_chars),
        "vocab_size": int(vocab_size),
    }
    atomic_write_text(_meta_path(path), json.dumps(meta, indent=1))
    return TokenFile(path=path, **meta)


def read_token_file(path: str | os.PathLike[str]) -> TokenFile:
    """Open the metadata of a file written by :func:`write_token_file` (checks its size)."""
    path = Path(path)
    try:
        meta = json.loads(_meta_path(path).read_text(encoding="utf-8"))
        tf = TokenFile(path=path, **meta)
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"{path}: missing or corrupt token file metadata ({e})") from None
    expected = tf.n_tokens * np.dtype(tf.dtype).itemsize
    if not path.is_file() or path.stat().st_size != expected:
        raise InputError(f"{path}: token file is missing or has the wrong size")
    return tf


class Windows:
    """Random and sequential windows over one id array.

    ``sample_starts`` draws window starts from a ``torch.Generator`` so that a run's data order
    is reproducible and resumable (the generator's state is part of the checkpoint).
    """

    def __init__(self, ids: np.ndarray, block_size: int, bos: int | None = None) -> None:
        if len(ids) < 2:
            raise InputError(f"text too short: {len(ids)} token(s); need at least 2")
        self.ids = ids
        # ``bos``: every window starts with this token and predicts every token of its part of
        # the text, the first one included (as llama.cpp's perplexity puts the BOS first in
        # each chunk): inputs [bos, t_s .. t_(s+T-2)], targets t_s .. t_(s+T-1)
        self.bos = bos
        # Texts shorter than a window are used in full (shorter windows).
        self.block_size = min(block_size, len(ids) - (1 if bos is None else 0))

    @property
    def n_starts(self) -> int:
        return len(self.ids) - self.block_size + (0 if self.bos is None else 1)

    def _targets(self) -> int:
        """How many targets the array holds (every token but the first; all with a BOS)."""
        return len(self.ids) - (1 if self.bos is None else 0)

    def _rows(self, begins: list[int], t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of windows whose first target is ``ids[b (+1 without BOS)]``."""
        import torch

        if self.bos is None:
            xy = torch.from_numpy(
                np.stack([np.asarray(self.ids[b : b + t + 1], dtype=np.int64) for b in begins])
            )
            return xy[:, :-1], xy[:, 1:]
        y = torch.from_numpy(
            np.stack([np.asarray(self.ids[b : b + t], dtype=np.int64) for b in begins])
        )
        x = torch.cat([torch.full((len(begins), 1), self.bos, dtype=torch.long), y[:, :-1]], 1)
        return x, y

    def sample_starts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` random window starts, shape (n,)."""
        import torch

        return torch.randint(self.n_starts, (n,), generator=generator)

    def batch(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets for the given starts: two LongTensors of shape (B, T)."""

        return self._rows(starts.tolist(), self.block_size)

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch: (x, y), each (n, T)."""
        return self.batch(self.sample_starts(n, generator))

    def sequential(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Non-overlapping windows covering every target once, ``batch_size`` per step.

        The last window may be shorter; it is yielded alone so batches stay rectangular.
        """
        import torch

        t = self.block_size
        n_targets = self._targets()
        full = n_targets // t
        for b0 in range(0, full, batch_size):
            starts = torch.arange(b0, min(b0 + batch_size, full)) * t
            yield self.batch(starts)
        rest = n_targets - full * t
        if rest:
            yield self._rows([full * t], rest)

    def n_eval_batches(self, batch_size: int) -> int:
        full = self._targets() // self.block_size
        return math.ceil(full / batch_size) + int(self._targets() % self.block_size > 0)


def bits_per_char(total_nats: float, n_chars: int) -> float:
    """Bits per character: total nats / characters / ln 2."""
    return total_nats / max(n_chars, 1) / math.log(2)
