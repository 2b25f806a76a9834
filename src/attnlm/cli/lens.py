"""``attnlm lens``: the logit lens of a decoder on a text (each layer read through the final
norm and the LM head)."""

from __future__ import annotations

import argparse
from functools import partial

from attnlm.base.validate import output_file
from attnlm.cli import common


def register(sub: argparse._SubParsersAction) -> None:
    common.add_command(
        sub, "lens", _lens,
        common.add_literal_text_arguments,
        common.add_model_spec_argument,
        partial(common.add_top_k_argument, default=5,
                what="predictions kept per cell in --json", hi=100),
        common.add_json_argument,
        common.option("--out", default=None, metavar="FILE.png",
                      type=common.arg(output_file), help="PNG to write"),
        partial(common.add_runtime_arguments, device="cpu"),
    )  # fmt: skip


def _lens(args: argparse.Namespace) -> int:
    """the logit lens: each layer's next-token predictions (table, JSON, PNG grid)

    Run a decoder on a text and read every layer's hidden state through the model's final norm
    and LM head: the top next-token predictions per layer and position, the last layer being
    the model's own output. Prints a table (last layer on top), or --json; --out draws a layer
    x position grid coloured by probability."""
    import json

    from attnlm.base.device import resolve_device
    from attnlm.inspect.lens import logit_lens, plot_lens
    from attnlm.loading.sources import resolve

    text = common.literal_or_file(args)
    common.use_threads(args)
    model, tok, info = resolve(args.model, resolve_device(args.device))
    lens = logit_lens(model, tok, text, k=args.top_k)
    if args.out:
        path = plot_lens(lens, args.out, f"logit lens, {info.family.type}: {args.model}")
    if args.json:
        print(json.dumps(lens.to_json(), ensure_ascii=False))
    else:
        print(lens.table())
    if args.out:
        import sys

        print(f"wrote {path} ({len(lens.layers)} rows x {len(lens.tokens)} positions)",
              file=sys.stderr if args.json else sys.stdout)  # fmt: skip
    return 0
