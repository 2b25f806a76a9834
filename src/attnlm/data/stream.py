"""A corpus of any size into token files: scanned, split, cut into chunks, encoded in worker
processes, written in order. Memory holds a few chunks, never the corpus.

The steps (:func:`attnlm.train.data.prepare` runs them; ``attnlm data prepare`` and
``attnlm train`` share it):

1. :func:`scan` reads the corpus once (:mod:`attnlm.data.sources`): characters, documents,
   where the last line break before the final character is, whether there is any non-space
   text, and (for the character tokenizer) the alphabet.
2. :func:`split_point` places the validation split without the text in memory. Text: the last
   ``val_fraction`` of characters, moved forward to the next line start (the definition of
   :func:`attnlm.data.corpus.split_index`; the line break is found while streaming, and the
   scan tells in advance whether there is one to find). Documents: the last ``val_fraction``
   of documents (at least one on each side).
3. :func:`chunks` streams ``(split, text)`` chunks of about ``chunk_chars`` characters cut at
   line starts (where :func:`attnlm.tokenizers.chunk_safe` guarantees that encoding the pieces
   equals encoding the whole; a tokenizer without that guarantee gets each split as one
   chunk, which then is in memory whole).
4. :func:`encode_chunks` encodes them in ``workers`` processes (``spawn``; each gets the
   tokenizer once) with at most ``2 * workers`` chunks in flight, and yields the ids in the
   chunks' order, so the token files are byte-identical to one worker's (tested).
   :func:`ordered_map` is that worker pool for any job (:mod:`attnlm.data.text_ranges` uses it
   for byte ranges the workers read themselves).

A text corpus with a byte-level BPE given beforehand skips steps 1 and 2 and sends no text to
the workers: :mod:`attnlm.data.text_ranges`.
"""

from __future__ import annotations

import os
import pickle
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnlm.base.errors import InputError
from attnlm.data.sources import BadRecords, Corpus, Progress
from attnlm.data.windows import token_dtype
from attnlm.tokenizers import encode_text

CHUNK_CHARS = 1 << 20
SPLIT_NAMES = ("training text", "validation text")
_LINE_START = re.compile(r"\n(?=\S)")  # a cut: after a line break, before a non-space


@dataclass
class Scan:
    """What one pass over a corpus tells (see the module docstring)."""

    chars: int = 0
    documents: int = 0
    inner_newline: int = -1  # position of the last "\n" before the final character (-1: none)
    nonspace: bool = False
    alphabet: set[str] | None = None
    bad: BadRecords = field(default_factory=BadRecords)


def scan(corpus: Corpus, alphabet: bool = False, progress: Progress | None = None) -> Scan:
    """One pass over ``corpus``; ``alphabet``: also collect its distinct characters."""
    out = scan_pieces(corpus.pieces(progress), alphabet)
    out.bad = corpus.bad
    if not corpus.documents:
        out.documents = 0
    return out


def scan_pieces(pieces: Iterable[str], alphabet: bool = False) -> Scan:
    """:func:`scan` of a text given as pieces (``documents`` counts the pieces)."""
    out = Scan(alphabet=set() if alphabet else None)
    last = before = -1  # the last two line breaks seen
    for piece in pieces:
        r = piece.rfind("\n")
        if r >= 0:
            r2 = piece.rfind("\n", 0, r)
            before = out.chars + r2 if r2 >= 0 else last
            last = out.chars + r
        out.chars += len(piece)
        out.documents += 1
        if not out.nonspace and not piece.isspace():
            out.nonspace = True
        if out.alphabet is not None:
            _add_alphabet(out.alphabet, piece)
    out.inner_newline = last if last < out.chars - 1 else before
    return out


def _add_alphabet(alphabet: set[str], piece: str) -> None:
    if piece.isascii():  # the usual case, counted in C
        counts = np.bincount(np.frombuffer(piece.encode("ascii"), np.uint8), minlength=128)
        alphabet.update(chr(c) for c in np.flatnonzero(counts))
    else:
        alphabet.update(piece)


@dataclass(frozen=True)
class SplitPoint:
    """Where validation starts: a document index, or a character position that ``move`` says
    is moved forward to the next line start."""

    documents: bool
    at: int
    move: bool = False


def split_point(info: Scan, val_fraction: float, documents: bool) -> SplitPoint:
    """The validation split of a scanned corpus (see the module docstring)."""
    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if documents:
        if info.documents < 2:
            raise InputError(
                f"{info.documents} document(s): need at least 2 to hold out a validation split"
            )
        at = min(max(int(info.documents * (1.0 - val_fraction)), 1), info.documents - 1)
        return SplitPoint(True, at)
    cut = int(info.chars * (1.0 - val_fraction))
    if cut >= info.chars:
        raise InputError("the text is too short to hold out a validation split")
    return SplitPoint(False, cut, move=info.inner_newline >= cut)


