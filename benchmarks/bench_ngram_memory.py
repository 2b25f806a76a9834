"""``attnlm ngram train --memory`` on a generated corpus larger than the cap: peak RSS, time,
and the ARPA file against the in-memory path on a subset where both fit.

Corpus (issue 24): sentences drawn at random from the built-in Shakespeare corpus
(``attnlm.data.corpus.load_text()``, split with attnlm's word tokenizer), each word replaced
with probability ``--substitute`` by a random vocabulary word or, with probability
``--numbers``, by a random number below 1,000,000, and one random pair of neighbouring words
swapped in a quarter of the sentences; so the corpus is never one text repeated and its
distinct n-grams keep growing with its size. Generated in numpy batches (seeded) to
``--size`` bytes.

Steps, each a separate ``attnlm ngram train --order 5`` process whose peak RSS is read from
``os.wait4`` (ru_maxrss of that child alone):

1. subset (the first ``--subset`` bytes): in memory, then ``--memory`` with the benchmark's
   cap and with a small cap (several shards spill); the three ARPA files must be identical;
2. the whole corpus with ``--memory`` (default 2G): wall time, peak RSS, n-grams per order,
   ARPA size. Generated and written files are deleted at the end (``--keep`` keeps them).

Run: ``.venv/bin/python benchmarks/bench_ngram_memory.py --size 1G --memory 2G``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import filecmp  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import harness  # noqa: E402  (benchmarks/harness.py: runs, medians, ratios, --quick)
from attnlm.data.corpus import load_text  # noqa: E402
from attnlm.ngram.bounded import parse_memory  # noqa: E402
from attnlm.tokenizers.word import split_words  # noqa: E402


def generate(path: Path, size: int, substitute: float, numbers: float, seed: int = 0) -> int:
    """Write about ``size`` bytes of generated sentences to ``path``; returns the words."""
    sents = [s for s in (split_words(line) for line in load_text(None).splitlines()) if s]
    vocab = sorted({w for s in sents for w in s})
    index = {w: i for i, w in enumerate(vocab)}
    n_num = 1_000_000
    table = np.array(vocab + [str(i) for i in range(n_num)], dtype=object)
    lengths = np.array([len(s) for s in sents])
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    flat = np.array([index[w] for s in sents for w in s], dtype=np.int64)
    rng = np.random.default_rng(seed)
    written = words = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            pick = rng.integers(0, len(sents), min(200_000, max(1000, size // 40)))  # ~40 B each
            lens = lengths[pick]
            ends = np.cumsum(lens)
            offs = np.repeat(starts[pick] - (ends - lens), lens) + np.arange(ends[-1])
            ids = flat[offs]
            r = rng.random(len(ids))
            sub = r < substitute
            ids[sub] = rng.integers(0, len(vocab), int(sub.sum()))
            num = (r >= substitute) & (r < substitute + numbers)
            ids[num] = len(vocab) + rng.integers(0, n_num, int(num.sum()))
            # swap one neighbouring pair in a quarter of the sentences (of 2+ words)
            sw = (rng.random(len(pick)) < 0.25) & (lens >= 2)
            at = (ends - lens)[sw] + (rng.random(int(sw.sum())) * (lens[sw] - 1)).astype(np.int64)
            ids[at], ids[at + 1] = ids[at + 1], ids[at].copy()
            toks = table[ids]
            lines = [" ".join(toks[e - n : e]) for e, n in zip(ends, lens)]
            data = "\n".join(lines) + "\n"
            f.write(data)
            written += len(data.encode("utf-8"))
            words += len(ids)
    return words


def run_child(args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GiB, stderr) of one ``attnlm`` process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlm", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"attnlm {' '.join(args)} failed:\n{err}")
    return wall, usage.ru_maxrss / (1 << 20), err  # ru_maxrss is in KiB on Linux


def first_bytes(src: Path, dst: Path, n: int) -> None:
    with open(src, "rb") as f:
        data = f.read(n)
    dst.write_bytes(data[: data.rfind(b"\n") + 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G", help="corpus size (default 1G)")
    ap.add_argument("--memory", default="2G", help="the --memory cap (default 2G)")
    ap.add_argument("--subset", default="40M", help="subset compared with the in-memory path")
    ap.add_argument("--small-cap", default="16M", help="a cap that spills shards on the subset")
    ap.add_argument("--order", type=int, default=5)
    ap.add_argument("--substitute", type=float, default=0.02)
    ap.add_argument("--numbers", type=float, default=0.01)
    ap.add_argument("--tmp", default=None, help="folder for the corpus and outputs")
    ap.add_argument("--keep", action="store_true")
    args = harness.parse(
        ap, quick={"size": "1M", "subset": "256K", "small_cap": "1M", "memory": "8M"}
    )

    harness.set_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench_ngram_memory_", dir=args.tmp))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    free = shutil.disk_usage(tmp).free
    print(f"free disk at {tmp}: {free / 2**30:.1f} GiB")
    order = str(args.order)
    try:
        t0 = time.perf_counter()
        corpus = tmp / "corpus.txt"
        words = generate(corpus, parse_memory(args.size), args.substitute, args.numbers)
        size = corpus.stat().st_size
        print(f"corpus: {size / 2**30:.2f} GiB, {words:,} words, generated in "
              f"{time.perf_counter() - t0:.0f} s")  # fmt: skip

        subset = tmp / "subset.txt"
        first_bytes(corpus, subset, parse_memory(args.subset))
        print(f"\nsubset: first {subset.stat().st_size / 2**20:.1f} MiB")
        runs = {
            "in memory": [],
            f"--memory {args.memory}": ["--memory", args.memory],
            f"--memory {args.small_cap}": ["--memory", args.small_cap],
        }
        outs = []
        for name, extra in runs.items():
            out = tmp / f"subset{len(outs)}.arpa"
            wall, rss, err = run_child(
                ["ngram", "train", "-o", order, "--text", str(subset), "--arpa", str(out), *extra]
            )
            shards = [line.strip() for line in err.splitlines() if "shard" in line]
            print(f"  {name:>16}: {wall:7.1f} s, peak RSS {rss:.2f} GiB  {' '.join(shards)}")
            outs.append(out)
        same = all(filecmp.cmp(outs[0], o, shallow=False) for o in outs[1:])
        print(f"  ARPA files identical: {same} ({outs[0].stat().st_size / 2**20:.0f} MiB)")
        harness.emit({"bench": "ngram-memory subset", "identical": same, "runs": list(runs)})
        for o in outs:
            o.unlink()

        print(f"\nwhole corpus, --memory {args.memory}:")
        out = tmp / "full.arpa"
        wall, rss, err = run_child(
            ["ngram", "train", "-o", order, "--text", str(corpus), "--arpa", str(out),
             "--memory", args.memory]
        )  # fmt: skip
        print("  " + "\n  ".join(line for line in err.splitlines() if line.strip()))
        print(f"  wall {wall:.0f} s ({words / wall / 1e6:.2f} M words/s), peak RSS {rss:.2f} GiB, "
              f"ARPA {out.stat().st_size / 2**30:.2f} GiB")  # fmt: skip
        harness.emit({"bench": "ngram-memory whole", "memory": args.memory, "words": words,
                      "wall_s": wall, "peak_rss_gib": rss, "target": "< ~3 GB"})  # fmt: skip
        if not same:
            raise SystemExit("the bounded ARPA differs from the in-memory one")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
