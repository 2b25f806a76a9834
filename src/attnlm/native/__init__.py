"""The C decode step (``decode_step.c``), compiled on first use with the system's C compiler.

A decoding step of a small model on a CPU is many small tensor calls around products whose
weights are 4 or 8 bits; ``decode_step.c`` does the whole step in one call (see its header).
It is built once per machine into the attnlm cache (``$ATTNLM_CACHE`` or ``~/.cache/attnlm``,
folder ``native/``) with ``cc -O3 -march=native -fopenmp`` (:func:`target_flag`): no
build step at install time, and the code is compiled for the CPU it runs on. Without a
compiler (or with ``ATTNLM_NATIVE=0``) :func:`library` returns None and decoding takes the
PyTorch path, which gives the same numbers up to float rounding; the reason is kept in
:data:`why_not`, and decoding says it once on stderr (:mod:`attnlm.runtime.cstep`). A
compiler without OpenMP (Apple's clang) builds the step on POSIX threads instead (``-pthread``:
the same threads, shares and numbers).

Build switches (environment): ``CC`` the compiler (a command line, default ``cc``),
``ATTNLM_NATIVE_MARCH`` the target CPU (default ``native``; ``x86-64-v2`` is the baseline
the CI also tests), ``ATTNLM_NATIVE_CFLAGS`` extra flags (test builds: the sanitizers').
The compile command, the compiler and the CPU's flags are part of the cached file's name, so
a home folder shared by different machines holds one build per kind of CPU and per switch.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from attnlm.base.fileio import cache_dir, temp_path_for

__all__ = ["build_flags", "default_threads", "library", "why_not"]

SOURCE = Path(__file__).with_name("decode_step.c")
HEADERS = tuple(Path(__file__).with_name(h) for h in ("ggml_blocks.h", "avx2_rows.h", "threads.h"))
MARCH_ENV, CFLAGS_ENV = "ATTNLM_NATIVE_MARCH", "ATTNLM_NATIVE_CFLAGS"
BUILD_SECONDS = 120  # a build with extra flags (CFLAGS_ENV: sanitizers) may take 5 times this

_LIBRARY: ctypes.CDLL | None = None
_TRIED = False
#: why :func:`library` returned None ("" while it has not, or when it did not)
why_not = ""
#: the file :func:`library` loaded (None while none is)
built: Path | None = None


#: what ``platform.machine()`` says on 64-bit ARM (Linux, macOS)
ARM = ("aarch64", "arm64")


def target_flag() -> str:
    """The target CPU: ``-march=$ATTNLM_NATIVE_MARCH`` when set, else this CPU's:
    ``-march=native``; on ARM ``-mcpu=native`` (clang before version 15 refuses
    ``-march=native`` for ARM; GCC and clang both take ``-mcpu=native``), except on macOS,
    where the compiler's own default (Apple's clang: the M1 class) is kept: its
    ``-mcpu=native`` may name an older core. "" for no flag."""
    march = os.environ.get(MARCH_ENV, "").strip()
    if march:
        return f"-march={march}"
    if platform.machine().lower() not in ARM:
        return "-march=native"
    return "" if sys.platform == "darwin" else "-mcpu=native"


def build_flags(openmp: bool = True) -> list[str]:
    """The compile flags: the target CPU (:func:`target_flag`), OpenMP when ``openmp`` (else
    POSIX threads), then ``ATTNLM_NATIVE_CFLAGS``."""
    target = target_flag()
    flags = ["-O3", *([target] if target else []), "-std=gnu11", "-shared", "-fPIC"]
    threads = "-fopenmp" if openmp else "-pthread"
    return [*flags, threads, *shlex.split(os.environ.get(CFLAGS_ENV, ""))]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compilers() -> list[str]:
    """The compilers' command lines to try in turn: ``$CC`` alone, else ``cc`` or ``gcc`` on
    the PATH, on ARM after ``clang`` where it is installed (GCC's aarch64 code moves the
    step's 64-byte vectors through the stack, and decodes at about half the speed)."""
    named = os.environ.get("CC", "").strip()
    if named:
        return [named]
    arm = platform.machine().lower() in ARM
    found = [shutil.which("clang") if arm else None, shutil.which("cc") or shutil.which("gcc")]
    return list(dict.fromkeys(c for c in found if c))


def _compiler() -> str | None:
    """The first of :func:`_compilers`, or None."""
    return next(iter(_compilers()), None)


def _cached(cc: str, flags: list[str]) -> Path:
    """Where the build with these flags lives: a readable tag, then a digest of everything
    the build depends on."""
    texts = [p.read_text(encoding="utf-8") for p in (SOURCE, *HEADERS)]
    key = "\n".join([*texts, cc, " ".join(flags), platform.machine(), _cpu_flags()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = [f for f in flags if f.startswith(("-march=", "-mcpu="))]
    march = target[0].split("=", 1)[1] if target else "default"
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", march)[:32] + ("" if "-fopenmp" in flags else "-pt")
    return cache_dir() / "native" / f"decode_step-{tag}-{digest}.so"


def _compile(cc: str, flags: list[str], path: Path) -> None:
    """Compile the source into ``path``; OSError with the compiler's first line if it fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)  # beside it, renamed when whole: a killed build leaves no .so
    try:
        cmd = [*shlex.split(cc), *flags, str(SOURCE), "-o", str(tmp), "-lm"]
        limit = BUILD_SECONDS * (5 if os.environ.get(CFLAGS_ENV) else 1)  # instrumented: slower
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        if done.returncode != 0:
            lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
            errors = [ln for ln in lines if "error" in ln.lower()] or lines or ["no message"]
            raise OSError(f"{Path(shlex.split(cc)[0]).name} failed: {errors[0]}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _build(cc: str) -> Path:
    """The compiled library for this source, compiler, flags and CPU (compiled if not
    cached): with OpenMP, or where the compiler cannot, with POSIX threads."""
    with_omp, without = build_flags(), build_flags(openmp=False)
    path, posix = _cached(cc, with_omp), _cached(cc, without)
    if path.is_file():
        return path
    if posix.is_file():  # an earlier process found this compiler without OpenMP
        return posix
    try:
        _compile(cc, with_omp, path)
        return path
    except OSError as first:
        try:
            _compile(cc, without, posix)
        except OSError:
            raise first from None
        return posix


def _build_any(compilers: list[str]) -> Path:
    """:func:`_build` by the first of ``compilers`` that can (ARM's preferred clang failing:
    the system's cc); the last one's error where none can."""
    for cc in compilers[:-1]:
        try:
            return _build(cc)
        except (OSError, subprocess.SubprocessError):
            continue
    return _build(compilers[-1])


def library() -> ctypes.CDLL | None:
    """The loaded C library, or None (the reason in :data:`why_not`); built once per
    process at most."""
    global _LIBRARY, _TRIED, why_not, built
    if os.environ.get("ATTNLM_NATIVE", "1") == "0":
        why_not = "ATTNLM_NATIVE=0"
        return None
    if _TRIED:
        return _LIBRARY
    _TRIED, _LIBRARY, why_not, built = True, None, "", None
    compilers = _compilers()
    if not compilers:
        why_not = "no C compiler found (no cc or gcc on the PATH, CC not set)"
        return None
    program = (shlex.split(compilers[0]) or [""])[0]
    if shutil.which(program) is None:
        why_not = f"no C compiler: CC names {program!r}, which is not a program found"
        return None
    try:
        path = _build_any(compilers)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        why_not = f"the C decode step could not be built: {e}"
        return None
    lib.attnlm_sizes.restype = ctypes.c_int64
    lib.attnlm_sizes.argtypes = [ctypes.c_int64]
    lib.attnlm_decode_step.restype = None
    from attnlm.native import structs

    mismatch = structs.configure(lib)
    if mismatch is not None:  # a stale or foreign build
        why_not = mismatch
        return None
    _LIBRARY, built = lib, path
    return lib


#: the bits of ``attnlm_features``: what the build's instructions include, and ``openmp``
#: when its threads are OpenMP's (else POSIX threads')
FEATURES = ("fma", "f16c", "avx2", "avx512f", "vnni", "openmp")


def features() -> frozenset[str]:
    """What the loaded build's instructions include (empty without a library): a build
    without ``fma`` rounds every product before its sum, as no build of llama.cpp for a CPU
    with FMA does; ``openmp`` for a build whose threads are OpenMP's."""
    lib = library()
    if lib is None:
        return frozenset()
    lib.attnlm_features.restype = ctypes.c_int64
    bits = lib.attnlm_features()
    return frozenset(name for i, name in enumerate(FEATURES) if bits >> i & 1)


def default_threads() -> int:
    """Threads a command runs on when ``--threads`` is not given, for PyTorch and the C step
    alike: every physical core this process may run on (what PyTorch's default would be,
    told without importing it), within the CPUs of the affinity mask (a container or
    ``taskset`` limit), SMT siblings counted once."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus:
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))
