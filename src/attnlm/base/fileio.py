"""Atomic file writes: a reader sees the old file or the complete new one, never a torn one.

Every file attnlm writes goes through :func:`atomic_open` (streamed writes) or
:func:`atomic_write_text` / :func:`atomic_write_bytes` (whole contents at once). The recipe is
the usual POSIX one:

1. create a temporary file ``.NAME.tmp-XXXXXXXX`` in the *same folder* as the target (so the
   rename below stays within one file system and is atomic);
2. write, ``flush``, ``os.fsync`` the file (its bytes are on disk before it gets the name);
3. ``os.replace(tmp, target)`` (atomic on POSIX and Windows);
4. ``fsync`` the folder, so the new directory entry itself survives a power cut (POSIX only).

If anything fails (an exception, a full disk) the temporary file is removed and the target
is untouched. A process killed with SIGKILL mid-write leaves the target untouched too; only a
``.NAME.tmp-*`` file may remain, which :func:`remove_stale_temps` deletes.

:func:`output_lock` is the one lock every writer of a run folder (or output file) holds, so two
processes never write into the same place; :func:`kill_point` marks the places a test may kill
the process at (``ATTNLM_TEST_KILL_AT=LABEL:N``) to check that nothing is lost.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from attnlm.base.errors import InputError, file_read_errors

TEMP_MARK = ".tmp-"
_OUR_TEMP = re.compile(r"\.tmp-[0-9a-f]{16}$")  # the names temp_path_for gives
LOCK_NAME = ".attnlm.lock"
KILL_ENV = "ATTNLM_TEST_KILL_AT"
_kill_counts: dict[str, int] = {}


def cache_dir() -> Path:
    """The attnlm cache directory: ``$ATTNLM_CACHE`` or ``~/.cache/attnlm`` (created on use)."""
    env = os.environ.get("ATTNLM_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "attnlm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def kill_point(label: str) -> None:
    """A place where a writer may be killed by the kill tests: with ``ATTNLM_TEST_KILL_AT`` set
    to ``LABEL:N`` (or ``*:N``), the N-th call with that label (or the N-th of any label) sends
    SIGKILL to this process. Labels: ``replace`` (a complete temporary file or folder, before
    it is renamed over the target), ``append`` (an appended log line, half written). Without
    the variable this is a dictionary look-up."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    want, _, n = spec.rpartition(":")
    for key in (label, "*"):
        _kill_counts[key] = _kill_counts.get(key, 0) + 1
        if key == want and str(_kill_counts[key]) == n.strip():
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary path beside ``path``: ``.NAME.tmp-<16 hex digits>``."""
    p = Path(path)
    return p.with_name(f".{p.name}{TEMP_MARK}{secrets.token_hex(8)}")


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """``fsync`` a folder so that renames inside it are durable (no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (and Windows) cannot fsync a directory
        pass
    finally:
        os.close(fd)


def _cannot_write(path: Path, e: OSError) -> InputError:
    return InputError(f"{path}: cannot write ({e.strerror or e})")


def _is_special(path: Path) -> bool:
    """Whether ``path`` itself (not what a symlink points to: the rename replaces the link)
    is a device, a FIFO or a socket."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode))


def _umask() -> int:
    """The process's file-creation mask (read from ``/proc`` where it can be: setting it to read
    it would race with other threads creating files); 0o022 where it cannot."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that wants a file *name* (e.g.
    ``matplotlib``'s ``savefig`` or ``numpy.tofile``); on success it is fsynced and renamed to
    ``path``, on failure removed. ``OSError`` becomes a one-line :class:`InputError`."""
    target = Path(path)
    if _is_special(target):  # renaming over it would replace a device node
        raise InputError(f"{target}: not a regular file, cannot replace it with one")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(target, e) from None
    tmp = temp_path_for(target)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
            # the mode open() gives a new file (some writers, safetensors' among them, create
            # theirs 0600: a folder others cannot read)
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        kill_point("replace")
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            raise _cannot_write(target, e) from None
        raise
    fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str],
    mode: str = "w",
    *,
    encoding: str | None = "utf-8",
    newline: str | None = "\n",
    opener: Callable[..., IO[Any]] | None = None,
) -> Iterator[IO[Any]]:
    """``with atomic_open(path, "w") as f: ...``: write to a temporary file beside ``path`` and
    move it into place only when the block finishes without an exception.

    ``mode`` is ``"w"`` (text; ``encoding`` and ``newline`` apply) or ``"wb"``. ``opener``
    wraps the binary temp file (e.g. ``lambda f: gzip.GzipFile(fileobj=f, mode="wb")``) and
    must return a binary file object whose ``close`` does not close ``f``.
    """
    if mode not in ("w", "wb", "wt"):
        raise ValueError(f"atomic_open writes files: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as raw:
            inner: IO[Any] = opener(raw) if opener else raw
            try:
                if mode == "wb":
                    yield inner
                else:
                    text = io.TextIOWrapper(inner, encoding=encoding, newline=newline)
                    try:
                        yield text
                    finally:
                        text.flush()
                        text.detach()
            finally:
                if opener:
                    inner.close()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` atomically (see the module docstring)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Replace the file at ``path`` with ``text`` (``\\n`` line ends kept as is) atomically."""
    atomic_write_bytes(path, text.encode(encoding))


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (``\\n`` added) to a log such as ``metrics.jsonl``. A kill can cut only
    this last line, never the lines before it; readers skip a last line that does not parse."""
    data = (line + "\n").encode("utf-8")
    with open(path, "ab") as f:  # the one appending writer (see the module docstring)
        if os.environ.get(KILL_ENV):  # the kill tests: a kill point half-way through the line
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            kill_point("append")
            f.write(data[half:])
        else:
            f.write(data)


_held: dict[Path, list[int]] = {}  # lock file -> [fd, depth]: re-entrant within a process


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``path`` (``.NAME.tmp-<hex>``) to write a folder
    of files into; when the block ends well, the files are fsynced and the folder replaces
    ``path`` as a whole, so a reader (and a writer killed at any point) sees the old folder or
    the complete new one. An existing ``path`` is swapped with the new folder in one rename
    (Linux's ``renameat2(RENAME_EXCHANGE)``) and then removed; where that is missing it is
    renamed to ``.NAME.old`` first, and a writer killed between the two renames leaves it
    there, which the next writer renames back. On failure the temporary folder is removed and
    ``path`` untouched. Held under :func:`output_lock`; what killed writers left beside
    ``path`` (their temporary folders) is removed first."""
    import shutil

    target = Path(path)
    old = target.with_name(f".{target.name}.old")
    with output_lock(target):
        try:
            if old.is_dir() and not os.path.lexists(target):  # a kill between two renames
                os.replace(old, target)
            for left in target.parent.glob(f".{target.name}{TEMP_MARK}*"):
                if _OUR_TEMP.search(left.name) and left.is_dir():
                    shutil.rmtree(left, ignore_errors=True)
            tmp = temp_path_for(target)
            tmp.mkdir()
        except OSError as e:
            raise _cannot_write(target, e) from None
        try:
            yield tmp
            for p in sorted(tmp.rglob("*")):
                if p.is_file():
                    with open(p, "rb") as f:
                        os.fsync(f.fileno())
            fsync_dir(tmp)
            kill_point("replace")
            _swap_into_place(tmp, target, old)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):
                raise _cannot_write(target, e) from None
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # the old folder, after an exchange
        shutil.rmtree(old, ignore_errors=True)


