"""A text corpus prepared in one read: the files are read once as bytes, fingerprinted and cut
into byte ranges at line starts; worker processes read and encode their own ranges; the
validation split is placed afterwards from the characters each range held.

The passes of :mod:`attnlm.data.stream` (fingerprint, scan, encode) become one when the
tokenizer is known before the corpus is read and encodes any text in pieces cut at line starts
(a byte-level BPE, :func:`attnlm.tokenizers.chunk_safe`), and the corpus is text files:

1. :func:`text_chunks` reads each file in blocks of ``BLOCK_BYTES``, feeds them to its
   SHA-256 (the fingerprint ``data.json`` keeps, equal to hashing the file on its own, tested)
   and cuts the corpus into ranges of about ``chunk_bytes`` bytes at line starts (after
   ``\\n``, before a character that is not a space as ``str.isspace`` says: the cut of
   :func:`attnlm.data.stream.chunks`, found on the bytes). It never decodes the text: the
   main process only hashes and searches for a few line breaks.
2. :func:`encode_range` (in a worker, or in this process with one worker) reads its range by
   offset, decodes it with the strict reader (:func:`attnlm.base.textio.decode_text`, whose errors
   name the file and line), encodes it and returns its ids in the token files' dtype with its
   character count. No text goes through a pipe; ids come back as ``uint16`` arrays.
3. The ids of every range are written in order into the temporary ``train.bin``. Then
   :func:`split_position` places the split exactly as :func:`attnlm.data.corpus.split_index`
   does on the whole text (the last ``val_fraction`` of characters, moved forward to the next
   line start unless none follows), reading again only the one range that holds it. That
   range is encoded again as its two halves: the ids after it move to ``val.bin``, the
   training file is cut after the ids before it. Because every range boundary is a line start
   and the tokenizer is chunk-safe, both files are byte-identical to encoding each split whole
   (and to the multi-pass preparation; tested).
"""

from __future__ import annotations

import bisect
import hashlib
import re
import shutil
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from attnlm.base.errors import AttnlmError, InputError
from attnlm.base.fileio import atomic_path
from attnlm.base.textio import MAX_LINE, decode_text
from attnlm.data.sources import BLOCK_BYTES, Progress
from attnlm.data.stream import id_array, ordered_map
from attnlm.data.windows import TokenFile, token_dtype, write_token_meta

CHUNK_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"
# a line break, then a byte that is not an ASCII space (a non-ASCII character is checked whole)
_CUT = re.compile(rb"\n(?=[^\t\n\x0b\x0c\r\x1c-\x1f ])")


@dataclass(frozen=True, slots=True)
class Segment:
    """Bytes ``start:end`` of the file ``path``; ``newline``: a line break follows (the one a
    corpus of several files adds after a file that does not end with one)."""

    path: str
    start: int
    end: int
    newline: bool = False


Chunk = tuple[Segment, ...]  # one range of the corpus: usually one segment, more across files


def _starts_line(data: bytes, i: int) -> bool | None:
    """Whether the character whose UTF-8 bytes begin at ``data[i]`` is not a space (None when
    its bytes run past ``data``; False for an invalid byte, which is no cut)."""
    lead = data[i]
    if lead < 0x80:
        return True  # _CUT already refused the ASCII spaces
    n = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    if i + n > len(data):
        return None
    try:
        return not data[i : i + n].decode("utf-8").isspace()
    except UnicodeDecodeError:
        return False


