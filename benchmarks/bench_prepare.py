"""Preparing a large corpus (issue 21): peak memory at two corpus sizes, and byte-level BPE
encoding speed with 1 and 2 workers against nanoGPT's recipe, in one run.

The corpus is generated (never committed; deleted afterwards) from the built-in Shakespeare
corpus with varied text, so no block repeats another verbatim: each 4 MiB block is lines
drawn at random (seeded) from the plays, every other block passed through a random vowel
substitution (new words), with a random number on one line in five.

Each measurement runs in a child process (``resource.getrusage``: ``ru_maxrss`` of the child
itself and of its largest worker), on the same corpus file and the same tokenizer: a
byte-level BPE of 4,096 ids (``gpt2`` pattern) trained on the built-in corpus and passed as a
file, as in the issue's table (engine: tiktoken with our ranks).

* ours: ``attnlm.train.data.prepare`` end to end (for a text file and a given byte-level BPE,
  one read: SHA-256 fingerprint, byte ranges encoded by the workers, the split placed
  afterwards, train.bin and val.bin written), ``workers`` 1 or 2;
* nanoGPT's recipe: ``tiktoken.Encoding`` with the same ranks and pattern, ``encode_ordinary``
  in a ``multiprocessing.Pool(2)`` over 1 MiB pieces of the file (cut at line starts, as ours,
  so the ids are comparable), ``np.uint16`` arrays written in order to one file. The ids of
  both are checked equal.

Besides wall-clock ratios (meaningful on idle cores only) it prints the same ratios in CPU
seconds of all processes (what the work costs, steady on a shared machine).

    PYTHONPATH=src python benchmarks/bench_prepare.py [--gb 0.5 2] [--dir /tmp] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick

VOWELS = "aeiou"


def generate(path: Path, size: int, seed: int = 0) -> None:
    """``size`` bytes of varied text made from the built-in corpus (see the module)."""
    import numpy as np

    from attnlm.data.corpus import default_corpus

    lines = np.array([ln for ln in default_corpus().splitlines() if ln.strip()], dtype=object)
    rng = np.random.default_rng(seed)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        block = 0
        while written < size:
            picked = lines[rng.integers(0, len(lines), 60_000)]
            numbered = rng.random(len(picked)) < 0.2
            numbers = rng.integers(0, 10**6, len(picked))
            text = "\n".join(
                f"{s} {n}" if k else s for s, k, n in zip(picked, numbered, numbers)
            ) + ("\n\n" if block % 3 else "\n")
            if block % 2:
                perm = "".join(rng.permutation(list(VOWELS)))
                text = text.translate(str.maketrans(VOWELS + VOWELS.upper(),
                                                    perm + perm.upper()))  # fmt: skip
            data = text.encode("utf-8")[: size - written]
            f.write(data.decode("utf-8", errors="ignore"))
            written += len(data)
            block += 1
        f.write("\n")


CHILD_OURS = r"""
import json, resource, sys, time
from pathlib import Path
def cpu():
    a, b = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
