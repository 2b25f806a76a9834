"""``attnlm word2vec ...``: static word embeddings (docs/word2vec.md).

* ``attnlm word2vec train --text PATH --out vectors.txt [--dim 100 --window 5 --negative 5
  --min-count 5 --epochs 5 --sg/--cbow --workers N]``
* ``attnlm word2vec similar --vectors F WORD [--top-k 10]``
* ``attnlm word2vec analogy --vectors F king man woman``
* ``attnlm word2vec evaluate --vectors F``
"""

from __future__ import annotations

import argparse
import json
from functools import partial

from attnlm.base.validate import (
    existing_file,
    finite_float,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
    threads,
)
from attnlm.cli.common import (
    add_command,
    add_command_group,
    add_json_argument,
    add_progress_argument,
    add_seed_argument,
    add_text_argument,
    add_top_k_argument,
    arg,
    flag,
    one_of,
    option,
    text_file,
    text_value,
)

FORMAT = option(
    "--format", choices=["auto", "text", "binary"], default="auto",
    help="word2vec file format: text, binary, or auto (default: binary if the name ends .bin)",
)  # fmt: skip

# the vectors file every action but train reads
VECTORS_OPTIONS = (
    option("--vectors", metavar="F", required=True, type=text_file(existing_file),
           help="a word2vec vectors file: text or binary (ours, gensim's or word2vec.c's)"),
    FORMAT,
    add_json_argument,
)  # fmt: skip

# ``attnlm word2vec train``: the text, the vectors file, word2vec.c's settings
TRAIN_OPTIONS = (
    add_text_argument,
    option("--out", metavar="FILE", required=True, type=arg(output_file),
           help="vectors file (.bin: binary format; else text)"),
    FORMAT,
    option("--dim", type=arg(positive_int), default=100, help="vector size (100)"),
    option("--window", type=arg(positive_int), default=5, help="max window (5)"),
    option("--negative", type=arg(positive_int), default=5, help="noise words (5)"),
    option("--min-count", type=arg(positive_int), default=5, help="min count (5)"),
    option("--epochs", type=arg(positive_int), default=5, help="passes (5)"),
    one_of(flag("--sg", "skip-gram (default)", default=True, dest="sg"),
           option("--cbow", dest="sg", action="store_false", help="CBOW (mean of context)")),
    option("--workers", type=arg(threads), default=1, help="parallel workers: threads (1)"),
    option("--sample", type=arg(finite_float, lo=0.0, hi=1.0, hi_open=True), default=1e-3,
           help="subsampling threshold (1e-3; 0: off)"),
    option("--alpha", type=arg(positive_float), default=0.025, help="start rate"),
    option("--min-alpha", type=arg(finite_float, lo=0.0), default=0.0001,
           help="end rate (1e-4)"),
    option("--batch", type=arg(positive_int), default=4096, help="centre words per step"),
    option("--noise-share", type=arg(positive_int), default=8,
           help="CBOW: centre words sharing their noise words (8)"),
    partial(add_seed_argument, default=1),
    add_progress_argument,
)  # fmt: skip

