"""Pre-tokenization of a long ASCII run followed by one non-ASCII character (issue 15).

Times ``Splitter(pattern)(text)`` (attnlm's mixed re/regex split) against plain
``regex.findall`` on the same text, for texts of ``--mb`` MB: a run of ASCII letters without
any safe break, with and without a final ``é``. Prints medians of ``--repeats`` runs and
checks that the outputs are identical.

    python benchmarks/bench_split_long_run.py --mb 1 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import regex

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.tokenizers.bpe import PATTERNS
from attnlm.tokenizers.split import Splitter


def _median_time(fn, text: str, repeats: int) -> tuple[float, list[str]]:
    times, out = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn(text)
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = harness.parse(ap, quick={"mb": 0.05, "repeats": 1})
    harness.set_threads(1)
    n = int(args.mb * 1_000_000)
    for name in ("gpt2", "cl100k"):
        pattern = PATTERNS[name]
        split = Splitter(pattern)
        full = regex.compile(pattern)
        for label, text in (("ascii only", "a" * n), ("ascii + é", "a" * n + "é")):
            ours, got = _median_time(split, text, args.repeats)
            ref, want = _median_time(full.findall, text, args.repeats)
            assert got == want, f"{name} {label}: output differs from regex.findall"
            print(
                f"{name:7s} {label:11s} {args.mb:g} MB: Splitter {ours:.3f} s, "
                f"regex.findall {ref:.3f} s, ratio {ours / ref:.2f}"
            )


if __name__ == "__main__":
    main()