def _open_file(path: Path) -> BinaryIO:
    """One file of the corpus, open for reading bytes (an :class:`InputError` naming it)."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise InputError(f"{path}: cannot read file ({e.strerror or e})") from None


def _file_end(
    path: Path, start: int, end: int, first: bytes, tail: bytes, several: bool
) -> Segment:
    """The last segment of a file (bytes ``start:end``; ``first`` / ``tail``: its first and
    last bytes), with the line break a corpus of ``several`` files adds after a file with text
    that does not end with one."""
    empty = end == 0 or (end == 3 and first == BOM)  # no text: nothing to end
    newline = several and not empty and tail[-1:] != b"\n"
    return Segment(str(path), start, end, newline)


def text_chunks(
    paths: Sequence[Path],
    chunk_bytes: int = CHUNK_BYTES,
    progress: Progress | None = None,
    digests: list[str] | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[Chunk]:
    """The text files ``paths`` (one corpus, in this order) as ranges of about ``chunk_bytes``
    bytes cut at the first line start after that many (see the module); each file's SHA-256
    hex digest is appended to ``digests`` once it is read, ``progress(n)`` told of the bytes
    read (``block_bytes`` at a time). A line over :data:`~attnlm.base.textio.MAX_LINE` ends a
    range early (its reader then names the line)."""
    advance = progress or (lambda n: None)
    several = len(paths) > 1
    done: list[Segment] = []  # the range's segments in earlier files
    size = 0  # their bytes
    for path in paths:
        digest = hashlib.sha256()
        start = pos = 0  # where the range's part of this file begins; bytes read so far
        last_nl = -1  # offset of the last line break read
        tail = first = b""  # the last bytes read (a cut can straddle two blocks); the first
        with _open_file(path) as f:
            while block := f.read(block_bytes):
                digest.update(block)
                advance(len(block))
                if len(first) < 3:
                    first = (first + block)[:3]
                data = tail + block
                base = pos - len(tail)  # file offset of data[0]
                pos += len(block)
                at = max(start + max(chunk_bytes - size, 1) - 1 - base, 0)  # earliest break
                while (m := _CUT.search(data, at)) is not None:
                    starts = _starts_line(data, m.end())
                    if starts is None:  # the character continues in the next block
                        break
                    at = m.end()
                    if starts:
                        cut = base + m.end()
                        yield (*done, Segment(str(path), start, cut))
                        done, size, start = [], 0, cut
                        at = max(cut + chunk_bytes - 1 - base, at)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    last_nl = pos - len(block) + nl
                if pos - last_nl - 1 > MAX_LINE and pos > start:  # a line too long: no cut
                    yield (*done, Segment(str(path), start, pos))  # comes; its reader says so
                    done, size, start = [], 0, pos
                tail = data[-4:]
        if pos > start:
            done.append(_file_end(path, start, pos, first, tail, several))
            size += pos - start
        if digests is not None:
            digests.append(digest.hexdigest())
    if done:
        yield tuple(done)


def _newlines_before(path: str, offset: int) -> int:
    count = 0
    with open(path, "rb") as f:
        while offset > 0 and (block := f.read(min(BLOCK_BYTES, offset))):
            count += block.count(b"\n")
            offset -= len(block)
    return count


def read_segment(seg: Segment) -> str:
    """The text of one segment, read by offset and decoded strictly (a leading byte-order mark
    dropped; an error names the file and its line, counted only then)."""
    try:
        with open(seg.path, "rb") as f:
            f.seek(seg.start)
            data = f.read(seg.end - seg.start)
    except OSError as e:
        raise InputError(f"{seg.path}: cannot read file ({e.strerror or e})") from None
    try:
        text = decode_text(data, seg.path, empty_ok=True, first_offset=seg.start)
    except InputError:
        line = 1 + _newlines_before(seg.path, seg.start)
        text = decode_text(data, seg.path, empty_ok=True, first_line=line, first_offset=seg.start)
    return text + "\n" if seg.newline else text


def read_chunk(chunk: Chunk) -> str:
    """The text of a range (its segments joined)."""
    return "".join(read_segment(seg) for seg in chunk)


class UnencodableText(InputError):
    """The tokenizer refused some text of the corpus (a special token it must not meet): the
    caller prepares in passes instead, whose error names the split the text is in."""


def _ids(tokenizer: Any, text: str, what: str = "the corpus") -> np.ndarray:
    """The ids of ``text`` in the token files' dtype (ids < vocab_size: no overflow)."""
    try:
        ids = tokenizer.encode(text)  # a fresh list: no copy (encode_text makes one)
    except (AttnlmError, KeyError, ValueError) as e:
        raise UnencodableText(f"{what}: the tokenizer cannot encode this text ({e})") from None
    return id_array(ids, tokenizer.vocab_size)


