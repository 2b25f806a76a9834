"""The C step under AddressSanitizer and UndefinedBehaviorSanitizer (docs/reliability.md, "CPU
matrix"): ``decode_step.c`` built with ``-fsanitize=address,undefined`` (through
``ATTNLM_NATIVE_CFLAGS``, a cached build of its own) runs in a Python whose first library is
ASan's runtime (``LD_PRELOAD``): the native equivalence tests, and ``attnlm generate`` on crafted,
truncated and bit-flipped GGUF files (the C engine without PyTorch where the file is one it
takes, the C step inside PyTorch otherwise), each with zero reports. A deliberate overflow shows
that the build is instrumented. The POSIX-threads build (a compiler without OpenMP) runs under
ThreadSanitizer with zero reports. Slow (25 s on an idle 2-core machine, 90 s on a busy one):
.ci/run runs it after make test."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnlm import native

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _runtime() -> str | None:
    """The compiler's ASan runtime (gcc: ``libasan.so``), or None."""
    cc = native._compiler()
    if cc is None or sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    try:
        done = subprocess.run([*cc.split(), "-print-file-name=libasan.so"], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    path = done.stdout.strip()
    return path if os.path.isabs(path) and os.path.isfile(path) else None


RUNTIME = _runtime()
if RUNTIME is None:
    pytestmark = [pytestmark, pytest.mark.skip(reason="no gcc with libasan (Debian: libasan8)")]
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer", "SUMMARY: ")


def sanitized(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        native.CFLAGS_ENV: "-fsanitize=address,undefined -fno-omit-frame-pointer -g",
        "LD_PRELOAD": RUNTIME or "",
        "ASAN_OPTIONS": "detect_leaks=0",  # CPython's own allocations are never freed
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "ATTNLM_NATIVE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")]),
    }
    env.pop(native.MARCH_ENV, None)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def no_reports(done: subprocess.CompletedProcess) -> None:
    said = done.stdout + done.stderr
    found = [line for line in said.splitlines() if line.startswith(REPORTS) or
             any(r in line for r in REPORTS[:2])]  # fmt: skip
    assert not found, "\n".join(found[:20]) + "\n" + said[-3000:]
    assert done.returncode == 0, said[-3000:]


CANARY = """
import ctypes, numpy as np
from attnlm import native
lib = native.library()
assert lib is not None, native.why_not
h = np.zeros(10, np.float32)
print("built:", native.built, flush=True)
lib.attnlm_activate(3, ctypes.c_void_p(h.ctypes.data), 64)  # ReLU over 64 floats: 54 too many
print("not caught", flush=True)
"""


def test_the_sanitized_build_catches_an_overflow():
    done = sanitized(["-c", CANARY], timeout=900)
    assert "built:" in done.stdout, done.stderr[-2000:]
    assert "not caught" not in done.stdout and done.returncode != 0
    assert "heap-buffer-overflow" in done.stderr and "decode_step.c" in done.stderr


def test_the_native_equivalence_tests_pass_with_zero_reports():
    tests = ["tests/native/test_decode_step_c.py", "tests/runtime/test_cstep.py",
             "tests/runtime/test_engine.py", "tests/native/test_ggml_kernels.py",
             "tests/runtime/test_engine_archs.py", "tests/runtime/test_engine_rows.py",
             "tests/runtime/test_engine_gemma.py"]  # fmt: skip
    done = sanitized(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests])
    no_reports(done)
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]


def gguf_files(folder: Path) -> dict[str, bytes]:
    """A tiny valid Llama GGUF file the C engine takes (q8_0), its truncations and bit flips,
    and the crafted cases of tests/hostile_gguf.py where that corpus is present."""
    from attnlm.models.gguf.writer import export_gguf
    from gguf_export_support import tiny_model

    model, tok = tiny_model("llama")
    export_gguf(model, tok, folder / "base.gguf", kind="q8_0", name="sanitizer-base")
    base = (folder / "base.gguf").read_bytes()
    out = {"valid": base}
    try:
        from hostile_gguf import gguf_cases
    except ImportError:
        gguf_cases = None
    if gguf_cases is not None:
        out.update(gguf_cases(base))
    rng = np.random.default_rng(4811)
    for i, cut in enumerate(sorted(rng.integers(24, len(base), size=6))):
        out[f"cut-{i}"] = base[:cut]
    for i in range(8):
        data = bytearray(base)
        for at in rng.integers(8, len(base), size=4):
            data[at] ^= 1 << int(rng.integers(0, 8))
        out[f"flip-{i}"] = bytes(data)
    return out


