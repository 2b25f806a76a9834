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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from attnlm.base.errors import ConfigError
from attnlm.base.fileio import atomic_open
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


Field = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # (table, row of each line, need)


def _table(rows: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(len(rows), w) uint64 view of the byte strings, each padded with PAD to w bytes, and
    (len(rows),) the uint64 words each row needs (its bytes rounded up to a multiple of 8)."""
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    w = max(8, -(-int(lens.max(initial=0)) // 8) * 8)
    buf = np.frombuffer(b"".join(rows), dtype=np.uint8)
    out = np.full((len(rows), w), PAD, dtype=np.uint8)
    out[np.arange(w)[None, :] < lens[:, None]] = buf
    return out.view(np.uint64), np.maximum(-(-lens // 8), 1).astype(np.uint8)


def _words_table(words: list[str], sep: str) -> tuple[np.ndarray, np.ndarray]:
    return _table([(w + sep).encode("utf-8") for w in words])


def _numbers(values: np.ndarray, sep: str) -> Field:
    """(table (u, w) uint64 of the distinct formatted values + ``sep``, (n,) row of each, None)."""
    v = values.astype(np.float32)
    uniq, inverse = np.unique(v, return_inverse=True)
    text = np.full((len(uniq), FLOAT_WIDTH + 1), PAD, dtype=np.uint8)
    zero, floor = uniq == 0, uniq <= -99  # written "0" and "-99" (log10 0 = -inf is -99 too)
    plain = ~(zero | floor)
    text[plain, :FLOAT_WIDTH] = format_float32(uniq[plain])
    text[zero, 0] = ord("0")
    text[floor, :3] = np.frombuffer(b"-99", dtype=np.uint8)
    text[:, FLOAT_WIDTH] = ord(sep)
    return text.view(np.uint64), inverse.ravel(), None


def _chunk_bytes(blocks: list[Field], lo: int, hi: int) -> bytes:
    """Lines lo..hi-1: the rows ``table[index[lo:hi]]`` of each (table, index, need) side by
    side. A table with ``need`` (uint64 words per row) is cut to the widest row of these lines:
    one long word in the vocabulary would otherwise widen every line of the file, and the
    padding costs time to move and to squeeze out."""
    parts = []
    for table, index, need in blocks:
        idx = index[lo:hi]
        w = table.shape[1] if need is None else int(need[idx].max(initial=1))
        parts.append((table if w == table.shape[1] else table[:, :w], idx, w))
    mat = np.empty((hi - lo, sum(w for _, _, w in parts)), dtype=np.uint64)
    col = 0
    for table, idx, w in parts:
        mat[:, col : col + w] = np.take(table, idx, axis=0)
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

    def section(k: int) -> Iterator[tuple[Ids, np.ndarray, np.ndarray | None]]:
        ids = (lambda: ngram_word_ids(model, k)) if k > 1 else model.keys[0][:, None]
        yield ids, model.logp[k - 1], model.bo[k - 1] if k < N else None

    sizes = [len(k) for k in model.keys]
    sections = map(section, range(1, N + 1))
    write_sections(path, model.vocab.words, sizes, sections, progress, ahead=True)


Ids = np.ndarray | Callable[[], np.ndarray]  # the (n, k) word ids, or a function computing them


def _prepared(
    sections: Iterable[Iterable[tuple[Ids, np.ndarray, np.ndarray | None]]], ahead: bool
) -> Iterator[tuple[int, np.ndarray, Field, Field | None]]:
    """(order k, word ids, numbers of log10 p, numbers of the back-offs or None) per block.

    ``ahead``: format the next block's numbers on a worker thread (numpy's sorts and array
    operations release the GIL) while the caller writes this one, so that the two cores of a
    small machine share the work. It reads one block ahead, so the blocks must not share a
    reused buffer (true of a model in memory)."""

    def prepare(ids: Ids, logp: np.ndarray, bo: np.ndarray | None):
        ids = ids() if callable(ids) else ids
        return ids, _numbers(logp, "\t"), None if bo is None else _numbers(bo, "\n")

    blocks = ((k, b) for k, section in enumerate(sections, 1) for b in section)
    if not ahead:
        for k, b in blocks:
            yield k, *prepare(*b)
        return
    with ThreadPoolExecutor(1) as pool:
        pending = None
        for k, b in blocks:
            job = (k, pool.submit(prepare, *b))
            if pending is not None:
                yield pending[0], *pending[1].result()
            pending = job
        if pending is not None:
            yield pending[0], *pending[1].result()


@contextmanager
def _writer(f, threaded: bool) -> Iterator[Callable[[bytes], object]]:
    """``put(data)``: ``f.write(data)`` in order; ``threaded``: on a worker thread (the write
    and gzip's compression release the GIL) while the caller formats the next lines, with at
    most one write waiting. Every write is done when the block ends."""
    if not threaded:
        yield f.write
        return
    with ThreadPoolExecutor(1) as pool:
        last = []

        def put(data: bytes) -> None:
            if last:
                last.pop().result()
            last.append(pool.submit(f.write, data))

        yield put
        if last:
            last.pop().result()


def write_sections(
    path: str | Path,
    words: list[str],
    sizes: list[int],
    sections: Iterable[Iterable[tuple[Ids, np.ndarray, np.ndarray | None]]],
    progress: bool = False,
    ahead: bool = False,
) -> None:
    """The ARPA file of ``sizes[k-1]`` n-grams per order, atomically (gzip for ``.gz``).
    ``sections`` yields, for each order k in turn, its lines in blocks: (word ids (n, k) or a
    function returning them,
    log10 p (n,), back-off weights (n,), None at the highest order). ``ahead``: see
    :func:`_prepared`."""
    p = Path(path)
    gz = None
    if p.suffix == ".gz":

        def gz(raw):
            return gzip.GzipFile(filename=p.name, mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL)

    N = len(sizes)
    with (
        atomic_open(p, "wb", opener=gz) as f,  # a kill mid-write leaves the old file
        progress_bar(sum(sizes), "write ARPA", progress) as bar,
        _writer(f, ahead) as put,
    ):
        put(b"\\data\\\n")
        put("".join(f"ngram {k}={sizes[k - 1]}\n" for k in range(1, N + 1)).encode())
        space = _words_table(words, " ")
        order = 0  # the order whose header was written last

        def headers_up_to(k: int) -> None:  # also those of orders without blocks
            nonlocal order
            while order < k:
                order += 1
                put(f"\n\\{order}-grams:\n".encode())

        last = space
        for k, ids, logp, bo in _prepared(sections, ahead):
            if k != order:
                headers_up_to(k)
                last = _words_table(words, "\t" if k < N else "\n")
            blocks = [logp] + [(space[0], ids[:, j], space[1]) for j in range(k - 1)]
            blocks.append((last[0], ids[:, k - 1], last[1]))
            if bo is not None:
                blocks.append(bo)
            n = len(logp[1])
            for lo in range(0, n, CHUNK):
                hi = min(lo + CHUNK, n)
                put(_chunk_bytes(blocks, lo, hi))
                bar.update(hi - lo)
        headers_up_to(N)
        put(b"\n\\end\\\n")
