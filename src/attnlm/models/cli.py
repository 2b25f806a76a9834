"""``attnlm params``: parameter counts of a model preset, per module, with the lecture's
``12·L·d²`` estimate beside the exact total."""

from __future__ import annotations

import argparse

# Used when a preset leaves the vocabulary to its tokenizer (character presets), gives no
# train.bpe_vocab_size, and no --vocab-size is given: a byte-sized vocabulary.
DEFAULT_VOCAB_SIZE = 256


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "params",
        help="parameter counts of a model preset",
        description=(
            "Build the model of a preset (no weights are allocated) and print its parameter "
            "count per module, the exact total and the 12·L·d² estimate. Presets without "
            "model.vocab_size (the tokenizer decides it) use --vocab-size, else "
            f"train.bpe_vocab_size, else {DEFAULT_VOCAB_SIZE}."
        ),
    )
    p.add_argument("--preset", required=True, help="built-in preset name or path to a TOML file")
    p.add_argument("--vocab-size", type=int, help="override model.vocab_size")
    p.set_defaults(func=_params)


def _params(args: argparse.Namespace) -> int:
    import torch

    from attnlm.config import from_dict, load_preset
    from attnlm.errors import ConfigError
    from attnlm.inspect.params import format_param_table
    from attnlm.models.gpt import GPT, GPTConfig

    preset = load_preset(args.preset)
    if "model" not in preset:
        raise ConfigError(f"preset {args.preset!r} has no [model] table")
    data = dict(preset["model"])
    note = ""
    if args.vocab_size is not None:
        data["vocab_size"] = args.vocab_size
    elif "vocab_size" not in data:
        bpe = preset.get("train", {}).get("bpe_vocab_size")
        source = "train.bpe_vocab_size" if isinstance(bpe, int) else "the default"
        data["vocab_size"] = bpe if isinstance(bpe, int) else DEFAULT_VOCAB_SIZE
        note = (
            f"(model.vocab_size is not in the preset; using {data['vocab_size']} from "
            f"{source}, pass --vocab-size to change it)"
        )
    config = from_dict(GPTConfig, data, where="model")
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = GPT(config)
    c = config
    print(
        f"preset {args.preset}: GPT, L={c.n_layer}, H={c.n_head}, d={c.n_embd}, "
        f"vocab={c.vocab_size}, context={c.block_size}, positions={c.positions}, "
        f"tied={'yes' if c.tie_embeddings else 'no'}"
    )
    if note:
        print(note)
    print(format_param_table(model, c.n_layer, c.n_embd))
    return 0