def encode_range(tokenizer: Any, chunk: Chunk) -> tuple[np.ndarray, int, bool]:
    """``(ids, characters, whether any is not a space)`` of one range (a worker's job)."""
    text = read_chunk(chunk)
    return _ids(tokenizer, text), len(text), bool(text) and not text.isspace()


def split_position(
    chars: Sequence[int], val_fraction: float, read: Callable[[int], str]
) -> tuple[int, str, int]:
    """``(k, text of range k, offset in it)``: where validation starts in a text whose
    ranges hold ``chars`` characters each, as :func:`attnlm.data.corpus.split_index` places it
    on the whole text: the last ``val_fraction`` of characters, moved forward past the next
    line break unless that is the final character or there is none. Only range ``k`` is
    read (``read(k)``): every range but the last ends with a line break, so the next one
    after the cut is in the range that holds the cut."""
    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"val_fraction must be in (0, 1), got {val_fraction}")
    ends = np.cumsum(np.asarray(chars, dtype=np.int64)).tolist()
    total = ends[-1] if ends else 0
    cut = int(total * (1.0 - val_fraction))
    if cut >= total:
        raise InputError("the text is too short to hold out a validation split")
    k = bisect.bisect_right(ends, cut)  # range k holds character `cut`
    begin = ends[k - 1] if k else 0
    text = read(k)
    nl = text.find("\n", cut - begin)
    at = begin + nl + 1 if 0 <= nl and begin + nl < total - 1 else cut
    return k, text, at - begin


@dataclass
class Prepared:
    """The token files of a corpus prepared in one read, and its files' SHA-256 digests."""

    train: TokenFile
    val: TokenFile
    sha256: list[str]


def prepare_text_files(
    paths: Sequence[Path],
    tokenizer: Any,
    out: Path,
    val_fraction: float,
    *,
    workers: int = 1,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Progress | None = None,
    where: str = "corpus",
) -> Prepared:
    """Write ``out/train.bin`` and ``out/val.bin`` (with their metadata) from the text files
    ``paths`` in one read (see the module). ``tokenizer`` must encode any text and be
    chunk-safe; ``where`` names the corpus in the error for a text of spaces only."""
    vocab = tokenizer.vocab_size
    dtype = token_dtype(vocab)
    width = dtype.itemsize
    digests: list[str] = []
    ranges: list[Chunk] = []  # what each range is, to read the one holding the split again
    chars, tokens = array("q"), array("q")  # per range (compact: a range is about a MiB)
    nonspace = False

    def kept(stream: Iterator[Chunk]) -> Iterator[Chunk]:
        for chunk in stream:
            ranges.append(chunk)
            yield chunk

    stream = kept(text_chunks(paths, chunk_bytes, progress, digests))
    with atomic_path(out / "train.bin") as train_tmp, open(train_tmp, "w+b") as f:
        for ids, n_chars, has_text in ordered_map(encode_range, stream, tokenizer, workers):
            f.write(memoryview(ids))
            chars.append(n_chars)
            tokens.append(len(ids))
            nonspace = nonspace or has_text
        if not nonspace:
            raise InputError(f"{where}: file is empty")
        k, text, j = split_position(chars, val_fraction, lambda k: read_chunk(ranges[k]))
        head = _ids(tokenizer, text[:j], "training text")
        tail = _ids(tokenizer, text[j:], "validation text")
        before = sum(tokens[:k])
        f.flush()
        with atomic_path(out / "val.bin") as val_tmp, open(val_tmp, "wb") as g:
            g.write(memoryview(tail))
            f.seek((before + tokens[k]) * width)  # the ids after range k
            shutil.copyfileobj(f, g, 1 << 24)
        f.truncate(before * width)
        f.seek(before * width)
        f.write(memoryview(head))
    n_train = sum(chars[:k]) + j
    n_val = sum(chars) - n_train
    train = write_token_meta(out / "train.bin", dtype, before + len(head), n_train, vocab)
    val = write_token_meta(out / "val.bin", dtype, len(tail) + sum(tokens[k + 1 :]), n_val, vocab)
    return Prepared(train, val, digests)
