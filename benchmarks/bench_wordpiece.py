"""WordPiece encoding speed: ours against Hugging Face ``tokenizers`` (Rust) and the Python
``BertTokenizer`` of ``transformers``.

Vocabulary: the real bert-base-uncased ``vocab.txt`` (``tests/fixtures``). Text: the default
corpus (``attnlm.data.corpus.load_text(None)``, about 5 MB) or ``--text``.

* ours: ``WordPieceTokenizer.encode`` of the whole text, cold (a fresh tokenizer, empty
  per-word cache) and warm (the cache filled by a previous call);
* HF ``tokenizers``: ``BertWordPieceTokenizer`` (the ``tokenizer.json`` path in Rust) with one
  thread (``RAYON_NUM_THREADS=1``, ``TOKENIZERS_PARALLELISM=false``), ``encode_batch`` of the
  lines and ``encode`` of the whole text; the faster counts;
* the Python ``BertTokenizer`` (``transformers`` 5: ``BertTokenizerLegacy``; before 5:
  ``BertTokenizer``) on the first ``--slow-chars`` characters only (it is slow), line by line.

Ids must be identical (asserted). Times are process CPU seconds, medians of ``--repeats`` runs,
ours and the peers alternating in one process. Ratios are throughputs relative to HF Rust
(higher is better). Usage: ``python benchmarks/bench_wordpiece.py [--text PATH] [--repeats N]``.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import harness  # noqa: E402  (benchmarks/harness.py: runs, medians, ratios, --quick)
from attnlm.data.corpus import load_text  # noqa: E402
from attnlm.tokenizers.wordpiece import WordPieceTokenizer  # noqa: E402

VOCAB = (
    Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "bert-base-uncased-vocab.txt"
)


def timed(fn):
    """(CPU seconds of this process, result); every measured path runs on one thread."""
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def slow_tokenizer():
    """The pure-Python BERT tokenizer of ``transformers`` (None when unavailable)."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as cls
    except ImportError:
        try:
            from transformers import BertTokenizer as cls
        except ImportError:
            return None
    return cls(vocab_file=str(VOCAB))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", default=None, help="text file (default: the default corpus)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slow-chars", type=int, default=300_000)
    ap.add_argument("--max-chars", type=int, default=None, help="use the first N characters")
    args = harness.parse(ap, quick={"repeats": 1, "slow_chars": 20_000, "max_chars": 300_000})
    if not harness.require("wordpiece", "tokenizers"):
        return
    harness.set_threads(1)
    from tokenizers import BertWordPieceTokenizer

    text = load_text(args.text)[: args.max_chars]
    mb = len(text.encode("utf-8")) / 1e6
    lines = text.splitlines()
    hf = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    ours_cold, ours_warm, hf_lines, hf_whole = [], [], [], []
    ids = ref = None
    for _ in range(args.repeats):
        tok = WordPieceTokenizer.from_vocab_file(VOCAB)
        t, ids = timed(lambda tok=tok: tok.encode(text))
        ours_cold.append(t)
        t, ids_warm = timed(lambda tok=tok: tok.encode(text))
        ours_warm.append(t)
        assert ids_warm == ids
        t, enc = timed(lambda: hf.encode_batch(lines, add_special_tokens=False))
        hf_lines.append(t)
        ref = [i for e in enc for i in e.ids]
        t, whole = timed(lambda: hf.encode(text, add_special_tokens=False).ids)
        hf_whole.append(t)
        assert whole == ref
    assert ids == ref, "ours and HF tokenizers disagree"
    hf_best = min(statistics.median(hf_lines), statistics.median(hf_whole))

    def rate(sec: float, size_mb: float = mb) -> str:
        return f"{size_mb / sec:6.2f} MB/s"

    print(f"text: {mb:.2f} MB, {len(ids):,} tokens; {platform.machine()}, {os.cpu_count()} cores")
    print(f"{'encoder':<44}{'CPU s':>8}{'throughput':>14}{'ratio':>8}")
    rows = [
        ("HF tokenizers (Rust), lines, 1 thread", statistics.median(hf_lines)),
        ("HF tokenizers (Rust), whole text, 1 thread", statistics.median(hf_whole)),
        ("ours, cold cache", statistics.median(ours_cold)),
        ("ours, warm cache", statistics.median(ours_warm)),
    ]
    for name, sec in rows:
        print(f"{name:<44}{sec:8.3f}{rate(sec):>14}{hf_best / sec:8.2f}")
    harness.emit(
        {
            "bench": "wordpiece-encode",
            "clock": "cpu",
            "mb": round(mb, 2),
            "runs": args.repeats,
            "attnlm": {"cold_cpu_s": rows[2][1], "warm_cpu_s": rows[3][1]},
            "hf": {"lines_cpu_s": rows[0][1], "whole_cpu_s": rows[1][1]},
            "speedup_cold": hf_best / rows[2][1],
            "speedup_warm": hf_best / rows[3][1],
        }
    )

    slow = slow_tokenizer()
    if slow is None:
        print("Python BertTokenizer: not available")
        return
    part = text[: args.slow_chars]
    part_lines = part.splitlines()
    part_mb = len(part.encode("utf-8")) / 1e6
    t_slow, slow_ids = timed(
        lambda: [i for ln in part_lines for i in slow.convert_tokens_to_ids(slow.tokenize(ln))]
    )
    tok = WordPieceTokenizer.from_vocab_file(VOCAB)
    t_ours, ours_ids = timed(lambda: tok.encode(part))
    t_hf, hf_enc = timed(lambda: hf.encode_batch(part_lines, add_special_tokens=False))
    assert ours_ids == slow_ids == [i for e in hf_enc for i in e.ids], "slow tokenizer disagrees"
    print(f"\nfirst {part_mb:.2f} MB (one run each):")
    for name, sec in (
        ("Python BertTokenizer (transformers)", t_slow),
        ("ours, cold cache", t_ours),
        ("HF tokenizers (Rust), lines", t_hf),
    ):
        print(f"{name:<44}{sec:8.3f}{rate(sec, part_mb):>14}{t_hf / sec:8.2f}")
    print(f"ours / Python BertTokenizer speed: {t_slow / t_ours:.1f}x")


if __name__ == "__main__":
    main()
