"""``attnlm lens``: the logit lens of a decoder on a text (each layer read through the final
norm and the LM head)."""

from __future__ import annotations

import argparse

from attnlm.cli import common
from attnlm.validate import int_in_range, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = common.add_command(sub, "lens", _lens)
    p.add_argument("text", nargs="?", default=None, type=common.text_value, help="the text")
    common.add_model_spec_argument(p)
    p.add_argument(
        "--text",
        dest="text_file",
        default=None,
        metavar="PATH",
        type=common.text_file(),
        help="read the text from a file instead",
    )
    p.add_argument(
        "--top",
        type=common.arg(int_in_range, lo=1, hi=100),
        default=5,
        metavar="K",
        help="predictions kept per cell in --json (5)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--out", default=None, metavar="FILE.png", type=common.arg(output_file), help="PNG to write"
    )
    common.add_runtime_arguments(p, device="cpu")


def _lens(args: argparse.Namespace) -> int:
    """the logit lens: each layer's next-token predictions (table, JSON, PNG grid)

    Run a decoder on a text and read every layer's hidden state through the model's final norm
    and LM head: the top next-token predictions per layer and position, the last layer being
    the model's own output. Prints a table (last layer on top), or --json; --out draws a layer
    x position grid coloured by probability."""
    import json

    from attnlm.device import resolve_device
    from attnlm.errors import InputError
    from attnlm.inspect.lens import logit_lens, plot_lens
    from attnlm.sources import resolve

    if (args.text is None) == (args.text_file is None):
        raise InputError("give the text, or --text PATH (one of them)")
    if args.text_file is not None:
        from attnlm.fileio import read_file_text

        text = read_file_text(args.text_file, "text file", InputError).rstrip("\n")
    else:
        text = args.text
    common.use_threads(args)
    model, tok, info = resolve(args.model, resolve_device(args.device))
    lens = logit_lens(model, tok, text, k=args.top)
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
