"""``attnlm attention``: attention heatmaps of any model family from one inspection record."""

from __future__ import annotations

import argparse

from attnlm.validate import arg, device, non_negative_int, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="attention heatmaps (layer x head grid, or one head with values) of a checkpoint",
        description="Run a checkpoint on a text and draw its attention: every layer x head "
        "(self-attention; cross-attention source x target for translation models), or one "
        "layer/head with the weights written in the cells. Works for every model family.",
    )
    add_model_arguments(p)
    p.add_argument(
        "--text",
        required=True,
        help="the text (a source sentence for translation; 'A [SEP] B' for a BERT sentence pair)",
    )
    p.add_argument("--target", default=None, help="translation models: the target sentence")
    p.add_argument(
        "--out", default=None, metavar="FILE.png", type=arg(output_file), help="PNG to write"
    )
    p.add_argument(
        "--html",
        default=None,
        metavar="FILE.html",
        type=arg(output_file),
        help="offline HTML views",
    )
    p.add_argument(
        "--layer", type=arg(non_negative_int), default=None, help="only this layer (0-based)"
    )
    p.add_argument(
        "--head", type=arg(non_negative_int), default=None, help="only this head (0-based)"
    )
    p.add_argument(
        "--kind",
        choices=["auto", "self", "cross", "encoder"],
        default="auto",
        help="which attention: auto = cross for translation models, else self",
    )
    p.add_argument("--device", default="cpu", type=arg(device))
    p.set_defaults(func=_attention)
    register_encoder_commands(sub)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--checkpoint DIR | --model NAME`` (one of them), resolved by
    :func:`attnlm.checkpoint.load_model_ref`."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", metavar="DIR", help="attnlm run/checkpoint or HF model folder")
    g.add_argument(
        "--model", metavar="NAME", help="pretrained name (minilm) or Hugging Face model folder"
    )


def select_panels(maps, layer: int | None, head: int | None) -> list[list[tuple[str, object]]]:
    """The (title, map) panels for ``--layer``/``--head`` (rows: layers, columns: heads)."""
    from attnlm.errors import InputError

    n_layer, n_head = len(maps), int(maps[0].shape[0])
    if layer is not None and not 0 <= layer < n_layer:
        raise InputError(f"--layer {layer} is out of range: the model has {n_layer} layers")
    if head is not None and not 0 <= head < n_head:
        raise InputError(f"--head {head} is out of range: the model has {n_head} heads")
    layers = range(n_layer) if layer is None else [layer]
    heads = range(n_head) if head is None else [head]
    return [[(f"layer {lay} head {h}", maps[lay][h]) for h in heads] for lay in layers]


def _attention(args: argparse.Namespace) -> int:
    from attnlm.checkpoint import load_model_ref
    from attnlm.device import resolve_device
    from attnlm.errors import InputError
    from attnlm.inspect.heatmap import plot_attention_panels
    from attnlm.inspect.record import inspect

    if not args.out and not args.html:
        raise InputError("give --out FILE.png and/or --html FILE.html")
    if args.html:
        try:
            from attnlm.web.html import write_standalone
        except ImportError:
            raise InputError("--html needs attnlm.web, which this installation lacks") from None
    ck = load_model_ref(args.checkpoint, args.model, resolve_device(args.device))
    tokenizer = ck.pair_tokenizers or ck.tokenizer  # both sides for a translation model
    record = inspect(ck.model, tokenizer, args.text, target=args.target)
    kind = args.kind
    if kind == "auto":
        kind = "cross" if record.cross_attentions is not None else "self"
    maps, queries, keys = record.maps(kind)
    if args.out:
        panels = select_panels(maps, args.layer, args.head)
        one = len(panels) == 1 and len(panels[0]) == 1
        title = f"{ck.family.type} {kind}-attention for {args.text!r} (rows: queries)"
        path = plot_attention_panels(panels, queries, keys, args.out, title, annotate=one)
        print(f"wrote {path} ({len(panels)} layer(s) x {len(panels[0])} head(s), {kind})")
    if args.html:
        path = write_standalone(record.to_json(), args.html, title=f"attention: {args.text}")
        print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# Encoder commands (BERT family): fill-mask, embed, contextual


def register_encoder_commands(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser(
        "fill-mask",
        help="top-k tokens for each [MASK] of a text (masked-LM models)",
        description="Predict every [MASK] of a text with a masked-LM model (BERT family): the "
        "top-k tokens and their softmax probabilities.",
    )
    add_model_arguments(f)
    f.add_argument("text", help='a text with [MASK], e.g. "the capital of france is [MASK]."')
    f.add_argument("--top-k", type=int, default=5, help="predictions per mask (default 5)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.add_argument("--device", default="cpu")
    f.set_defaults(func=_fill_mask)

    e = sub.add_parser(
        "embed",
        help="sentence embeddings (mean pooling, L2-normalised) and their cosine matrix",
        description="Sentence embeddings the sentence-transformers way: the mean of the last "
        "hidden states over non-padding tokens, L2-normalised (inputs cut to 256 tokens, or the "
        "model folder's sentence_bert_config.json max_seq_length); prints the cosine matrix.",
    )
    add_model_arguments(e)
    e.add_argument("sentences", nargs="+", metavar="SENTENCE")
    e.add_argument("--json", action="store_true", help='print {"cosine": [[...]]}')
    e.add_argument("--device", default="cpu")
    e.set_defaults(func=_embed)

    c = sub.add_parser(
        "contextual",
        help="one word's vector layer by layer in several sentences (cosine vs layer)",
        description="The word's vector at every layer (0 = embedding output) in each sentence; "
        "a word split into pieces is the mean of its pieces' vectors. Prints the cosine between "
        "sentences per layer and each layer's cosine with the static input-embedding row; "
        "--out draws cosine vs layer. GPT checkpoints work too (left context only).",
    )
    add_model_arguments(c)
    c.add_argument("--word", required=True, help="the word to follow, e.g. bank")
    c.add_argument("sentences", nargs="+", metavar="SENTENCE", help="at least two sentences")
    c.add_argument("--out", default=None, metavar="FILE.png", help="plot of cosine vs layer")
    c.add_argument("--json", action="store_true", help='print {"word", "layers": [...]}')
    c.add_argument("--device", default="cpu")
    c.set_defaults(func=_contextual)


def _load(args: argparse.Namespace):
    from attnlm.checkpoint import load_model_ref
    from attnlm.device import resolve_device

    return load_model_ref(args.checkpoint, args.model, resolve_device(args.device))


def _fill_mask(args: argparse.Namespace) -> int:
    import json

    from attnlm.inspect.contextual import fill_mask, filled_text

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
    import json

    from attnlm.inspect.contextual import cosine_matrix, sentence_embeddings, sentence_max_length

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
    import json

    from attnlm.inspect.contextual import contextual_word, format_table, plot_contextual

    ck = _load(args)
    result = contextual_word(ck.model, ck.tokenizer, args.word, args.sentences)
    if args.out:
        plot_contextual(result, args.out)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
        return 0
    for k, s in enumerate(args.sentences, 1):
        print(f"S{k}: {s}")
    for line in format_table(result):
        print(line)
    if args.out:
        print(f"wrote {args.out}")
    return 0
