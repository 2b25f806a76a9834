"""``attnlm fill-mask``, ``embed`` and ``contextual``: what an encoder (BERT family) gives."""

from __future__ import annotations

import argparse
from functools import partial

from attnlm.base.validate import existing_file, output_file
from attnlm.cli.common import (
    add_command,
    add_json_argument,
    add_model_spec_argument,
    add_runtime_arguments,
    add_top_k_argument,
    arg,
    flag,
    option,
    text_value,
    use_threads,
)

MODEL = partial(add_model_spec_argument, checkpoint_synonym=True)
RUNTIME = partial(add_runtime_arguments, device="cpu")
SENTENCES = dict(nargs="+", metavar="SENTENCE", type=text_value)


def register(sub: argparse._SubParsersAction) -> None:
    add_command(
        sub, "fill-mask", _fill_mask, MODEL,
        option("text", type=text_value,
               help='a text with [MASK], e.g. "the capital of france is [MASK]."'),
        partial(add_top_k_argument, default=5, what="predictions per mask"),
        add_json_argument,
        RUNTIME,
    )  # fmt: skip
    add_command(
        sub, "embed", _embed, MODEL,
        option("sentences", **SENTENCES),
        flag("--json", 'print one JSON object: {"cosine": [[...]]}'),
        RUNTIME,
    )  # fmt: skip
    add_command(
        sub, "contextual", _contextual, MODEL,
        option("--word", required=True, type=text_value, help="the word to follow, e.g. bank"),
        option("sentences", **SENTENCES, help="at least two sentences"),
        option("--out", default=None, metavar="FILE.png", type=arg(output_file),
               help="plot of cosine vs layer"),
        flag("--json", 'print one JSON object: {"word", "layers": [...]}'),
        option("--vectors", metavar="F", type=arg(existing_file), default=None,
               help="a word2vec vectors file (text, or binary if named *.bin): also show the "
               "word's static vector, the same in every sentence, and its nearest words"),
        RUNTIME,
    )  # fmt: skip


def _load(args: argparse.Namespace):
    from attnlm.base.device import resolve_device
    from attnlm.loading.sources import load_model_ref

    use_threads(args)
    return load_model_ref(args.checkpoint, args.model, resolve_device(args.device))


def _fill_mask(args: argparse.Namespace) -> int:
    """top-k tokens for each [MASK] of a text (masked-LM models)

    Predict every [MASK] of a text with a masked-LM model (BERT family): the top-k tokens and their
    softmax probabilities."""
    import json

    from attnlm.inspect.fill_mask import fill_mask, filled_text

    ck = _load(args)
    preds = fill_mask(ck.model, ck.tokenizer, args.text, args.top_k)
    filled = filled_text(ck.tokenizer, args.text, preds)
    if args.json:
        out = {"text": args.text, "filled": filled, "masks": [p.to_dict() for p in preds]}
        print(json.dumps(out, ensure_ascii=False))
        return 0
    for k, p in enumerate(preds, 1):
        print(f"[MASK] {k} (token {p.index}):")
        for t, prob in zip(p.tokens, p.probs):
            print(f"  {prob:7.4f}  {t}")
    print(f"top-1: {filled}")
    return 0


def _embed(args: argparse.Namespace) -> int:
    """sentence embeddings (mean pooling, L2-normalised) and their cosine matrix

    Sentence embeddings the sentence-transformers way: the mean of the last hidden states over non-
    padding tokens, L2-normalised (inputs cut to 256 tokens, or the model folder's
    sentence_bert_config.json max_seq_length); prints the cosine matrix."""
    import json

    from attnlm.inspect.embeddings import cosine_matrix, sentence_embeddings, sentence_max_length

    ck = _load(args)
    limit = sentence_max_length(ck.path, ck.model)
    emb = sentence_embeddings(ck.model, ck.tokenizer, args.sentences, limit)
    cos = cosine_matrix(emb)
    if args.json:
        print(json.dumps({"cosine": [[round(float(v), 6) for v in row] for row in cos]}))
        return 0
    n = len(args.sentences)
    print(f"{n} sentence embeddings of width {emb.shape[1]} (mean pooling, L2-normalised, "
          f"max {limit} tokens)")  # fmt: skip
    for k, s in enumerate(args.sentences, 1):
        print(f"  S{k}: {s}")
    print("cosine " + " ".join(f"{'S' + str(k):>6}" for k in range(1, n + 1)))
    for i in range(n):
        print(f"{'S' + str(i + 1):>6} " + " ".join(f"{float(cos[i, j]):6.3f}" for j in range(n)))
    return 0


def _contextual(args: argparse.Namespace) -> int:
    """one word's vector layer by layer in several sentences (cosine vs layer)

    The word's vector at every layer (0 = embedding output) in each sentence; a word split into
    pieces is the mean of its pieces' vectors. Prints the cosine between sentences per layer and
    each layer's cosine with the static input-embedding row; --out draws cosine vs layer. GPT
    checkpoints work too (left context only)."""
    import json

    from attnlm.inspect.contextual import (
        contextual_word,
        format_table,
        plot_contextual,
        static_word,
    )

    static = None
    if args.vectors:
        from attnlm.word2vec.vectors import WordVectors

        static = static_word(WordVectors.load(args.vectors), args.word, args.sentences)
    ck = _load(args)
    result = contextual_word(ck.model, ck.tokenizer, args.word, args.sentences)
    if args.out:
        plot_contextual(result, args.out)
    if args.json:
        out = result.to_json()
        if static is not None:
            out["word2vec"] = static.to_json()
        print(json.dumps(out, ensure_ascii=False))
        return 0
    for k, s in enumerate(args.sentences, 1):
        print(f"S{k}: {s}")
    for line in format_table(result) + (static.lines() if static is not None else []):
        print(line)
    if args.out:
        print(f"wrote {args.out}")
    return 0
