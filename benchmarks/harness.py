"""The one benchmark harness: alternating runs, medians, CPU and wall time, ratios, JSON lines.

Every script under ``benchmarks/`` uses it the same way::

    import harness

    args = harness.parse(ap, quick={"rounds": 1, "steps": 2})   # adds --quick
    harness.set_threads(1)                                       # torch/BLAS threads, explicit
    runs = harness.alternate({"attnlm": ours, "hf": theirs}, rounds=args.rounds)
    harness.report("bert train step", runs, ours="attnlm", peer="hf", target=">= 1.2x")

* ``alternate`` runs the contenders in turn (ours, peer, ours, peer, ...) so that a change
  of load on the machine hits both sides alike; each contender is a callable returning a
  :class:`Sample` (wall and CPU seconds), usually from :func:`time_call` (an in-process call)
  or :func:`time_process` (a whole command, as a user runs it: ``attnlm ngram train ...``
  against ``lmplz ...``; CPU time is the child's user + system time from ``wait4``;
  :func:`run_process` adds the child's peak RSS and its output).
* ``report`` prints one line for people and one JSON line (``{"bench": ...}``) per result:
  medians of wall and CPU seconds per side, ``time_ratio`` = ours / peer (lower is better)
  and ``speedup`` = peer / ours (higher is better), by wall clock and by CPU time.
* ``--quick`` (or ``ATTNLM_BENCH_QUICK=1``, what ``make bench-quick`` sets) swaps in the
  script's small sizes; a peer that is not installed is skipped with one line (:func:`skip`).

Absolute times only mean something on a quiet machine; the ratios of alternating runs are
the figures of record (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

QUICK_ENV = "ATTNLM_BENCH_QUICK"
T = TypeVar("T")


@dataclass(frozen=True)
class Sample:
    """One timed run: wall-clock seconds and CPU seconds (user + system)."""

    wall: float
    cpu: float


def quick_requested(argv: Sequence[str] | None = None) -> bool:
    """True when ``--quick`` is on the command line or ``ATTNLM_BENCH_QUICK`` is set (not 0)."""
    argv = sys.argv[1:] if argv is None else argv
    return "--quick" in argv or os.environ.get(QUICK_ENV, "0") not in ("", "0")


def parse(
    ap: argparse.ArgumentParser,
    quick: Mapping[str, object] | None = None,
    argv: Sequence[str] | None = None,
) -> argparse.Namespace:
    """Parse the script's arguments with a ``--quick`` flag added: in quick mode the values
    of ``quick`` (destination -> value) replace the defaults; options given on the command
    line still win."""
    if not any("--quick" in a.option_strings for a in ap._actions):
        ap.add_argument(
            "--quick",
            action="store_true",
            help=f"small sizes: check the script runs (also ${QUICK_ENV}=1)",
        )
    if quick_requested(argv) and quick:
        ap.set_defaults(**quick)
    args = ap.parse_args(argv)
    args.quick = quick_requested(argv)
    return args


#: ``--simulate``: the environment that makes oneDNN and PyTorch run as a smaller CPU class
#: (AVX-512F without bfloat16 or AMX; AVX2), set before torch loads
SIMULATE = {
    "none": {},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "ATTNLM_NATIVE_MARCH": "x86-64-v3",
    },
}


def add_simulate_argument(ap: argparse.ArgumentParser) -> None:
    """The ``--simulate`` option (a key of :data:`SIMULATE`)."""
    ap.add_argument(
        "--simulate",
        choices=sorted(SIMULATE),
        default="none",
        help="restrict oneDNN/PyTorch as a CPU without bfloat16 (avx512), or as one with AVX2 "
        "and no AVX-512 (avx2; attnlm's C step then built for x86-64-v3)",
    )


def set_threads(n: int = 1) -> None:
    """Fix the number of compute threads: torch's intra-op pool (when torch is installed) and
    the BLAS/OpenMP pools of child processes. Every benchmark calls it, so no timing depends on
    a library's default."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(n)


def time_call(fn: Callable[[], object]) -> Sample:
    """Time one in-process call: wall clock and this process's CPU time (all threads)."""
    return timed(fn)[0]


