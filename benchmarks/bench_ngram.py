"""n-gram benchmark: attnlm.ngram against NLTK, in one process, one thread.

On the default corpus (Shakespeare) split into words, one sentence per non-blank line, the first
90% of lines for training and the rest for testing:

1. order-5 modified Kneser-Ney estimation (count + estimate): CPU time (median) and memory
   (tracemalloc peak of the estimation, process peak RSS);
2. scoring speed of the order-5 model (tokens per CPU-second, median);
3. trigram fit-plus-score against NLTK 3.x ``nltk.lm`` (Laplace and WittenBellInterpolated;
   its KneserNeyInterpolated is only timed on a few tokens: it needs about 0.1 s per token),
   alternating ours and theirs, printing the ratio.

Run: ``.venv/bin/python benchmarks/bench_ngram.py`` (``--quick`` uses a fortieth of the corpus).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import harness  # noqa: E402  (benchmarks/harness.py: runs, medians, ratios, --quick)
from attnlm.data.corpus import load_text  # noqa: E402
from attnlm.ngram import train  # noqa: E402


def words_of(text: str) -> tuple[list[list[str]], str]:
    try:
        from attnlm.tokenizers.word import split_words

        how = "attnlm.tokenizers.word.split_words"
    except ImportError:  # the word tokenizer is not there yet: the fixture's regex
        import regex

        pat = regex.compile(r"\w+|[^\w\s]")
        split_words = pat.findall
        how = r"regex \w+|[^\w\s] (attnlm.tokenizers.word not available)"
    sents = [s for s in (split_words(line) for line in text.splitlines()) if s]
    return sents, how


def cpu(fn, repeat: int = 3) -> tuple[float, object]:
    """Median CPU seconds of ``fn()`` over ``repeat`` runs, and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        times.append(time.process_time() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="use a fortieth of the corpus")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-nltk", action="store_true")
    args = harness.parse(ap)
    if not args.no_nltk and not harness.require("ngram", "nltk"):
        args.no_nltk = True
    harness.set_threads(1)

    text = load_text(None)
    sents, how = words_of(text)
    if args.quick:
        sents = sents[: len(sents) // 40]
    cut = int(len(sents) * 0.9)
    tr, te = sents[:cut], sents[cut:]
    n_tr = sum(map(len, tr))
    n_te = sum(map(len, te))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}")
    print(f"tokenizer: {how}")
    print(f"train: {len(tr):,} sentences, {n_tr:,} words; test: {len(te):,} sentences, "
          f"{n_te:,} words; all: {n_tr + n_te:,} words")  # fmt: skip

    # 1. order-5 modified Kneser-Ney estimation
    t5, m5 = cpu(lambda: train(sents, 5), args.repeat)
    tracemalloc.start()
    train(sents, 5)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    counts = " / ".join(f"{len(k):,}" for k in m5.keys)
    print(f"\n[1] order-5 MKN on all {n_tr + n_te:,} words: {t5:.2f} CPU-s (median of "
          f"{args.repeat}); n-grams {counts}")  # fmt: skip
    print(f"    memory: tracemalloc peak {peak / 2**20:.0f} MiB, process peak RSS {rss:.0f} MiB")

    # 2. scoring
    ts, r = cpu(lambda: m5.score_sentences(sents), args.repeat)
    print(f"\n[2] order-5 scoring of {r.tokens:,} tokens (incl. </s>): {ts:.2f} CPU-s, "
          f"{r.tokens / ts:,.0f} tokens/s")  # fmt: skip

    harness.emit(
        {
            "bench": "ngram-mkn5",
            "clock": "cpu",
            "words": n_tr + n_te,
            "estimate_cpu_s": t5,
            "target_estimate": "< 10 s",
            "tracemalloc_peak_mib": round(peak / 2**20),
            "peak_rss_mib": round(rss),
            "target_memory": "< 1.5 GB",
            "score_tokens_per_cpu_s": round(r.tokens / ts),
            "target_score": ">= 500k tokens/s",
        }
    )
    if args.no_nltk:
        return
    # 3. trigram fit + score, ours vs NLTK, alternating
    from nltk.lm import KneserNeyInterpolated, Laplace, WittenBellInterpolated
    from nltk.lm.preprocessing import pad_both_ends, padded_everygram_pipeline
    from nltk.util import ngrams

    def ours(smoothing: str, pad: str):
        def run():
            m = train(tr, 3, smoothing=smoothing, pad=pad)
            return m.score_sentences(te).ppl

        return run

    def theirs(cls):
        def run():
            lm = cls(3)
            data, vocab = padded_everygram_pipeline(3, tr)
            lm.fit(data, vocab)
            grams = [g for s in te for g in ngrams(pad_both_ends(s, 3), 3)]
            return lm, lm.perplexity(grams)

        return run

    print(f"\n[3] trigram fit on {n_tr:,} words + score {n_te:,} words, CPU-s:")
    rows = []
    t_mkn, ppl_mkn = cpu(ours("mkn", "kenlm"), args.repeat)
    rows.append(("attnlm mkn (KenLM padding)", t_mkn, ppl_mkn))
    t_lap_nltk, (_, ppl_lap_nltk) = cpu(theirs(Laplace), 1)
    rows.append(("nltk Laplace", t_lap_nltk, ppl_lap_nltk))
    t_add, ppl_add = cpu(ours("addk", "nltk"), args.repeat)
    rows.append(("attnlm add-1 (NLTK padding)", t_add, ppl_add))
    t_wb_nltk, (wb, ppl_wb_nltk) = cpu(theirs(WittenBellInterpolated), 1)
    rows.append(("nltk WittenBellInterpolated", t_wb_nltk, ppl_wb_nltk))
    for name, t, ppl in rows:
        print(f"    {name:32s} {t:8.2f} s  {(n_tr + n_te) / t:>12,.0f} words/s  ppl {ppl:.2f}")
    print(f"    ratio nltk Laplace / attnlm mkn:            {t_lap_nltk / t_mkn:6.0f}x")
    print(f"    ratio nltk WittenBell / attnlm mkn:         {t_wb_nltk / t_mkn:6.0f}x")
    print(f"    ratio nltk Laplace / attnlm add-1:          {t_lap_nltk / t_add:6.0f}x")
    harness.emit(
        {
            "bench": "ngram-trigram-vs-nltk",
            "clock": "cpu",
            "rows": [{"name": n, "cpu_s": t, "ppl": p} for n, t, p in rows],
            "speedup_wittenbell_vs_mkn": t_wb_nltk / t_mkn,
            "speedup_laplace_vs_mkn": t_lap_nltk / t_mkn,
            "speedup_laplace_vs_add1": t_lap_nltk / t_add,
            "target": ">= 100x (WittenBell)",
        }
    )

    # NLTK's Kneser-Ney scores too slowly to finish: time a few tokens on the same counts
    kn = KneserNeyInterpolated(3, vocabulary=wb.vocab, counter=wb.counts)
    sample = [g for s in te[:20] for g in ngrams(pad_both_ends(s, 3), 3)][:40]
    t = time.process_time()
    for g in sample:
        kn.logscore(g[-1], g[:-1])
    per = (time.process_time() - t) / len(sample)
    print(f"    nltk KneserNeyInterpolated scoring: {per:.3f} CPU-s per token "
          f"(the {n_te:,}-word test set would take {per * n_te / 60:.0f} min)")  # fmt: skip


if __name__ == "__main__":
    main()