# ``attnlm word2vec evaluate``: the benchmark files (else gensim's copies)
EVALUATE_OPTIONS = (
    *VECTORS_OPTIONS,
    *(option(spelling, dest=name.replace("-", "_"), metavar="PATH",
             type=text_file(existing_file), help=f"the {name} file")
      for name, spelling in (("wordsim353", "--wordsim"), ("simlex999", "--simlex"),
                             ("google-analogies", "--analogies"))),
    option("--restrict", type=arg(non_negative_int), default=300_000,
           help="use the first N words only (300000, gensim's restrict_vocab)"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    wsub = add_command_group(sub, "word2vec", "static word embeddings: train, neighbours, evaluate")
    add_command(wsub, "train", _train, *TRAIN_OPTIONS)
    add_command(
        wsub, "similar", _similar, *VECTORS_OPTIONS,
        option("word", metavar="WORD", type=text_value),
        partial(add_top_k_argument, default=10, what="nearest words"),
    )  # fmt: skip
    add_command(
        wsub, "analogy", _analogy, *VECTORS_OPTIONS,
        option("words", nargs=3, metavar="WORD", type=text_value, help="A B C"),
        partial(add_top_k_argument, default=10, what="answers"),
    )  # fmt: skip
    add_command(wsub, "evaluate", _evaluate, *EVALUATE_OPTIONS)


def _binary(args: argparse.Namespace) -> bool | None:
    return None if args.format == "auto" else args.format == "binary"


def _load(args: argparse.Namespace):
    from attnlm.word2vec.vectors import WordVectors

    return WordVectors.load(args.vectors, _binary(args))


def _train(args: argparse.Namespace) -> int:
    """train skip-gram or CBOW vectors with negative sampling

    Train word2vec (Mikolov et al. 2013) on a text: lower-cased words, one sentence per paragraph;
    frequent-word subsampling, count**0.75 noise, dynamic window, linear learning-rate decay. Writes
    the word2vec text or binary format."""
    import sys

    from attnlm.data.corpus import load_text
    from attnlm.word2vec.train import Word2VecConfig, train_word2vec

    cfg = Word2VecConfig(
        dim=args.dim, window=args.window, negative=args.negative, min_count=args.min_count,
        epochs=args.epochs, sg=args.sg, sample=args.sample, alpha=args.alpha,
        min_alpha=min(args.min_alpha, args.alpha), seed=args.seed, workers=args.workers,
        batch=args.batch, noise_share=args.noise_share,
    )  # fmt: skip
    text = load_text(args.text)
    bars: list = []  # made on the first report, so an error before training prints no bar

    def progress(p) -> None:
        if not args.progress:
            return
        if not bars:
            from tqdm.auto import tqdm

            form = "{desc}{percentage:3.0f}%|{bar}| [{elapsed}{postfix}]"
            bars.append(tqdm(total=p.total_words, unit="word", dynamic_ncols=True,
                             mininterval=0.5, file=sys.stderr, desc="word2vec ",
                             bar_format=form))  # fmt: skip
        bar = bars[0]
        bar.set_postfix_str(
            f"epoch {p.epoch}, loss {p.loss:.4f}, {p.words_per_s:,.0f} words/s, "
            f"ETA {_fmt_seconds(p.eta)}",
            refresh=False,
        )
        bar.update(p.words - bar.n)

    try:
        result = train_word2vec(text, cfg, progress)
    finally:
        for bar in bars:
            bar.close()
    path = result.vectors.save(args.out, _binary(args))
    kind = "skip-gram" if cfg.sg else "CBOW"
    losses = ", ".join(f"{x:.4f}" for x in result.epoch_losses)
    print(f"{kind}: {len(result.vocab):,} words x {cfg.dim} from {result.words // cfg.epochs:,} "
          f"words of text, {cfg.epochs} epochs in {result.seconds:.1f}s "
          f"({result.words_per_s:,.0f} words/s, {cfg.workers} workers)")  # fmt: skip
    print(f"loss per epoch: {losses}")
    print(f"wrote {path}")
    return 0


def _fmt_seconds(s: float) -> str:
    if s == float("inf"):
        return "?"
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def _print_neighbours(args: argparse.Namespace, title: str, result: list[tuple[str, float]],
                      query: dict) -> int:  # fmt: skip
    if args.json:
        out = {**query, "results": [{"word": w, "cosine": round(c, 6)} for w, c in result]}
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print(title)
    for w, c in result:
        print(f"  {c:7.4f}  {w}")
    return 0


def _similar(args: argparse.Namespace) -> int:
    """nearest words by cosine (gensim's most_similar)"""
    vectors = _load(args)
    result = vectors.most_similar([args.word], top=args.top_k)
    return _print_neighbours(
        args, f"nearest to {args.word!r} (cosine):", result, {"word": args.word}
    )


def _analogy(args: argparse.Namespace) -> int:
    """A - B + C: what is to C as A is to B (king man woman -> queen)

    The words nearest to A - B + C (unit vectors, gensim's most_similar(positive=[A, C],
    negative=[B])): analogy king man woman asks what is to woman as king is to man."""
    a, b, c = args.words
    vectors = _load(args)
    result = vectors.analogy(a, b, c, top=args.top_k)
    title = f"{a} - {b} + {c} (what is to {c!r} as {a!r} is to {b!r}):"
    return _print_neighbours(args, title, result, {"positive": [a, c], "negative": [b]})


def _evaluate(args: argparse.Namespace) -> int:
    """Spearman on WordSim-353 and SimLex-999, accuracy on the Google analogies

    Word similarity (Spearman, Pearson) on WordSim-353 and SimLex-999 and 3CosAdd accuracy on the
    Google analogy questions, computed as gensim's evaluate_word_pairs / evaluate_word_analogies;
    the files are read from the installed gensim package's test data unless given."""
    from attnlm.word2vec.evaluate import evaluate_all

    paths = {
        "wordsim353": args.wordsim353,
        "simlex999": args.simlex999,
        "google-analogies": args.google_analogies,
    }
    out = evaluate_all(_load(args), paths, args.restrict or None)
    if args.json:
        print(json.dumps(out))
        return 0
    for name in ("wordsim353", "simlex999"):
        r = out[name]
        print(f"{name:>17}: Spearman {r['spearman']:.4f}, Pearson {r['pearson']:.4f} "
              f"({r['pairs']} pairs, {r['oov_percent']:.1f}% skipped: unknown words)")  # fmt: skip
    g = out["google-analogies"]
    print(f"{'google-analogies':>17}: accuracy {g['accuracy']:.4f} ({g['correct']}/{g['answered']} "
          f"answered; {g['oov_questions']} skipped: unknown words)")  # fmt: skip
    return 0