def test_hostile_gguf_files_through_the_sanitized_c_code(tmp_path):
    files = []
    for name, data in gguf_files(tmp_path).items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        files.append(path)
    done = sanitized(["tests/native/sanitized_generate.py", *map(str, files)])
    no_reports(done)
    results = {Path(line.split()[-1]).stem: line.split()[1:3]
               for line in done.stdout.splitlines() if line.startswith("EXIT ")}  # fmt: skip
    assert len(results) == len(files), done.stdout[-2000:]
    assert results["valid"] == ["0", "c-engine"]  # the C engine ran, sanitized
    assert all(code in ("0", "2") for code, _ in results.values()), results
    assert sum(code == "2" for code, _ in results.values()) >= len(files) // 2  # most refused


RACES = """
import json, sys
import numpy as np
from pathlib import Path
from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.runtime.engine_gguf import open_engine
lib = native.library()
assert lib is not None, native.why_not
assert "openmp" not in native.features() and b"__tsan_func_entry" in native.built.read_bytes()
here = Path("tests/fixtures/gguf_arch")
for name in ("gemma3", "qwen3moe"):
    rec = json.loads((here / "llamacpp.json").read_text())["archs"][name]["Q4_K_M"]
    for threads in (2, 3):
        engine = open_engine(GGUFFile(here / f"{name}-Q4_K_M.gguf"), None, threads)
        engine.reset(1)
        got = engine.feed(np.asarray([rec["prompt"]]))[0]
        for _ in range(3):
            got = engine.feed(np.asarray([[int(got[-1].argmax())]]))
print("decoded", flush=True)
"""


def test_the_posix_threads_build_has_no_data_race(tmp_path):
    """The build of a compiler without OpenMP (its teams of POSIX threads and spinning
    barrier) under ThreadSanitizer: a Gemma 3 fixture's prompt and steps on 2 and 3 threads
    (every product kind, the attention, the soft-cap), and a Qwen3-MoE one's (the routing,
    the rows gathered per expert by one thread, each expert's products), with zero reports.
    (A barrier that lets threads through at once is reported: a race in the activations'
    quantization.) Built in a process of its own: the compiler does not run under the
    sanitizer's preloaded runtime."""
    cc = native._compiler()
    tsan = subprocess.run([*cc.split(), "-print-file-name=libtsan.so"], capture_output=True,
                          text=True, timeout=30).stdout.strip()  # fmt: skip
    if not (os.path.isabs(tsan) and os.path.isfile(tsan)):
        pytest.skip("no gcc with libtsan (Debian: libtsan2)")
    from test_build_matrix import CLANG_WITHOUT_OPENMP, fake_cc

    fake = fake_cc(tmp_path, CLANG_WITHOUT_OPENMP)  # the compiler without OpenMP: POSIX threads
    env = {**os.environ, "CC": fake, native.CFLAGS_ENV: "-fsanitize=thread -g",
           "ATTNLM_NATIVE": "1", "ATTNLM_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
    env.pop(native.MARCH_ENV, None)
    build = "from attnlm import native; assert native._build(native._compiler())"
    subprocess.run([sys.executable, "-c", build], env=env, check=True, timeout=300)
    env |= {"LD_PRELOAD": tsan, "TSAN_OPTIONS": "halt_on_error=1 report_signal_unsafe=0"}
    done = subprocess.run([sys.executable, "-c", RACES], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0 and "decoded" in done.stdout, done.stderr[-3000:]
