"""``attnlm ngram ...`` subcommands, shaped after KenLM's ``lmplz`` and ``query``:

* ``attnlm ngram train --order N --text train.txt --arpa out.arpa [--out model.npz]``
* ``attnlm ngram score --arpa|--lm FILE --text test.txt [--json]``
* ``attnlm ngram sample --lm FILE -n 5 --seed 0``

(``--lm`` is the n-gram model file; ``--model`` names a neural model in every other command, so
here it stays only as a hidden old spelling, like ``--prefix`` for ``--prompt``.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import warnings
from collections.abc import Iterator
from functools import partial

from attnlm.base.errors import ConfigError
from attnlm.base.validate import (
    existing_file,
    finite_float,
    memory_size,
    output_file,
    positive_float,
    positive_int,
)
from attnlm.cli.common import (
    add_command,
    add_command_group,
    add_json_argument,
    add_num_samples_argument,
    add_progress_argument,
    add_prompt_argument,
    add_seed_argument,
    add_text_argument,
    arg,
    flag,
    one_of,
    option,
    text_file,
)

# how each line is split into words, the same when a model is trained and when it is used
CONVENTION = flag(
    "--tokenize", "split each line with attnlm's word tokenizer instead of on whitespace"
)
PAD_CHOICES = ["kenlm", "nltk"]

# ``attnlm ngram train``: like lmplz
TRAIN_OPTIONS = (
    option("--order", "-o", type=arg(positive_int), required=True, help="n-gram order N >= 1"),
    add_text_argument,
    option("--arpa", metavar="OUT", type=arg(output_file),
           help="an ARPA file: to write (.gz to compress)"),
    option("--out", metavar="MODEL", type=arg(output_file),
           help="write attnlm's binary format (.npz)"),
    option("--smoothing", choices=["mkn", "mle", "addk", "stupid"], default="mkn",
           help="mkn: interpolated modified Kneser-Ney (default); mle: maximum likelihood; "
           "addk: add-k (Laplace with --k 1); stupid: stupid backoff (unnormalised)"),
    option("--k", type=arg(positive_float), default=1.0, help="k for add-k smoothing (default 1)"),
    option("--alpha", type=arg(finite_float, lo=0.0, hi=1.0, lo_open=True), default=0.4,
           help="stupid backoff factor in (0, 1] (default 0.4)"),
    option("--pad", choices=PAD_CHOICES, default="kenlm",
           help="sentence padding: kenlm (one <s>, one </s>) or nltk (n-1 of each)"),
    option("--memory", "-S", metavar="SIZE", type=arg(memory_size), default=None,
           help="bounded memory (like lmplz -S): count, sort and estimate in about SIZE bytes "
           "(2G, 512M, 100K), spilling sorted shards to $TMPDIR; mkn and --arpa only"),
    partial(add_progress_argument, default=False),  # n-grams/s for count, estimate, write
    CONVENTION,
)  # fmt: skip

# the model ``score`` and ``sample`` read: attnlm's file or an ARPA file
MODEL = one_of(
    option("--lm", aliases=("--model",), metavar="FILE", type=arg(existing_file),
           help="the n-gram model file: attnlm binary (.npz) or ARPA"),
    option("--arpa", metavar="FILE", type=text_file(existing_file),
           help="an ARPA file: to read (plain or .gz)"),
    required=True,
)  # fmt: skip

# ``attnlm ngram score``: like KenLM's query
SCORE_OPTIONS = (
    MODEL,
    add_text_argument,
    add_json_argument,
    option("--pad", choices=PAD_CHOICES, default=None,
           help="sentence padding: kenlm or nltk (default: the model's)"),
    CONVENTION,
)  # fmt: skip

# ``attnlm ngram sample``
SAMPLE_OPTIONS = (
    MODEL,
    partial(add_num_samples_argument, default=5, what="sentences"),
    partial(add_seed_argument, default=0),
    option("--temperature", type=arg(positive_float), default=1.0,
           help="sampling temperature: > 0 (default 1)"),
    option("--max-len", type=arg(positive_int), default=50, help="words per sentence at most"),
    partial(add_prompt_argument, default=None, what="none: from <s>", aliases=("--prefix",)),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    nsub = add_command_group(sub, "ngram", "count-based n-gram language models (KenLM-compatible)")
    add_command(nsub, "train", _train, *TRAIN_OPTIONS)
    add_command(nsub, "score", _score, *SCORE_OPTIONS)
    add_command(nsub, "sample", _sample, *SAMPLE_OPTIONS)


def _load(args: argparse.Namespace):
    from attnlm.ngram.arpa import read_arpa
    from attnlm.ngram.files import load_model

    return read_arpa(args.arpa) if args.arpa else load_model(args.lm)


def _sentences(args: argparse.Namespace) -> tuple[str, list[list[str]]]:
    from attnlm.base.errors import InputError
    from attnlm.data.corpus import load_text
    from attnlm.ngram.counts import split_sentences

    text = load_text(args.text)
    try:
        sents = split_sentences(text, tokenize=args.tokenize)
    except ImportError:
        raise ConfigError(
            "--tokenize needs attnlm.tokenizers.word.split_words, which is not available"
        ) from None
    if not sents:
        raise InputError(f"{args.text or 'corpus'}: no tokens (every line is blank)")
    return text, sents


def _train(args: argparse.Namespace) -> int:
    """estimate an n-gram model (like lmplz): one sentence per line

    Estimate an n-gram model from one sentence per line (whitespace-separated tokens, as lmplz reads
    them). Modified Kneser-Ney matches KenLM lmplz."""

    if not args.arpa and not args.out:
        raise ConfigError("say where to write the model: --arpa OUT and/or --out MODEL")
    if args.smoothing == "addk" and args.arpa:
        raise ConfigError("add-k smoothing has no ARPA form (not a back-off model); use --out")
    if args.memory is not None:
        return _train_bounded(args)
    return _train_in_memory(args)


def _train_in_memory(args: argparse.Namespace) -> int:
    from attnlm.ngram import train

    t0 = time.perf_counter()
    _, sents = _sentences(args)
    t1 = time.perf_counter()
    with _discount_warnings():
        model = train(
            sents,
            args.order,
            smoothing=args.smoothing,
            k=args.k,
            alpha=args.alpha,
            pad=args.pad,
            progress=args.progress,
        )
    t2 = time.perf_counter()
    if args.arpa:
        from attnlm.ngram.arpa import write_arpa

        write_arpa(model, args.arpa, progress=args.progress)
    if args.out:
        model.save(args.out)
    t3 = time.perf_counter()
    sizes = [len(k) for k in model.keys]
    _report(args, len(sents), sizes, model.meta.get("discounts", []))
    print(
        f"  read {t1 - t0:.2f} s, estimate {t2 - t1:.2f} s, write {t3 - t2:.2f} s",
        file=sys.stderr,
    )
    return 0


@contextlib.contextmanager
def _discount_warnings() -> Iterator[None]:
    """Print Kneser-Ney discount fallbacks as one-line warnings on stderr."""
    from attnlm.ngram import DiscountWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DiscountWarning)
        yield
    for w in caught:
        print(f"attnlm: warning: {w.message}", file=sys.stderr)


def _report(args: argparse.Namespace, sentences: int, sizes: list[int], discounts) -> None:
    counts = " / ".join(f"{n:,}" for n in sizes)
    print(
        f"{args.smoothing} order {args.order}: {sentences:,} sentences, n-grams {counts}",
        file=sys.stderr,
    )
    for i, d in enumerate(discounts, 1):
        print(f"  discounts order {i}: " + " / ".join(f"{x:.6g}" for x in d), file=sys.stderr)


def _train_bounded(args: argparse.Namespace) -> int:
    """``--memory``: count and estimate in bounded memory, straight to the ARPA file."""
    from attnlm.ngram.bounded import train_arpa

    if args.smoothing != "mkn":
        raise ConfigError("--memory estimates modified Kneser-Ney only (--smoothing mkn)")
    if args.out or not args.arpa:
        raise ConfigError("--memory writes an ARPA file only: give --arpa OUT and no --out")
    t0 = time.perf_counter()
    with _discount_warnings():
        r = train_arpa(
            args.text,
            args.order,
            args.arpa,
            memory=args.memory,
            pad=args.pad,
            tokenize=args.tokenize,
            progress=args.progress,
        )
    _report(args, r.sentences, r.sizes, r.discounts)
    print(
        f"  {r.shards} shard(s) under {args.memory:,} bytes; {time.perf_counter() - t0:.2f} s",
        file=sys.stderr,
    )
    return 0


def _score(args: argparse.Namespace) -> int:
    """perplexity of a text (like KenLM query)

    Perplexity including and excluding OOV tokens, OOV count and token count (</s> counted, <s>
    context only, unknown words scored as <unk>)."""
    model = _load(args)
    text, sents = _sentences(args)
    r = model.score_sentences(sents, pad=args.pad, chars=len(text))
    if args.json:
        d = r.to_dict()
        d.update(order=model.order, smoothing=model.smoothing)
        # strict JSON: an infinite perplexity (unsmoothed model, unseen event) is null
        d = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}
        print(json.dumps(d, allow_nan=False))
    else:
        print(f"Perplexity including OOVs:\t{r.ppl}")
        print(f"Perplexity excluding OOVs:\t{r.ppl_excl_oov}")
        print(f"OOVs:\t{r.oov}")
        print(f"Tokens:\t{r.tokens}")
        if r.bpc is not None:
            print(f"Bits per character:\t{r.bpc}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    """generate sentences from a model"""
    model = _load(args)
    for s in model.sample(
        args.num_samples,
        seed=args.seed,
        temperature=args.temperature,
        max_len=args.max_len,
        prefix=(args.prompt or "").split(),
    ):
        print(" ".join(s))
    return 0
