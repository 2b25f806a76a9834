"""The formats corpora come in, read as a stream of text with bounded memory.

``open_corpus(path)`` accepts

* a UTF-8 text file (any name but the document suffixes below; a leading BOM is dropped),
  read in blocks of 4 MiB;
* JSON Lines: ``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst`` (one JSON object per line, the
  document in the field ``text_field``, default ``text``; blank lines are skipped);
* Parquet: ``.parquet`` with a string column ``text_field``, read one batch at a time
  within row groups (``pyarrow``);
* a folder of any of these, read in sorted order of their paths (recursively; other files are
  ignored; text files and document files are not mixed);
* a folder written by Hugging Face ``datasets``' ``save_to_disk`` (``state.json``,
  ``dataset_info.json`` and Arrow IPC stream files ``data-*.arrow``), read with ``pyarrow``
  alone; ``datasets`` itself is not needed.

A corpus is **text** (text files: the characters as they are; in a folder, a line break is
added after a file that does not end with one) or **documents** (the other formats: each
non-empty document, followed by a line break unless it ends with one). Either way it is one
text, the text a ``.txt`` file with the same content gives (tested).

Bad records (a line that is not JSON or not an object, a missing field, a value that is not a
string) stop the reading with one line naming the file and line (or row); with
``skip_bad=True`` they are skipped and counted (:attr:`Corpus.bad`).
"""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from attnlm.base.errors import InputError
from attnlm.base.foreign import load_json, register
from attnlm.base.foreign import register as _register_reader
from attnlm.base.textio import MAX_LINE, decode_text, text_problem

BLOCK_BYTES = 4 << 20
DOC_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
TEXT_SUFFIXES = (".txt",)
DATASET_FILES = ("state.json", "dataset_info.json")  # a `datasets.save_to_disk` folder
Progress = Callable[[int], Any]  # called with the number of input bytes just read


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for s in DOC_SUFFIXES + TEXT_SUFFIXES:
        if name.endswith(s):
            return s
    return ""


@dataclass
class BadRecords:
    """Records skipped under ``skip_bad``: how many, and the first one's message."""

    count: int = 0
    first: str | None = None

    def add(self, message: str, skip: bool) -> None:
        if not skip:
            raise InputError(message)
        self.count += 1
        self.first = self.first or message

    def format(self) -> str:
        return f"skipped {self.count:,} bad record(s) (first: {self.first})" if self.count else ""


@dataclass
class Corpus:
    """A corpus on disk: ``files`` in reading order, and how to read them (see the module)."""

    path: Path
    files: list[Path]
    documents: bool  # documents (JSON Lines, Parquet, Arrow) or plain text
    text_field: str = "text"
    skip_bad: bool = False
    arrow: bool = False  # the files are a `datasets.save_to_disk` folder's Arrow files
    bad: BadRecords = field(default_factory=BadRecords)

    @property
    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def pieces(self, progress: Progress | None = None) -> Iterator[str]:
        """The corpus's text in order: blocks of a text corpus, or one document at a time
        (each ending with a line break). ``progress(n)`` is told of the input bytes read."""
        self.bad = BadRecords()
        advance = progress or (lambda n: None)
        if not self.documents:
            for f in self.files:
                last = ""
                for block in text_blocks(f, advance):
                    last = block
                    yield block
                if len(self.files) > 1 and last and not last.endswith("\n"):
                    yield "\n"
            return
        for f in self.files:
            if self.arrow:
                docs = _arrow_docs(f, self.text_field, self.bad, self.skip_bad, advance)
            elif _suffix(f) == ".parquet":
                docs = _parquet_docs(f, self.text_field, self.bad, self.skip_bad, advance)
            else:
                docs = _jsonl_docs(f, self.text_field, self.bad, self.skip_bad, advance)
            for doc in docs:
                if doc:
                    yield doc if doc.endswith("\n") else doc + "\n"


