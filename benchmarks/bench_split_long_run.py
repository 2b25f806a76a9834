"""Pre-tokenization of a long ASCII run followed by one non-ASCII character (issue 15).

Times ``Splitter(pattern)(text)`` (attnlm's mixed re/regex split) against plain
``regex.findall`` on the same text, for texts of ``--mb`` MB: a run of ASCII letters without
any safe break, with and without a final ``é``. Prints medians of ``--repeats`` runs and
checks that the outputs are identical.

    python benchmarks/bench_split_long_run.py --mb 1 --repeats 3
"""

from __future__ import annotations

import argparse

import regex

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.tokenizers.bpe import PATTERNS
from attnlm.tokenizers.split import Splitter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = harness.parse(ap, quick={"mb": 0.05, "repeats": 1})
    harness.set_threads(1)
    n = int(args.mb * 1_000_000)
    harness.header("split-long-run", mb=args.mb)
    for name in ("gpt2", "cl100k"):
        pattern = PATTERNS[name]
        split = Splitter(pattern)
        full = regex.compile(pattern)
        for label, text in (("ascii", "a" * n), ("ascii+e-acute", "a" * n + "é")):
            assert split(text) == full.findall(text), f"{name} {label}: differs from regex"
            runs = harness.alternate(
                {
                    "attnlm": lambda t=text, f=split: harness.time_call(lambda: f(t)),
                    "regex": lambda t=text, f=full.findall: harness.time_call(lambda: f(t)),
                },
                args.repeats,
            )
            harness.report(f"split-long-run {name} {label}", runs, "attnlm", "regex", mb=args.mb)


if __name__ == "__main__":
    main()
