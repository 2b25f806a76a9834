"""The C step built by a compiler without OpenMP (Apple's clang: its POSIX threads and spinning
barrier, ``decode_step.c``'s ``run_team``) against the OpenMP build, and against one thread
(what such a build ran on before): ``attnlm generate`` on a GGUF file, whole process against
whole process, in turn, the same threads. The compiler without OpenMP is simulated by a ``cc``
that refuses ``-fopenmp`` and runs the real one otherwise (as tests/native/test_build_matrix.py
does); both builds are made before anything is timed.

    .venv/bin/python benchmarks/bench_posix_threads.py [--model qwen2.5-coder-0.5b-instruct]
        [--threads 2] [--new 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import bench_local_llm as local  # whole-process runs and their table
import harness  # benchmarks/harness.py: JSON lines

REFUSES_OPENMP = """#!/bin/sh
for a in "$@"; do case "$a" in -fopenmp*)
  echo "clang: error: unsupported option '-fopenmp'" >&2; exit 1;; esac; done
exec {cc} "$@"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = harness.parse(ap, quick={"rounds": 1, "new": 8})
    real = shutil.which("cc") or shutil.which("gcc")
    if real is None:
        raise SystemExit("no C compiler (cc or gcc) on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "cc"
        fake.write_text(REFUSES_OPENMP.format(cc=real))
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        prompt = local.prompt_text(32)

        def cmd(cc: str, threads: int, new: int = args.new) -> list[str]:
            return ["env", f"CC={cc}", *local.attnlm_cmd(args.model, prompt, new, threads, None)]

        cmds = {"OpenMP": cmd(real, args.threads), "POSIX threads": cmd(str(fake), args.threads),
                "POSIX threads, 1 thread": cmd(str(fake), 1)}  # fmt: skip
        for cc in (real, str(fake)):  # both libraries built before anything is timed
            subprocess.run(cmd(cc, 1, 1), check=True, capture_output=True)
        label = f"{args.model}, {args.threads} threads, {args.new} new tokens"
        summary = local.compare_processes(label, cmds, args.rounds)
    key = "decode_tokens_per_second"
    local.say("POSIX threads / OpenMP, decode", local.ratio(summary, "POSIX threads", "OpenMP",
              key), ">= 0.9x")  # fmt: skip
    local.say(
        f"POSIX threads {args.threads} / 1 thread, decode",
        local.ratio(summary, "POSIX threads", "POSIX threads, 1 thread", key),
        "> 1x",
    )
    harness.emit({"bench": "posix_threads", "model": args.model, "threads": args.threads})


if __name__ == "__main__":
    main()
