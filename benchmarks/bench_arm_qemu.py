"""A proxy for decoding speed on 64-bit ARM where no ARM machine is at hand: attnlm's C engine
and llama.cpp's ``llama-bench``, both built for aarch64 and run under qemu-user on this
machine, one thread, tokens per second of decoding (``tg``), in turn. Emulation changes every
instruction's cost (an sdot is a call into qemu, a plain add is not), so only large ratios
mean something: the proxy found the generic 16-lane code's ~7x gap, not a 10% one (checked
on x86: attnlm and llama.cpp built for x86-64-v3 gave 1.31x under ``qemu-x86_64`` where the
native run gives 1.63x, docs/benchmarks.md).

Needs .ci/arm_python.sh's aarch64 Python (``--arm-python``), the cross compilers
(``aarch64-linux-gnu-gcc`` and ``-g++``, clang) and llama.cpp's source of the installed
llama-cpp-python version (downloaded from PyPI once and built for aarch64 with cmake into
``--build``; about 10 minutes on 2 cores).

    .venv/bin/python benchmarks/bench_arm_qemu.py --arm-python /tmp/attnlm-arm/python
        [--model gemma3-270m] [--tokens 8] [--rounds 2] [--compiler clang|gcc]
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness  # benchmarks/harness.py: JSON lines

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "src" / "attnlm" / "native" / "decode_step.c"
TARGET = "armv8.2-a+dotprod+fp16"  # Apple M1, Graviton 2, Raspberry Pi 5 have these
COMPILERS = {"clang": ["clang", "--target=aarch64-linux-gnu", "-pthread"],
             "gcc": ["aarch64-linux-gnu-gcc", "-fopenmp"]}  # fmt: skip
DECODE = """
import ctypes, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.native import structs
from attnlm.runtime.engine_gguf import open_engine
lib = ctypes.CDLL(sys.argv[2])
assert structs.configure(lib) is None
native._TRIED, native._LIBRARY, native.built = True, lib, sys.argv[2]
engine = open_engine(GGUFFile(sys.argv[3]), None, 1)
engine.reset(1)
logits = engine.feed(np.asarray([[2]]))
start = time.perf_counter()
for _ in range(int(sys.argv[4])):
    logits = engine.feed(np.asarray([[int(logits[-1].argmax())]]))
print(int(sys.argv[4]) / (time.perf_counter() - start))
"""


def model_path(name: str) -> str:
    if Path(name).is_file():
        return name
    sys.path.insert(0, str(ROOT / "src"))
    from attnlm.data.pretrained import PRETRAINED, pretrained_path

    spec = PRETRAINED[name]  # a file joined from several wheels is spec.joined
    names = [spec.joined.name] if spec.joined else []
    return str(pretrained_path(name) / [*names, *spec.files][0])


def build_llama_bench(build: Path) -> Path:
    """llama.cpp's llama-bench for aarch64 (static), from the installed llama-cpp-python's
    sdist; built once into ``build``."""
    exe = build / "bin" / "llama-bench"
    if exe.is_file():
        return exe
    import importlib.metadata

    version = importlib.metadata.version("llama_cpp_python")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"llama_cpp_python=={version}", "-d", tmp],
                       check=True)  # fmt: skip
        subprocess.run(["tar", "-xzf", f"{tmp}/llama_cpp_python-{version}.tar.gz", "-C", tmp],
                       check=True)  # fmt: skip
        src = f"{tmp}/llama_cpp_python-{version}/vendor/llama.cpp"
        subprocess.run(["cmake", "-S", src, "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                        "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
                        "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++", "-DGGML_NATIVE=OFF",
                        f"-DGGML_CPU_ARM_ARCH={TARGET}", "-DBUILD_SHARED_LIBS=OFF",
                        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                        "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF"],
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "-j", "2"],
                       check=True, capture_output=True)  # fmt: skip
    return exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arm-python",
        default=str(Path(tempfile.gettempdir()) / "attnlm-arm" / "python"),
        help="the command .ci/arm_python.sh printed (default: .ci/run's)",
    )
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compiler", choices=sorted(COMPILERS), default="clang")
    ap.add_argument("--build", default=str(Path(tempfile.gettempdir()) / "llama-arm"))
    args = harness.parse(ap, quick={"rounds": 1, "tokens": 2})
    missing = [t for t in ("qemu-aarch64", "aarch64-linux-gnu-g++", "cmake",
                           shlex.split(args.arm_python)[0]) if not shutil.which(t)]  # fmt: skip
    if missing:
        print(f"skipping: {', '.join(missing)} not found (.ci/arm_python.sh DIR installs them)")
        return
    path = model_path(args.model)
    bench = build_llama_bench(Path(args.build))
    root = Path(shlex.split(args.arm_python)[0]).parent / "root"  # .ci/arm_python.sh's layout
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "decode_step.so"
        subprocess.run([*COMPILERS[args.compiler], f"-march={TARGET}", "-O3", "-std=gnu11",
                        "-shared", "-fPIC", str(NATIVE), "-o", str(lib), "-lm"], check=True,
                       capture_output=True)  # fmt: skip
        ours, theirs = [], []
        for _ in range(args.rounds):
            out = subprocess.run([*shlex.split(args.arm_python), "-c", DECODE, str(ROOT / "src"),
                                  str(lib), path, str(args.tokens)], check=True,
                                 capture_output=True, text=True)  # fmt: skip
            ours.append(float(out.stdout.split()[-1]))
            out = subprocess.run(["qemu-aarch64", "-L", str(root), str(bench), "-m", path, "-p",
                                  "0", "-n", str(args.tokens), "-t", "1", "-r", "1"],
                                 check=True, capture_output=True, text=True)  # fmt: skip
            theirs.append(float(re.findall(r"\|\s*([\d.]+) ± [\d.]+ \|", out.stdout)[-1]))
    a, b = max(ours), max(theirs)
    print(
        f"{args.model}, {args.compiler}, one thread, under qemu-aarch64: attnlm {a:.2f} tok/s,"
        f" llama.cpp {b:.2f} tok/s, ratio {a / b:.2f}x (a proxy: see the docstring)"
    )
    harness.emit({"bench": "arm_qemu", "model": args.model, "compiler": args.compiler,
                  "attnlm": a, "llama_cpp": b, "ratio": a / b})  # fmt: skip


if __name__ == "__main__":
    main()
