"""``attnlm attention``: attention heatmaps of any model family from one inspection record."""

from __future__ import annotations

import argparse
from functools import partial

from attnlm.base.validate import non_negative_int, output_file
from attnlm.cli.common import (
    add_command,
    add_literal_text_arguments,
    add_model_spec_argument,
    add_runtime_arguments,
    arg,
    literal_or_file,
    option,
    use_threads,
)

# the model, the text (and a translation's target), what is drawn and where
OPTIONS = (
    partial(add_model_spec_argument, checkpoint_synonym=True),
    partial(add_literal_text_arguments,
            what="the text (a source sentence for translation; 'A [SEP] B' for a BERT pair)"),
    partial(add_literal_text_arguments, name="target", flag="--target",
            what="translation models: the target sentence"),
    option("--out", default=None, metavar="FILE.png", type=arg(output_file), help="PNG to write"),
    option("--html", default=None, metavar="FILE.html", type=arg(output_file),
           help="offline HTML views"),
    option("--layer", type=arg(non_negative_int), default=None, help="only this layer (0-based)"),
    option("--head", type=arg(non_negative_int), default=None,
           help="a head: only this one is drawn (0-based, within --layer)"),
    option("--kind", choices=["auto", "self", "cross", "encoder"], default="auto",
           help="which attention: auto = cross for translation models, else self"),
    partial(add_runtime_arguments, device="cpu"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "attention", _attention, *OPTIONS)


def layer_labels(model) -> list[str] | None:
    """``"local"`` / ``"global"`` per layer of a model whose layers differ in their attention
    window (Gemma, Qwen2 with windows); None when every layer sees the same span."""
    windows = [getattr(b.attn, "window", None) for b in getattr(model, "blocks", ())]
    if not any(w is not None for w in windows):
        return None
    return ["global" if w is None else "local" for w in windows]


def select_panels(
    maps, layer: int | None, head: int | None, labels: list[str] | None = None
) -> list[list[tuple[str, object]]]:
    """The (title, map) panels for ``--layer``/``--head`` (rows: layers, columns: heads);
    ``labels``: a word per layer shown in its titles (local / global)."""
    from attnlm.base.errors import InputError

    n_layer, n_head = len(maps), int(maps[0].shape[0])
    if layer is not None and not 0 <= layer < n_layer:
        raise InputError(f"--layer {layer} is out of range: the model has {n_layer} layers")
    if head is not None and not 0 <= head < n_head:
        raise InputError(f"--head {head} is out of range: the model has {n_head} heads")
    layers = range(n_layer) if layer is None else [layer]
    heads = range(n_head) if head is None else [head]
    name = [f"layer {lay}" + (f" ({labels[lay]})" if labels else "") for lay in range(n_layer)]
    return [[(f"{name[lay]} head {h}", maps[lay][h]) for h in heads] for lay in layers]


def _attention(args: argparse.Namespace) -> int:
    """attention heatmaps (layer x head grid, or one head with values) of a checkpoint

    Run a checkpoint on a text (TEXT, quoted, or --text PATH; for a translation model the target
    sentence as TARGET or --target PATH) and draw its attention: every layer x head
    (self-attention; cross-attention source x target for translation models), or one layer/head
    with the weights written in the cells. Works for every model family."""
    from attnlm.base.device import resolve_device
    from attnlm.base.errors import InputError
    from attnlm.inspect.heatmap import plot_attention_panels
    from attnlm.inspect.record import inspect
    from attnlm.loading.sources import load_model_ref

    text = literal_or_file(args)  # the inputs first: a bad file is named before anything else
    target = literal_or_file(args, "target", "--target", required=False)
    if not args.out and not args.html:
        raise InputError("give --out FILE.png and/or --html FILE.html")
    if args.html:
        try:
            from attnlm.web.html import write_standalone
        except ImportError:
            raise InputError("--html needs attnlm.web, which this installation lacks") from None
    use_threads(args)
    ck = load_model_ref(args.checkpoint, args.model, resolve_device(args.device))
    tokenizer = ck.pair_tokenizers or ck.tokenizer  # both sides for a translation model
    record = inspect(ck.model, tokenizer, text, target=target)
    kind = args.kind
    if kind == "auto":
        kind = "cross" if record.cross_attentions is not None else "self"
    maps, queries, keys = record.maps(kind)
    labels = layer_labels(ck.model) if kind == "self" else None
    panels = select_panels(maps, args.layer, args.head, labels)  # out of range: refused
    if not args.out and (args.layer is not None or args.head is not None):
        raise InputError(
            "--layer/--head choose the panels of --out FILE.png; the --html page "
            "shows every layer and head"
        )
    if args.out:
        one = len(panels) == 1 and len(panels[0]) == 1
        title = f"{ck.family.type} {kind}-attention for {text!r} (rows: queries)"
        path = plot_attention_panels(panels, queries, keys, args.out, title, annotate=one)
        print(f"wrote {path} ({len(panels)} layer(s) x {len(panels[0])} head(s), {kind})")
    if args.html:
        path = write_standalone(record.to_json(), args.html, title=f"attention: {text}")
        print(f"wrote {path}")
    return 0
