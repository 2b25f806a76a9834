"""The C decode step (``decode_step.c``), compiled on first use with the system's C compiler.

A decoding step of a small model on a CPU is many small tensor calls around products whose
weights are 4 or 8 bits; ``decode_step.c`` does the whole step in one call (see its header).
It is built once per machine into the attnlm cache (``$ATTNLM_CACHE`` or ``~/.cache/attnlm``,
folder ``native/``) with ``cc -O3 -march=native -fopenmp``: no build step at install time, and
the code is compiled for the CPU it runs on. Without a compiler (or with ``ATTNLM_NATIVE=0``)
:func:`library` returns None and decoding takes the PyTorch path, which gives the same numbers
up to float rounding; the reason is kept in :data:`why_not`, and decoding says it once on
stderr (:mod:`attnlm.runtime.cstep`).

The library's compile command and the CPU's flags are part of the cached file's name, so a
home folder shared by different machines holds one build per kind of CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

from attnlm.base.fileio import cache_dir, temp_path_for

__all__ = ["default_threads", "library", "why_not"]

SOURCE = Path(__file__).with_name("decode_step.c")
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fopenmp", "-shared", "-fPIC")
BUILD_SECONDS = 120

_LIBRARY: ctypes.CDLL | None = None
_TRIED = False
#: why :func:`library` returned None ("" while it has not, or when it did not)
why_not = ""


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(cc: str) -> Path:
    """The compiled library for this source, compiler and CPU (compiled if not cached)."""
    key = "\n".join([SOURCE.read_text(encoding="utf-8"), cc, " ".join(FLAGS), platform.machine(),
                     _cpu_flags()])  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = cache_dir() / "native" / f"decode_step-{digest}.so"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)  # beside it, renamed when whole: a killed build leaves no .so
    try:
        cmd = [cc, *FLAGS, str(SOURCE), "-o", str(tmp), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_SECONDS)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise OSError(f"{Path(cc).name} failed: {first}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def library() -> ctypes.CDLL | None:
    """The loaded C library, or None (the reason in :data:`why_not`); built once per
    process at most."""
    global _LIBRARY, _TRIED, why_not
    if os.environ.get("ATTNLM_NATIVE", "1") == "0":
        why_not = "ATTNLM_NATIVE=0"
        return None
    if _TRIED:
        return _LIBRARY
    _TRIED = True
    cc = _compiler()
    if cc is None:
        why_not = "no C compiler (cc) found"
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc)))
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
    _LIBRARY = lib
    return lib


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
