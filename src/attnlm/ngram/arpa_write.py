"""The ARPA writer (plain or gzip), formatting whole blocks of n-grams with array operations.

Output is byte for byte what KenLM ``lmplz`` writes and what attnlm's first, per-value writer
wrote (see :mod:`attnlm.ngram.arpa` for the format): ``log10 p<TAB>w1 .. wk[<TAB>back-off]``,
numbers as ``str(numpy.float32(x))`` (0 as ``0``, anything <= -99 as ``-99``).

How: every field of a line is a fixed-width byte block padded with ``0xFF`` (a byte that never
occurs in UTF-8): a word is a row of a (V, width) table that ends with its separator, a number
a row of :func:`attnlm.ngram.floatfmt.format_float32` on the distinct values of the order. A
block of lines is then a few row gathers (``np.take``) laid side by side in one uint64 matrix,
whose bytes minus the padding (``bytes.translate``) are the text. No Python call per value.

Shape legend: V = vocabulary size, n = n-grams of one order (written ``CHUNK`` at a time),
w = bytes of a padded field (a multiple of 8, so that rows move as uint64 words).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from attnlm.errors import ConfigError
from attnlm.fileio import atomic_open
from attnlm.ngram.floatfmt import PAD, format_float32
from attnlm.ngram.floatfmt import WIDTH as FLOAT_WIDTH
from attnlm.ngram.model import BackoffModel, NgramModel
from attnlm.ngram.progress import progress_bar

CHUNK = 1 << 17  # lines formatted at once (about 30 MB of temporary arrays at order 5)
GZIP_LEVEL = 6  # zlib's default (KenLM's too); level 9 is several times slower on ARPA text
_SQUEEZE = bytes([PAD])


def ngram_word_ids(model: BackoffModel, k: int) -> np.ndarray:
    """(n_k, k) word ids of every order-k entry, in table order."""
    return word_tuples(model.keys[k - 1], k, model.V, lambda m, idx: model.keys[m - 1][idx])


def word_tuples(
    keys: np.ndarray, k: int, V: int, take: Callable[[int, np.ndarray], np.ndarray]
) -> np.ndarray:
    """(n, k) word ids of order-k n-grams from their keys (n,) (``prefix id * V + word``);
    ``take(m, ids)`` returns the keys of the order-m entries ``ids`` (non-decreasing)."""
    cols = [keys % V]
    pref = keys // V
    for m in range(k - 1, 0, -1):
        if m == 1:
            cols.append(pref)
        else:
            keys = take(m, pref)
            cols.append(keys % V)
            pref = keys // V
    return np.stack(cols[::-1], axis=1)


def _table(rows: list[bytes]) -> np.ndarray:
    """(len(rows), w) uint64 view of the byte strings, each padded with PAD to w bytes."""
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    w = max(8, -(-int(lens.max(initial=0)) // 8) * 8)
    buf = np.frombuffer(b"".join(rows), dtype=np.uint8)
    out = np.full((len(rows), w), PAD, dtype=np.uint8)
    out[np.arange(w)[None, :] < lens[:, None]] = buf
    return out.view(np.uint64)


def _words_table(words: list[str], sep: str) -> np.ndarray:
    return _table([(w + sep).encode("utf-8") for w in words])


def _numbers(values: np.ndarray, sep: str) -> tuple[np.ndarray, np.ndarray]:
    """(table (u, w) uint64 of the distinct formatted values + ``sep``, (n,) row of each)."""
    v = values.astype(np.float32)
    uniq, inverse = np.unique(v, return_inverse=True)
    text = np.full((len(uniq), FLOAT_WIDTH + 1), PAD, dtype=np.uint8)
    zero, floor = uniq == 0, uniq <= -99  # written "0" and "-99" (log10 0 = -inf is -99 too)
    plain = ~(zero | floor)
    text[plain, :FLOAT_WIDTH] = format_float32(uniq[plain])
    text[zero, 0] = ord("0")
    text[floor, :3] = np.frombuffer(b"-99", dtype=np.uint8)
    text[:, FLOAT_WIDTH] = ord(sep)
    return text.view(np.uint64), inverse.ravel()


def _chunk_bytes(blocks: list[tuple[np.ndarray, np.ndarray]], lo: int, hi: int) -> bytes:
    """Lines lo..hi-1: the rows ``table[index[lo:hi]]`` of each (table, index) side by side."""
    width = sum(t.shape[1] for t, _ in blocks)
    mat = np.empty((hi - lo, width), dtype=np.uint64)
    col = 0
    for table, index in blocks:
        w = table.shape[1]
        mat[:, col : col + w] = np.take(table, index[lo:hi], axis=0)
        col += w
    return mat.tobytes().translate(None, _SQUEEZE)


def write_arpa(model: NgramModel, path: str | Path, progress: bool = False) -> None:
    """Write a back-off model as an ARPA file (gzip-compressed when ``path`` ends in .gz),
    atomically. ``progress``: a bar on stderr with n-grams written per second."""
    if not isinstance(model, BackoffModel):
        raise ConfigError(
            f"{model.smoothing} smoothing is not a back-off model and has no ARPA form; "
            "save it in the binary format (--out) instead"
        )
    N = model.order

    def section(k: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        ids = ngram_word_ids(model, k) if k > 1 else model.keys[0][:, None]
        yield ids, model.logp[k - 1], model.bo[k - 1] if k < N else None

    sizes = [len(k) for k in model.keys]
    write_sections(path, model.vocab.words, sizes, map(section, range(1, N + 1)), progress)


def write_sections(
    path: str | Path,
    words: list[str],
    sizes: list[int],
    sections: Iterable[Iterable[tuple[np.ndarray, np.ndarray, np.ndarray | None]]],
    progress: bool = False,
) -> None:
    """The ARPA file of ``sizes[k-1]`` n-grams per order, atomically (gzip for ``.gz``).
    ``sections`` yields, for each order k in turn, its lines in blocks: (word ids (n, k),
    log10 p (n,), back-off weights (n,), None at the highest order)."""
    p = Path(path)
    gz = None
    if p.suffix == ".gz":

        def gz(raw):
            return gzip.GzipFile(filename=p.name, mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL)

    N = len(sizes)
    with (
        atomic_open(p, "wb", opener=gz) as f,  # a kill mid-write leaves the old file
        progress_bar(sum(sizes), "write ARPA", progress) as bar,
    ):
        f.write(b"\\data\\\n")
        f.write("".join(f"ngram {k}={sizes[k - 1]}\n" for k in range(1, N + 1)).encode())
        space = _words_table(words, " ")
        for k, blocks_of_order in enumerate(sections, 1):
            f.write(f"\n\\{k}-grams:\n".encode())
            last = _words_table(words, "\t" if k < N else "\n")
            for ids, logp, bo in blocks_of_order:
                blocks = [_numbers(logp, "\t")]
                blocks += [(space, ids[:, j]) for j in range(k - 1)]
                blocks.append((last, ids[:, k - 1]))
                if bo is not None:
                    blocks.append(_numbers(bo, "\n"))
                for lo in range(0, len(logp), CHUNK):
                    hi = min(lo + CHUNK, len(logp))
                    f.write(_chunk_bytes(blocks, lo, hi))
                    bar.update(hi - lo)
        f.write(b"\n\\end\\\n")
