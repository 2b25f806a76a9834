"""``attnlm ngram train`` against KenLM ``lmplz``, both as whole processes; then binary load
and scoring speed of the resulting order-5 model.

Workload: the default corpus split into words with attnlm's word tokenizer (1.17M words),
written one sentence per line to a temporary file; then, alternating (harness.py):

* ours: ``attnlm ngram train --order 5 --text corpus.txt --arpa ours.arpa`` (the command a
  user runs: interpreter start-up, imports, reading, count + estimate, the ARPA write);
* peer: ``lmplz -o 5 -S 1G -T TMP < corpus.txt > kenlm.arpa`` (KenLM's builder is not in the
  PyPI ``kenlm`` wheel; build it from KenLM's sources as ``docs/benchmarks.md`` says, and pass
  ``--lmplz PATH`` or put it on PATH). Without it the peer is skipped with a line.

Target: ours <= 2x lmplz (time ratio, wall clock). The two ARPA files must have the same
n-gram counts. Then in-process: loading the memory-mapped binary of the model (median of 5;
target <= 200 ms) and scoring the corpus with it (target >= 1M tokens/s).

Run: ``.venv/bin/python benchmarks/bench_ngram_kenlm.py --lmplz /path/to/lmplz --repeat 5``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import harness

BENCH = "ngram-train-vs-lmplz"


def write_corpus(path: Path, words: int | None) -> list[list[str]]:
    """The default corpus as words, one sentence per line (the first ``words`` words)."""
    from attnlm.data.corpus import load_text
    from attnlm.tokenizers.word import split_words

    sents, total = [], 0
    for line in load_text(None).splitlines():
        s = split_words(line)
        if s:
            sents.append(s)
            total += len(s)
            if words and total >= words:
                break
    path.write_text("\n".join(" ".join(s) for s in sents) + "\n", encoding="utf-8")
    return sents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmplz", default=shutil.which("lmplz"), help="path of KenLM's lmplz")
    ap.add_argument("--repeat", type=int, default=3, help="alternating rounds")
    ap.add_argument("--order", type=int, default=5)
    ap.add_argument("--words", type=int, default=None, help="use the first N words only")
    args = harness.parse(ap, quick={"repeat": 1, "words": 20_000})
    harness.set_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench_ngram_"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> None:
    corpus = tmp / "corpus.txt"
    sents = write_corpus(corpus, args.words)
    words = sum(map(len, sents))
    harness.header(BENCH, sentences=len(sents), words=words, order=args.order)
    ours_cmd = harness.attnlm_command(
        "ngram", "train", "--order", str(args.order), "--text", str(corpus),
        "--arpa", str(tmp / "ours.arpa"),
    )  # fmt: skip
    contenders = {"attnlm": lambda: harness.time_process(ours_cmd)}
    if args.lmplz:
        peer_cmd = [args.lmplz, "-o", str(args.order), "-S", "1G", "-T", str(tmp)]
        contenders["lmplz"] = lambda: harness.time_process(
            peer_cmd, stdin=corpus, stdout=tmp / "kenlm.arpa"
        )
    else:
        harness.skip(BENCH, "lmplz", "KenLM's lmplz is not on PATH (pass --lmplz PATH)")
    runs = harness.alternate(contenders, args.repeat)
    extra: dict[str, object] = {"arpa_mb": round((tmp / "ours.arpa").stat().st_size / 1e6, 1)}
    if args.lmplz:
        heads = [
            (tmp / n).read_bytes()[:300].split(b"\n\n")[0] for n in ("ours.arpa", "kenlm.arpa")
        ]
        extra["same_counts"] = heads[0] == heads[1]
    harness.report(BENCH, runs, "attnlm", "lmplz" if args.lmplz else None, "<= 2x", **extra)
    load_and_score(tmp, sents, args.order)


def load_and_score(tmp: Path, sents: list[list[str]], order: int) -> None:
    """The binary model: memory-mapped load time, then scoring speed (in-process calls)."""
    from attnlm.ngram import load_model, train

    train(sents, order).save(tmp / "lm.npz")
    loads = harness.alternate(
        {"load": lambda: harness.time_call(lambda: load_model(tmp / "lm.npz"))}, 5
    )
    harness.report("ngram-binary-load", loads, "load", target="<= 200 ms")
    model = load_model(tmp / "lm.npz")
    box = {}
    score = harness.time_call(lambda: box.setdefault("r", model.score_sentences(sents)))
    tokens = box["r"].tokens
    harness.report(
        "ngram-score",
        {"score": [score]},
        "score",
        target=">= 1M tokens/s",
        tokens=tokens,
        tokens_per_s_wall=round(tokens / score.wall),
        tokens_per_s_cpu=round(tokens / score.cpu) if score.cpu else None,
    )


if __name__ == "__main__":
    main()