def timed(fn: Callable[[], T]) -> tuple[Sample, T]:
    """Like :func:`time_call`, and the call's result too."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return Sample(time.perf_counter() - t0, time.process_time() - c0), out


def time_process(
    cmd: Sequence[str],
    *,
    stdin: str | os.PathLike[str] | None = None,
    stdout: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Sample:
    """Time a whole command as a user runs it (start-up, imports and exit included): wall
    clock, and the child's CPU time (user + system, all its threads) from ``wait4``.
    ``stdin``/``stdout``: files to read from / write to; stderr is discarded. A failing command
    raises ``RuntimeError`` naming it."""
    fin = open(stdin, "rb") if stdin else subprocess.DEVNULL  # noqa: SIM115
    fout = open(stdout, "wb") if stdout else subprocess.DEVNULL  # noqa: SIM115
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            list(cmd), stdin=fin, stdout=fout, stderr=subprocess.PIPE, env=env, cwd=cwd
        )
        err = proc.stderr.read() if proc.stderr else b""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        for f in (fin, fout):
            if hasattr(f, "close"):
                f.close()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {proc.returncode}: {tail[0]}")
    return Sample(wall, usage.ru_utime + usage.ru_stime)


@dataclass(frozen=True)
class ProcessRun:
    """One whole command, run by :func:`run_process`: its times, peak resident memory
    (``ru_maxrss`` of that process alone, from ``wait4``) and its standard output."""

    sample: Sample
    peak_rss_mib: float
    stdout: str


def run_process(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> ProcessRun:
    """Like :func:`time_process`, and the child's peak RSS and stdout too (``wait4`` reports
    the resources of that one child, so alternating processes do not mix their peaks). The
    kernel counts a forked child's peak from the caller's RSS at the fork: measure from a
    small process (no torch imported, no model loaded). A failing command raises
    ``RuntimeError`` naming it and the last line of its stderr."""
    import tempfile

    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr,
                                env=env, cwd=cwd)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read().decode(errors="replace"), ferr.read().decode(errors="replace")
    if proc.returncode != 0:
        tail = err.strip().splitlines()[-1:] or ["(no message)"]
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {proc.returncode}: {tail[0]}")
    rss_kib = usage.ru_maxrss  # KiB on Linux
    return ProcessRun(Sample(wall, usage.ru_utime + usage.ru_stime), rss_kib / 1024, out)


def alternate(
    contenders: Mapping[str, Callable[[], Sample]], rounds: int, swap: bool = False
) -> dict[str, list[Sample]]:
    """Run each contender once per round, in turn (ours, peer, ours, peer, ...), ``rounds``
    times; returns every sample per contender. ``swap``: every other round runs them in
    reverse order, so that neither always follows the other (caches, clock boosts)."""
    out: dict[str, list[Sample]] = {name: [] for name in contenders}
    for r in range(rounds):
        names = list(contenders)
        for name in reversed(names) if swap and r % 2 else names:
            out[name].append(contenders[name]())
    return out


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def summarize(
    runs: Mapping[str, Sequence[Sample]], ours: str, peer: str | None = None
) -> dict[str, object]:
    """Medians per side and the ratios of the medians (wall and CPU). ``time_ratio`` is
    ours / peer (lower is better), ``speedup`` peer / ours (higher is better)."""
    out: dict[str, object] = {"runs": len(runs[ours])}
    for name, samples in runs.items():
        out[name] = {
            "wall_s": median(s.wall for s in samples),
            "cpu_s": median(s.cpu for s in samples),
        }
    if peer is not None and peer in runs and runs[peer]:
        mine, theirs = out[ours], out[peer]
        for clock in ("wall", "cpu"):
            a, b = mine[f"{clock}_s"], theirs[f"{clock}_s"]  # type: ignore[index]
            out[f"time_ratio_{clock}"] = a / b if b else float("inf")
            out[f"speedup_{clock}"] = b / a if a else float("inf")
    return out


def emit(record: Mapping[str, object]) -> None:
    """One JSON line on stdout (``{"bench": name, ...}``): the machine-readable result."""
    print(json.dumps(record, sort_keys=False, default=str), flush=True)


def report(
    bench: str,
    runs: Mapping[str, Sequence[Sample]],
    ours: str,
    peer: str | None = None,
    target: str | None = None,
    **extra: object,
) -> dict[str, object]:
    """Print a readable line per contender and the JSON line of the result; returns it."""
    result = {"bench": bench, **summarize(runs, ours, peer), **extra}
    if target:
        result["target"] = target
    for name in runs:
        m = result[name]
        print(f"  {bench}: {name:<12} wall {m['wall_s']:.4f} s  cpu {m['cpu_s']:.4f} s")  # type: ignore[index]
    if "time_ratio_wall" in result:
        print(
            f"  {bench}: {ours} / {peer} time ratio {result['time_ratio_wall']:.2f}x wall, "
            f"{result['time_ratio_cpu']:.2f}x cpu (speed-up {result['speedup_wall']:.2f}x)"
            + (f"; target {target}" if target else "")
        )
    emit(result)
    return result


def skip(bench: str, peer: str, why: str) -> None:
    """Say that a peer is skipped (not installed, no device) in one line, plus its JSON line."""
    print(f"  {bench}: skipping {peer}: {why}")
    emit({"bench": bench, "skipped": peer, "why": why})


def have_module(name: str) -> bool:
    """Whether ``import name`` would find a module (no import is done)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require(bench: str, *modules: str) -> bool:
    """True when every peer module is installed; otherwise one line per missing peer (it is
    skipped) and False: ``if not harness.require("bert", "transformers"): return``."""
    missing = [m for m in modules if not have_module(m)]
    for m in missing:
        skip(bench, m, f"{m} is not installed (pip install -e '.[bench]')")
    return not missing


def which(command: str) -> str | None:
    """The path of an executable on PATH, or None."""
    return shutil.which(command)


def attnlm_command(*args: str) -> list[str]:
    """The ``attnlm`` command as a user runs it, with this interpreter (the same install)."""
    return [sys.executable, "-m", "attnlm", *args]


def machine() -> dict[str, object]:
    """Where the figures come from: CPU, cores, load, Python, torch (when installed)."""
    info: dict[str, object] = {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
    }
    if "torch" in sys.modules:
        info["torch"] = sys.modules["torch"].__version__
    return info


def header(bench: str, **extra: object) -> None:
    """The first lines of a benchmark's output: what runs where (also as a JSON line)."""
    m = machine()
    print(f"{bench}: {m['machine']}, {m['cores']} cores, load {m['load_average']}, "
          f"Python {m['python']}" + (f", torch {m['torch']}" if "torch" in m else ""))  # fmt: skip
    emit({"bench": bench, "machine": m, **extra})