def open_corpus(
    path: str | os.PathLike[str], text_field: str = "text", skip_bad: bool = False
) -> Corpus:
    """The corpus at ``path`` (see the module docstring); one-line :class:`InputError` for a
    missing path, a folder without readable files, or a folder mixing text and documents."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    if p.is_file():
        return Corpus(p, [p], _suffix(p) in DOC_SUFFIXES, text_field, skip_bad)
    if (p / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in p.iterdir() if (d / "state.json").is_file())
        example = p / (splits or ["train"])[0]
        raise InputError(f"{p}: a saved DatasetDict; give one split's folder, e.g. {example}")
    if all((p / name).is_file() for name in DATASET_FILES):
        return Corpus(p, _arrow_files(p), True, text_field, skip_bad, arrow=True)
    files = sorted((f for f in p.rglob("*") if f.is_file() and _suffix(f)), key=lambda f: f.parts)
    if not files:
        raise InputError(
            f"{p}: folder contains no .txt files (nor .jsonl, .jsonl.gz, .jsonl.zst, .parquet)"
        )
    docs = [_suffix(f) in DOC_SUFFIXES for f in files]
    if any(docs) and not all(docs):
        raise InputError(
            f"{p}: folder mixes text files and document files (.jsonl, .parquet); keep one kind"
        )
    return Corpus(p, files, docs[0], text_field, skip_bad)


def _arrow_files(folder: Path) -> list[Path]:
    state = load_json(folder / "state.json", "datasets state.json")
    try:
        names = [d["filename"] for d in state["_data_files"]]
        if not all(isinstance(n, str) and n and "/" not in n for n in names):
            raise TypeError("a filename is not a plain file name")
    except (KeyError, TypeError) as e:
        raise InputError(f"{folder / 'state.json'}: not a datasets state file ({e})") from None
    files = [folder / n for n in names]
    for f in files:
        if not f.is_file():
            raise InputError(f"{f}: listed in state.json but missing")
    return files


# ---------------------------------------------------------------------------------- text


def text_blocks(path: Path, advance: Progress) -> Iterator[str]:
    """Decoded blocks of a UTF-8 file, each ending at a line end, read by the one strict
    reader (:func:`attnlm.base.textio.decode_text`: BOM dropped; a bad byte, a NUL or a line over
    ``MAX_LINE`` stops with one line naming the file and line)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"{path}: cannot read file ({e.strerror or e})") from None
    offset, line, carry = 0, 1, b""
    with f:
        while True:
            raw = f.read(BLOCK_BYTES)
            advance(len(raw))
            data = carry + raw
            cut = data.rfind(b"\n") + 1 if raw else len(data)
            if raw and cut == 0 and len(data) <= MAX_LINE:
                carry = data  # no line end yet: read on
                continue
            block, carry = (data[:cut], data[cut:]) if cut else (data, b"")
            if block:
                text = decode_text(
                    block, str(path), empty_ok=True, first_line=line, first_offset=offset
                )
                line += block.count(b"\n")
                offset += len(block)
                if text:
                    yield text
            if not raw:
                return


# ----------------------------------------------------------------------------- documents