def split_pieces(pieces: Iterable[str], point: SplitPoint) -> Iterator[tuple[int, str]]:
    """``(0, text)`` for the training split, then ``(1, text)`` for validation."""
    if point.documents:
        for i, doc in enumerate(pieces):
            yield int(i >= point.at), doc
        return
    pos, split, seeking = 0, 0, False
    for piece in pieces:
        end = pos + len(piece)
        if split or (not seeking and end <= point.at):
            yield split, piece
            pos = end
            continue
        start = 0 if seeking else point.at - pos
        if not point.move:
            j = start
        else:
            seeking = True
            j = piece.find("\n", start) + 1
            if not j:  # the line break is further on
                yield 0, piece
                pos = end
                continue
        if j:
            yield 0, piece[:j]
        if j < len(piece):
            yield 1, piece[j:]
        split, pos = 1, end


def chunks(
    split_stream: Iterable[tuple[int, str]], chunk_chars: int = CHUNK_CHARS, safe: bool = True
) -> Iterator[tuple[int, str]]:
    """``(split, chunk)``: the text of each split in chunks of about ``chunk_chars``
    characters, cut at the first line start after ``chunk_chars`` (one chunk per split when
    not ``safe``)."""
    buf: list[str] = []
    size = 0
    searched = chunk_chars  # where the next search for a cut starts in the joined buffer
    current = 0
    for split, text in split_stream:
        if split != current:
            if buf:
                yield current, "".join(buf)
            buf, size, searched, current = [], 0, chunk_chars, split
        buf.append(text)
        size += len(text)
        if not safe or size <= chunk_chars:
            continue
        joined = "".join(buf)
        while len(joined) > chunk_chars:
            m = _LINE_START.search(joined, searched)
            if m is None:
                searched = max(chunk_chars, len(joined) - 1)
                break
            yield current, joined[: m.end()]
            joined = joined[m.end() :]
            searched = chunk_chars
        buf, size = [joined], len(joined)
    if buf and size:
        yield current, "".join(buf)


# --------------------------------------------------------------------- parallel encoding

_WORKER: dict[str, Any] = {}


def _watch_parent(parent: int) -> None:
    while True:  # a worker whose parent was killed (SIGKILL) leaves instead of lingering
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _init_worker(tokenizer: bytes, parent: int) -> None:
    _WORKER["tokenizer"] = pickle.loads(tokenizer)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _call_in_worker(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_WORKER["tokenizer"], item)


def ordered_map(
    fn: Callable[[Any, Any], Any], items: Iterable[Any], tokenizer: Any, workers: int = 1
) -> Iterator[Any]:
    """``fn(tokenizer, item)`` for each item, in order; ``workers > 1`` runs it in that many
    processes (``spawn``; each unpickles the tokenizer once, and a worker whose parent dies
    leaves) with at most ``2 * workers`` items in flight. ``fn`` is a module-level function."""
    if workers <= 1:
        for item in items:
            yield fn(tokenizer, item)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(pickle.dumps(tokenizer), os.getpid()),
    )
    pending: deque = deque()
    try:
        for item in items:
            pending.append(pool.submit(_call_in_worker, fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise InputError(
            "an encoding worker process died (out of memory, killed, or started from a script "
            "without an `if __name__ == '__main__':` guard, which worker processes need); "
            "use --workers 1 to encode in this process"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def id_array(ids: list[int], vocab_size: int) -> np.ndarray:
    """``ids`` (all below ``vocab_size``) as an array of the token files' dtype, the form ids
    travel back from workers in (half the bytes of uint32 for most vocabularies);
    ``np.fromiter`` with a count fills the array in one pass, faster than ``np.array``."""
    return np.fromiter(ids, dtype=token_dtype(vocab_size), count=len(ids))


def _encode_piece(tokenizer: Any, item: tuple[int, str]) -> tuple[int, np.ndarray]:
    split, text = item
    return split, id_array(encode_text(tokenizer, text, SPLIT_NAMES[split]), tokenizer.vocab_size)


def encode_chunks(
    tokenizer: Any, stream: Iterable[tuple[int, str]], workers: int = 1
) -> Iterator[tuple[int, Any]]:
    """``(split, ids)`` for each chunk of ``stream``, in order; ``workers > 1`` encodes in
    that many processes with at most ``2 * workers`` chunks in flight (:func:`ordered_map`)."""
    if workers <= 1:
        for split, text in stream:
            yield split, encode_text(tokenizer, text, SPLIT_NAMES[split])
        return
    yield from ordered_map(_encode_piece, stream, tokenizer, workers)


def default_workers() -> int:
    """The machine's cores (those this process may run on)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