def _swap_into_place(new: Path, target: Path, old: Path) -> None:
    """Put the folder ``new`` at ``target``; the old ``target`` (if any) ends at ``new``
    (exchanged) or ``old`` (renamed aside), to be removed by the caller."""
    import shutil

    if os.path.lexists(target):
        if _exchange(new, target):
            fsync_dir(target.parent)
            return
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        kill_point("replace")
    os.replace(new, target)
    fsync_dir(target.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic rename (Linux 3.15+, glibc 2.28+); False where the system
    or the file system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def lock_file_for(target: str | os.PathLike[str], folder: bool = True) -> Path:
    """Where :func:`output_lock` keeps its lock: ``.NAME.attnlm.lock`` beside the run folder
    or output file ``NAME`` (beside, so that a command refused for bad input never creates
    its output folder); inside the folder for a folder without a parent (``/``)."""
    t = Path(target).absolute()
    if t.parent == t:
        return t / LOCK_NAME
    return t.with_name(f".{t.name}{LOCK_NAME}")


@contextlib.contextmanager
def output_lock(target: str | os.PathLike[str], folder: bool = True) -> Iterator[Path]:
    """Hold an exclusive ``fcntl.flock`` on ``target``'s lock file (see :func:`lock_file_for`;
    missing parent folders are created) while the block runs: one writer per run folder or
    output file (``folder`` says which ``target`` is; both lock the same way). A
    second process is refused with a one-line :class:`InputError` naming the holder's pid. The
    holder deletes the lock file before it lets go, so a command leaves none behind; a process
    that locked a file deleted under it (it opened the file before the holder deleted it)
    sees that the path names another file now and takes the lock again from the path, so two
    processes never hold two files of one output. The kernel releases the lock when the
    holder is killed, so the file such a holder leaves is harmless and reused.
    Re-entrant within one process. Once the lock is taken, the ``.NAME.tmp-*`` files that
    killed writers left in the folder (or beside the file) are deleted. A no-op where
    ``fcntl`` does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield lock_file_for(target, folder)
        return
    lock = lock_file_for(target, folder)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        key = lock.resolve()
    except OSError as e:
        raise _cannot_write(Path(target), e) from None
    if key in _held:
        _held[key][1] += 1
        try:
            yield lock
        finally:
            _held[key][1] -= 1
        return
    fd = _lock_path(key, Path(target), fcntl)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = [fd, 1]
    _remove_temps_of_killed_writers(Path(target), folder)
    try:
        yield lock
    finally:
        del _held[key]
        with contextlib.suppress(OSError):  # still held: nobody can take this file meanwhile
            os.unlink(key)
        os.close(fd)  # releases the flock


def _lock_path(key: Path, target: Path, fcntl: Any) -> int:
    """A descriptor of the lock file ``key`` holding its exclusive ``flock``: the file the path
    names when the lock is taken (a file its holder deleted in between is let go and the path
    opened again). Another holder: a one-line :class:`InputError` naming its pid."""
    while True:
        try:
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # named as the output: the lock file is ours, not the user's
            raise _cannot_write(target, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise InputError(
                f"{target}: another attnlm process (pid {holder}) is writing into it; "
                "wait for it to finish or choose another output"
            ) from None
        mine = os.fstat(fd)
        try:
            now = os.stat(key)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            return fd
        os.close(fd)  # the holder deleted this file as it let go: lock the one there now


@contextlib.contextmanager
def output_locks(folders: tuple[Any, ...] = (), files: tuple[Any, ...] = ()) -> Iterator[None]:
    """:func:`output_lock` on each run folder and output file given (``None`` and ``"-"``,
    standard output, are skipped)."""
    with contextlib.ExitStack() as stack:
        for targets, folder in ((folders, True), (files, False)):
            for t in targets:
                if t is not None and str(t) != "-":
                    stack.enter_context(output_lock(t, folder))
        yield


def _remove_temps_of_killed_writers(target: Path, folder: bool) -> None:
    """What killed writers of ``target`` left (``.NAME.tmp-<16 hex digits>`` files in the run
    folder and its sub-folders, or beside the output file): safe to delete under its lock."""
    if folder:
        if target.is_dir():  # the folder and its sub-folders (a comparison's families)
            for pattern in (f".*{TEMP_MARK}*", f"*/.*{TEMP_MARK}*"):
                for p in target.glob(pattern):
                    if _OUR_TEMP.search(p.name) and p.is_file():
                        with contextlib.suppress(OSError):
                            p.unlink()
    else:
        remove_stale_temps(target.parent, target.name)


def remove_stale_temps(folder: str | os.PathLike[str], name: str | None = None) -> list[Path]:
    """Delete the ``.NAME.tmp-*`` files that killed writers left in ``folder`` (only those of
    ``name`` when given); returns what was removed. Call it only when no other process is
    writing into ``folder``."""
    prefix = f".{name}{TEMP_MARK}" if name else "."
    removed = []
    for p in Path(folder).glob(f"{prefix}*"):
        if TEMP_MARK in p.name and p.is_file():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def read_file_bytes(
    path: str | os.PathLike[str],
    what: str = "file",
    error: type[Exception] = InputError,
    *,
    text: bool = False,
) -> bytes:
    """The bytes of ``path``; a missing or unreadable file raises ``error`` with one line
    naming the file and ``what`` it should have been.

    Reading is bounded: with ``text`` (the file should be text) it stops at the first NUL byte
    or at a line longer than :data:`attnlm.base.textio.MAX_LINE`, so a path to ``/dev/zero`` or a
    binary costs one block, not all memory; without it (a binary format) only regular files are
    read (a device or a pipe has no end to trust)."""
    p = Path(path)
    with file_read_errors(p, what, error):
        if not text:
            if p.exists() and not p.is_dir() and not p.is_file():
                raise error(f"{p}: not a regular file, expected a {what}")
            return p.read_bytes()
        with open(p, "rb") as f:
            return _read_text_bytes(f, p, error)


def _read_text_bytes(f: IO[bytes], p: Path, error: type[Exception]) -> bytes:
    from attnlm.base.textio import MAX_LINE

    chunks: list[bytes] = []
    line, line_start = 1, 0  # the current line's number and offset in the file
    total = 0
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            return b"".join(chunks)
        if not total and chunk.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise error(f"{p}: looks like UTF-16 (byte order mark); save it as UTF-8")
        nul = chunk.find(b"\x00")
        if nul >= 0:
            line += chunk.count(b"\n", 0, nul)
            raise error(f"{p}: contains a NUL character at line {line} (a binary file?)")
        last_nl = chunk.rfind(b"\n")
        if last_nl >= 0:
            line += chunk.count(b"\n")
            line_start = total + last_nl + 1
        total += len(chunk)
        if total - line_start > MAX_LINE + 3:  # + a byte-order mark and a CR
            raise error(
                f"{p}: line {line} is over {MAX_LINE:,} bytes long (the limit is "
                f"{MAX_LINE:,}; is it a text file?)"
            )
        chunks.append(chunk)


def read_file_text(
    path: str | os.PathLike[str],
    what: str = "file",
    error: type[Exception] = InputError,
    *,
    empty_ok: bool = False,
) -> str:
    """:func:`read_file_bytes` read as text by the one strict reader
    (:func:`attnlm.base.textio.decode_text`; empty only with ``empty_ok``); what is wrong raises
    ``error`` (one line, naming ``what`` unless it is a plain file)."""
    from attnlm.base.textio import decode_text

    data = read_file_bytes(path, what, error, text=True)
    try:
        return decode_text(data, str(path), empty_ok=empty_ok)
    except InputError as e:
        raise error(str(e) if what == "file" else f"{e} ({what})") from None
