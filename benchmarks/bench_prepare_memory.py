"""Peak memory of preparing a run's data (issue 15): tokenizing a large corpus into train.bin /
val.bin (``attnlm.train.data.prepare``).

Builds a corpus of ``--mb`` megabytes by repeating the default corpus into a temporary file
(deleted afterwards, never committed), then runs two child processes with the same imports:
one that only imports (the interpreter's baseline) and one that prepares the data; each reports
its peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``). The goal: the peak
above the baseline stays under twice the token files' size.

    PYTHONPATH=src python benchmarks/bench_prepare_memory.py [--mb 200] [--tokenizer char|FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from attnlm.train.config import TrainConfig
from attnlm.train.data import prepare
text, run, tokenizer, do = sys.argv[1:5]
t0 = time.perf_counter()
out = {}
if do == "1":
    data = prepare(Path(run), TrainConfig(text=text, tokenizer=tokenizer))
    out = {"tokens": data.train.n_tokens + data.val.n_tokens, "dtype": data.train.dtype}
out["seconds"] = time.perf_counter() - t0
out["peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
"""


def child(text: Path, run: Path, tokenizer: str, do: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    args = [sys.executable, "-c", CHILD, str(text), str(run), tokenizer, "1" if do else "0"]
    r = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--tokenizer", default="char", help="char or a saved tokenizer file")
    args = harness.parse(ap, quick={"mb": 2})
    from attnlm.data.corpus import default_corpus

    base = default_corpus().encode("utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        with open(corpus, "wb") as f:
            for _ in range(args.mb * 2**20 // len(base) + 1):
                f.write(base)
            f.truncate(args.mb * 2**20)
            f.seek(args.mb * 2**20 - 1)
            f.write(b"\n")
        size = corpus.stat().st_size
        t0 = time.perf_counter()
        baseline = child(corpus, Path(tmp) / "run", args.tokenizer, False)
        prep = child(corpus, Path(tmp) / "run", args.tokenizer, True)
        wall = time.perf_counter() - t0
        token_bytes = sum((Path(tmp) / "run" / n).stat().st_size for n in ("train.bin", "val.bin"))
    above = (prep["peak_kib"] - baseline["peak_kib"]) * 1024
    print(
        f"prepare {size / 2**20:.0f} MiB corpus ({args.tokenizer}): {prep['tokens']:,} tokens "
        f"({prep['dtype']}), token files {token_bytes / 2**20:.0f} MiB; peak RSS "
        f"{prep['peak_kib'] / 1024:.0f} MiB, baseline {baseline['peak_kib'] / 1024:.0f} MiB, "
        f"above baseline {above / 2**20:.0f} MiB = {above / token_bytes:.2f}x the token files "
        f"({above / size:.2f}x the corpus); prepare {prep['seconds']:.1f} s (wall {wall:.0f} s)"
    )
    harness.emit({"bench": "prepare-memory", "corpus_mib": size / 2**20,
                  "above_baseline_mib": above / 2**20, "of_token_files": above / token_bytes,
                  "target": "< 2x the token files", "prepare_s": prep["seconds"]})  # fmt: skip


if __name__ == "__main__":
    main()
