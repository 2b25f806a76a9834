"""The fine-tuning options of ``attnlm train`` (:mod:`attnlm.train.finetune`): registered by
:func:`add_arguments` and :func:`add_lora_arguments`, turned into the run's starting tables
by :func:`base_tables`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.validate import finite_float, non_negative_int, positive_float, positive_int
from attnlm.cli.common import arg, as_given, flag, option, section, text_file

# CLI flag (argparse dest) -> TrainConfig field
FLAGS = {
    "init_from": "init_from",
    "block_size": "block_size",
    "freeze_embeddings": "freeze_embeddings",
    "freeze_layers": "freeze_layers",
    "chat_data": "chat_data",
    "lora": "lora",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_targets": "lora_targets",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The fine-tuning options: ``--init-from SPEC`` and what it trains (``--block-size``,
    ``--freeze-embeddings``, ``--freeze-layers``, ``--chat-data``)."""
    section(
        "fine-tuning",
        option("--init-from", default=None, metavar="SPEC", type=text_file(as_given),
               help="start from a pretrained model (what --model takes: a run, a Hugging Face "
               "folder, a .gguf file, a name such as smollm2-135m-instruct, a Hub id): its "
               "architecture, weights and tokenizer; the data is encoded with that tokenizer"),
        option("--block-size", type=arg(positive_int), default=None, metavar="N",
               help="training window in tokens (default: the model's; 256 at most with "
               "--init-from)"),
        flag("--freeze-embeddings", "train without updating the token and position embeddings "
             "(and a tied output head)", default=None),
        option("--freeze-layers", type=arg(non_negative_int), default=None, metavar="N",
               help="train without updating the first N blocks"),
        option("--chat-data", default=None, metavar="FILE.jsonl", type=text_file(as_given),
               help='conversations, one {"messages": [{"role": ..., "content": ...}, ...]} per '
               "line, rendered with the model's chat template; the loss counts assistant tokens "
               "only (needs --init-from a model with a chat template)"),
        flag("--show-defaults", "print the fine-tuning defaults of every machine class (this "
             "machine's marked *) and exit; a run without a preset takes its class's and says "
             "which in its first lines", default=False),
    )(p)  # fmt: skip


def init_spec(value: str) -> str:
    """An existing path as an absolute one (the run may be resumed from elsewhere); a name or
    Hub id as given."""
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


# the flags (argparse dest -> TrainConfig field) that state a setting a machine class's recipe
# also sets (attnlm.train.defaults)
RECIPE_FLAGS = {
    name: name
    for name in (
        "lr",
        "batch_size",
        "block_size",
        "lora_alpha",
        "lora_dropout",
        "lora_targets",
        "backward_precision",
        "eval_iters",
    )  # fmt: skip
}
BARE_LORA = -1  # ``--lora`` without a rank: the machine class's


def lora_rank(args: argparse.Namespace) -> int | None:
    """``--lora``'s rank: as given, or for a bare ``--lora`` this machine's recipe's."""
    value = getattr(args, "lora", None)
    if value != BARE_LORA:
        return value
    from attnlm.train.defaults import machine_class, recipe

    return recipe(machine_class(getattr(args, "device", None)).name, "lora").rank


def show_defaults(args: argparse.Namespace) -> None:
    """``attnlm train --show-defaults``: the table, this machine's class marked."""
    from attnlm.train.defaults import machine_class, table_lines

    machine = machine_class(getattr(args, "device", None))
    print(f"machine class: {machine.name} ({machine.why})")
    for line in table_lines(machine.name):
        print(line)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """Recipe settings the command line states (flags and ``--set train.KEY=...``)."""
    from attnlm.base.config import parse_override

    given = {field: getattr(args, dest) for dest, field in RECIPE_FLAGS.items()
             if getattr(args, dest, None) is not None}  # fmt: skip
    for text in getattr(args, "set", None) or []:
        key, value = parse_override(text)
        table, _, name = key.rpartition(".")
        if table in ("", "train"):
            given[name] = value
    return given


def base_tables(args: argparse.Namespace, load_preset: Any) -> dict[str, Any]:
    """The preset tables a ``--init-from`` run starts with: the preset's when one is given
    (its [model] fields are then checked against the pretrained model), else no model fields
    and this machine class's fine-tuning recipe (:mod:`attnlm.train.defaults`), said in the
    run's first lines."""
    from attnlm.train.defaults import chosen_train_table, describe, machine_class

    if getattr(args, "tokenizer", None) is not None:
        raise InputError("--init-from brings the model's own tokenizer; leave out --tokenizer")
    if args.preset:
        tables = load_preset(args.preset)
        train = dict(tables.get("train", {}))
        train.pop("tokenizer", None)  # the model's own replaces it
        return {**tables, "train": train}
    machine = machine_class(getattr(args, "device", None))
    for line in describe(machine, getattr(args, "lora", None), _given(args)):
        print(line)
    return {"model": {}, "train": chosen_train_table(machine.name, getattr(args, "lora", None))}


def _lora_targets(value: str, name: str | None = None) -> str:
    from attnlm.lora.layers import parse_targets

    return ",".join(parse_targets(value))


def add_lora_arguments(p: argparse.ArgumentParser) -> None:
    """``--lora R`` and its settings (:mod:`attnlm.lora.layers`; defaults are peft's)."""
    section(
        "LoRA (with --init-from: adapters on the pretrained model)",
        option("--lora", type=arg(positive_int), default=None, metavar="R", nargs="?",
               const=BARE_LORA,
               help="train rank-R adapters beside the target layers, the base frozen (a bare "
               "--lora: this machine's default rank, see --show-defaults)"),
        option("--lora-alpha", type=arg(positive_float), default=None, metavar="A",
               help="scale of the update is A/R (default: this machine's, see --show-defaults)"),
        option("--lora-dropout", type=arg(finite_float, lo=0.0, hi=1.0, hi_open=True),
               default=None, metavar="P",
               help="dropout on the adapters' input, 0 <= P < 1 (default 0)"),
        option("--lora-targets", type=arg(_lora_targets), default=None, metavar="LIST",
               help="comma-separated: q,k,v,qkv,o,gate,up,down or all (default: this "
               "machine's, see --show-defaults)"),
    )(p)  # fmt: skip
