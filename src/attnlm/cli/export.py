"""``attnlm export``: write a model as a Hugging Face folder (a LoRA run merged first)."""

from __future__ import annotations

import argparse

from attnlm.cli.common import add_command, add_model_spec_argument, arg
from attnlm.errors import InputError
from attnlm.validate import output_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", _export)
    add_model_spec_argument(p)
    p.add_argument("--out", required=True, metavar="DIR", type=arg(output_dir),
                   help="the Hugging Face folder to write")  # fmt: skip
    p.add_argument("--merge", action="store_true",
                   help="a LoRA run: fold the adapters into the base (W + scale B A)")  # fmt: skip


def _export(args: argparse.Namespace) -> int:
    """Write a model as a Hugging Face folder (config.json, model.safetensors).

    A LoRA run (attnlm train --lora) needs --merge: its adapters are merged into the base
    model's weights, and the folder holds a plain model that transformers loads. The
    tokenizer is written in attnlm's tokenizer.json format next to the weights."""
    from attnlm.checkpoint import read_config, resolve_checkpoint
    from attnlm.models import save_hf
    from attnlm.sources import resolve

    lora = False
    try:
        lora = isinstance(read_config(resolve_checkpoint(args.model)).get("lora"), dict)
    except InputError:
        pass  # not an attnlm run: resolve() below names the problem
    if lora and not args.merge:
        raise InputError(f"{args.model}: a LoRA run; add --merge to write the merged model")
    model, tok, info = resolve(args.model)  # a LoRA run comes back merged
    save_hf(model, args.out)
    tok.save(f"{args.out}/tokenizer.json")
    what = " (LoRA adapters merged)" if lora else ""
    print(f"wrote {args.out}: {info.family.type} model{what}")
    return 0