def _open_jsonl(path: Path, raw: BinaryIO) -> BinaryIO:
    name = path.name.lower()
    if name.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise InputError(
                f"{path}: reading .zst needs the zstandard package (pip install zstandard)"
            ) from None
        return io.BufferedReader(_ZstdFrames(zstandard, raw, path), BLOCK_BYTES)
    return raw


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every zstd frame of ``raw``, one after another. Unlike
    ``zstandard``'s ``stream_reader``, a stream that ends inside a frame (a truncated download)
    is an :class:`InputError`, not a silent early end of the text."""

    def __init__(self, zstandard: Any, raw: BinaryIO, path: Path) -> None:
        self._z, self._raw, self._path = zstandard, raw, path
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._started = False  # bytes of the current frame were fed
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = self._raw.read(BLOCK_BYTES)
            if not chunk:
                if self._started and not self._obj.eof:
                    raise InputError(f"{self._path}: truncated zstd stream (the last frame is cut)")
                return 0
            self._pending = self._feed(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _feed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            if self._obj.eof:  # the previous frame ended: the next one starts here
                self._obj = self._dctx.decompressobj()
            self._started = True
            try:
                out.append(self._obj.decompress(chunk))
            except self._z.ZstdError as e:
                raise InputError(f"{self._path}: not a valid zstd stream ({e})") from None
            chunk = self._obj.unused_data if self._obj.eof else b""
        return b"".join(out)


def _jsonl_docs(
    path: Path, field: str, bad: BadRecords, skip: bool, advance: Progress
) -> Iterator[str]:
    try:
        raw = open(path, "rb", buffering=BLOCK_BYTES)
    except OSError as e:
        raise InputError(f"{path}: cannot read file ({e.strerror or e})") from None
    done = 0
    with raw, _open_jsonl(path, raw) as f:
        try:
            for lineno, line in enumerate(f, 1):
                if lineno % 1024 == 0:
                    now = raw.tell()
                    advance(now - done)
                    done = now
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as e:
                    msg = "not valid UTF-8" if isinstance(e, UnicodeDecodeError) else "not JSON"
                    if isinstance(e, RecursionError):
                        msg, e = "not JSON", ValueError("nested too deeply")  # type: ignore[assignment]
                    bad.add(f"{path}:{lineno}: {msg} ({e})", skip)
                    continue
                text = _field(record, field, f"{path}:{lineno}", bad, skip)
                if text is not None:
                    yield text
        except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt compressed file
            raise InputError(f"{path}: cannot decompress ({e})") from None
        advance(raw.tell() - done)


def _field(record: Any, field: str, where: str, bad: BadRecords, skip: bool) -> str | None:
    if not isinstance(record, dict):
        bad.add(f"{where}: expected a JSON object, got {type(record).__name__}", skip)
        return None
    if field not in record:
        bad.add(f"{where}: no field {field!r} (fields: {', '.join(list(record)[:8])})", skip)
        return None
    value = record[field]
    if not isinstance(value, str):
        bad.add(f"{where}: field {field!r} is {type(value).__name__}, not a string", skip)
        return None
    problem = text_problem(value, empty_ok=True)  # a lone surrogate (\ud800), a NUL
    if problem:
        bad.add(f"{where}: field {field!r} is {problem}", skip)
        return None
    return value


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise InputError(
            "reading Parquet or Arrow needs the pyarrow package (pip install pyarrow)"
        ) from None
    return pyarrow


def _column_docs(
    path: Path, batches: Iterator[Any], field: str, bad: BadRecords, skip: bool
) -> Iterator[tuple[int, str]]:
    """``(rows read so far, document)`` from record batches holding the column ``field``."""
    pa = _pyarrow()
    row = 0
    for batch in batches:
        names = batch.schema.names
        if field not in names:
            raise InputError(f"{path}: no column {field!r} (columns: {', '.join(names[:8])})")
        column = batch.column(names.index(field))
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise InputError(f"{path}: column {field!r} is {column.type}, not a string column")
        # Arrow trusts the offsets and lengths in the file: a damaged one would read out of
        # bounds (a crash, not an error) or decode bytes that are not UTF-8. One checked pass.
        column.validate(full=True)
        for value in column.to_pylist():
            row += 1
            if value is None:
                bad.add(f"{path}: row {row}: field {field!r} is null, not a string", skip)
                continue
            yield row, value


def _parquet_docs(
    path: Path, field: str, bad: BadRecords, skip: bool, advance: Progress
) -> Iterator[str]:
    pa = _pyarrow()
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        if field not in names:
            raise InputError(f"{path}: no column {field!r} (columns: {', '.join(names[:8])})")
        batches = pf.iter_batches(batch_size=1024, columns=[field])
        yield from _rows_with_progress(path, pf.metadata.num_rows, batches, field, bad, skip,
                                       advance)  # fmt: skip
    except (pa.ArrowException, OSError) as e:  # OSError: corrupt compressed pages
        raise InputError(f"{path}: cannot read Parquet ({e})") from None


def _arrow_docs(
    path: Path, field: str, bad: BadRecords, skip: bool, advance: Progress
) -> Iterator[str]:
    pa = _pyarrow()
    try:
        # read, not memory-mapped: a file cut while mapped would be a bus error, not an error
        with pa.OSFile(str(path), "rb") as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:  # an Arrow IPC file rather than a stream
                source.seek(0)
                reader = pa.ipc.open_file(source)
                reader = iter(reader.get_batch(i) for i in range(reader.num_record_batches))
            yield from _rows_with_progress(path, None, reader, field, bad, skip, advance)
    except (pa.ArrowException, OSError) as e:  # OSError: corrupt compressed pages
        raise InputError(f"{path}: cannot read Arrow data ({e})") from None


def _rows_with_progress(
    path: Path,
    n_rows: int | None,
    batches: Iterator[Any],
    field: str,
    bad: BadRecords,
    skip: bool,
    advance: Progress,
) -> Iterator[str]:
    size = path.stat().st_size
    done = 0
    for row, doc in _column_docs(path, batches, field, bad, skip):
        if n_rows and row % 1024 == 0:
            now = size * row // n_rows
            advance(now - done)
            done = now
        yield doc
    advance(size - done)


for _fmt, _fn in (("JSONL", _jsonl_docs), ("Parquet", _parquet_docs), ("Arrow", _arrow_docs)):
    register(_fmt, f"{__name__}.{_fn.__name__}")


_register_reader("Arrow", f"{__name__}._arrow_files")
_register_reader("JSONL", f"{__name__}._open_jsonl")