if __name__ == "__main__":  # worker processes (spawn) run this file's top level again
    from attnlm.train.config import TrainConfig
    from attnlm.train.data import prepare
    text, run, tokenizer, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    t0 = time.perf_counter()
    data = prepare(Path(run), TrainConfig(text=text, tokenizer=tokenizer, workers=workers,
                                          progress=False))
    print(json.dumps({"seconds": time.perf_counter() - t0,
                      "tokens": data.train.n_tokens + data.val.n_tokens,
                      "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                      "cpu": cpu()}))
"""

CHILD_NANOGPT = r"""
import json, multiprocessing as mp, re, resource, sys, time
import numpy as np, tiktoken
from attnlm.tokenizers import load
from attnlm.tokenizers.bpe import split_pattern
text, out, tokenizer = sys.argv[1:4]
tok = load(tokenizer)
enc = None
def cpu():
    a, b = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
def init():
    global enc
    enc = tiktoken.Encoding("bench", pat_str=split_pattern(tok.pattern),
                            mergeable_ranks=tok.ranks, special_tokens={})
def process(piece):
    return np.array(enc.encode_ordinary(piece), dtype=np.uint16)
cut = re.compile(r"\n(?=\S)")
def pieces():
    rest = ""
    with open(text, encoding="utf-8") as f:
        while block := f.read(1 << 20):
            rest += block
            m = None
            for m in cut.finditer(rest, max(len(rest) - (1 << 16), 0)):
                pass
            if m is not None:
                yield rest[: m.end()]
                rest = rest[m.end():]
    if rest:
        yield rest
if __name__ == "__main__":
    t0 = time.perf_counter()
    n = 0
    with mp.get_context("fork").Pool(2, initializer=init) as pool, open(out, "wb") as f:
        for arr in pool.imap(process, pieces(), chunksize=1):
            arr.tofile(f)
            n += len(arr)
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": n,
                      "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                      "cpu": cpu()}))
"""


def child(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        r = subprocess.run([sys.executable, f.name, *args], capture_output=True, text=True,
                           env=env)  # fmt: skip
    finally:
        os.unlink(f.name)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def ours(corpus: Path, tmp: Path, tokenizer: Path, workers: int) -> dict:
    run = tmp / f"run{workers}"
    shutil.rmtree(run, ignore_errors=True)  # a folder left by an earlier round would be reused
    out = child(CHILD_OURS, str(corpus), str(run), str(tokenizer), str(workers))
    out["ids"] = [run / "train.bin", run / "val.bin"]
    return out


def same_ids(a: list[Path], b: Path) -> bool:
    """Whether the concatenated files ``a`` hold the bytes of ``b`` (read in blocks)."""
    with open(b, "rb") as fb:
        for path in a:
            with open(path, "rb") as fa:
                while block := fa.read(1 << 24):
                    if fb.read(len(block)) != block:
                        return False
        return not fb.read(1)


def mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, nargs="+", default=[0.5, 2.0])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rounds", type=int, default=1, help="speed rounds on the largest corpus")
    args = harness.parse(ap, quick={"gb": [0.002], "rounds": 1})
    if not harness.require("prepare", "tiktoken"):
        return
    harness.set_threads(1)
    from attnlm.data.corpus import default_corpus
    from attnlm.tokenizers import BPETokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench_prepare-", dir=args.dir))
    try:
        tokenizer = tmp / "bpe4096.json"
        BPETokenizer.train(default_corpus(), 4096, pattern="gpt2").save(tokenizer)
        print(f"machine: {os.cpu_count()} cores; tokenizer: byte-level BPE 4,096 (gpt2)")
        for gb in args.gb:
            corpus = tmp / "corpus.txt"
            t0 = time.perf_counter()
            generate(corpus, int(gb * 1e9))
            size = corpus.stat().st_size
            print(f"\ncorpus {size / 1e9:.2f} GB generated in {time.perf_counter() - t0:.0f} s")
            runs: dict[str, list[dict]] = {"ours, 2 workers": [], "nanoGPT recipe, 2 processes":
                                           [], "ours, 1 worker": []}  # fmt: skip
            rounds = args.rounds if gb == max(args.gb) else 0
            two = ours(corpus, tmp, tokenizer, 2)
            runs["ours, 2 workers"].append(two)
            for _ in range(rounds):  # alternating: peer, ours 1, ours 2 (after the first)
                peer = child(CHILD_NANOGPT, str(corpus), str(tmp / "nano.bin"), str(tokenizer))
                runs["nanoGPT recipe, 2 processes"].append(peer)
                assert same_ids(two["ids"], tmp / "nano.bin"), "ids differ from the recipe's"
                (tmp / "nano.bin").unlink()
                runs["ours, 1 worker"].append(ours(corpus, tmp, tokenizer, 1))
                if len(runs["ours, 2 workers"]) < rounds:
                    runs["ours, 2 workers"].append(ours(corpus, tmp, tokenizer, 2))
            load = os.getloadavg()[0]
            print(f"(load average {load:.1f} on {os.cpu_count()} cores after these runs)")
            print(
                "| run | seconds (median) | MB/s | CPU seconds (all processes) | "
                "peak RSS: process | largest worker |"
            )
            print("|---|---|---|---|---|---|")
            med, cpus = {}, {}
            for name, rs in runs.items():
                if not rs:
                    continue
                secs = sorted(r["seconds"] for r in rs)[len(rs) // 2]
                med[name] = secs
                cpu = cpus[name] = sorted(r["cpu"] for r in rs)[len(rs) // 2]
                print(f"| {name} | {secs:.1f} | {size / secs / 1e6:.1f} | {cpu:.1f} | "
                      f"{mib(max(r['self_kib'] for r in rs))} | "
                      f"{mib(max(r['worker_kib'] for r in rs))} |")  # fmt: skip
            if len(med) == 3:
                t2 = med["ours, 2 workers"]
                print(f"2 workers / 1 worker: {med['ours, 1 worker'] / t2:.2f}x; "
                      f"2 workers / nanoGPT recipe: {med['nanoGPT recipe, 2 processes'] / t2:.2f}x "
                      f"(ids identical)")  # fmt: skip
                c1, c2 = cpus["ours, 1 worker"], cpus["ours, 2 workers"]
                peer = cpus["nanoGPT recipe, 2 processes"]
                print(f"CPU seconds: 2 workers / 1 worker: {c2 / c1:.3f}; ours (2 workers) / "
                      f"nanoGPT recipe: {c2 / peer:.3f} (below 1: ours costs less); bound on "
                      f"two idle cores: {2 * c1 / c2:.2f}x one worker, {peer / c2:.2f}x the "
                      "recipe")  # fmt: skip
                harness.emit({"bench": f"prepare {size / 1e9:.2f} GB", "clock": "wall",
                              "seconds": med, "cpu_s": cpus,
                              "speedup_2_vs_1_worker": med["ours, 1 worker"] / t2,
                              "speedup_vs_recipe": med["nanoGPT recipe, 2 processes"] / t2,
                              "targets": ">= 1.8x, >= 1.0x"})  # fmt: skip
            corpus.unlink()
            for run in tmp.glob("run*"):
                shutil.rmtree(run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
