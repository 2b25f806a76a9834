"""``attnlm models`` (the registered model families and their presets) and ``attnlm params``
(parameter counts of a preset, per module, with the lecture's ``12·L·d²`` estimate)."""

from __future__ import annotations

import argparse
from functools import partial

from attnlm.base.foreign import shapes_only
from attnlm.base.validate import positive_int
from attnlm.cli.common import (
    add_command,
    add_json_argument,
    add_model_spec_argument,
    add_options,
    add_preset_argument,
    arg,
    defaults,
    flag,
    one_of,
    option,
)

# Used when a preset leaves the vocabulary to its tokenizer (character presets), gives no
# train.bpe_vocab_size, and no --vocab-size is given: a byte-sized vocabulary.
DEFAULT_VOCAB_SIZE = 256


PARAMS_HELP = "parameter counts of a model preset or a model"
PARAMS_DESCRIPTION = (
    "Print a model's parameter count per module, the exact total and, for transformers, the "
    "12·L·d² estimate (for Llama its own formula) and the KV-cache bytes per token of decoders. "
    "--preset builds the preset's model without allocating weights; presets without "
    "model.vocab_size (the tokenizer decides it) use --vocab-size, else train.bpe_vocab_size, "
    f"else {DEFAULT_VOCAB_SIZE}. --model SPEC counts a real model; a GGUF file is counted from "
    "its header (with the bytes each tensor type takes), without loading the weights."
)


def register(sub: argparse._SubParsersAction) -> None:
    add_command(
        sub, "models", _models, add_json_argument,
        flag("--available", "list the model names --model takes (registered names and Hub "
             "repositories in the Hugging Face cache): where each comes from, its licence and "
             "size, and whether it is cached"),
    )  # fmt: skip
    p = sub.add_parser("params", help=PARAMS_HELP, description=PARAMS_DESCRIPTION)
    add_options(
        p,
        one_of(add_preset_argument, partial(add_model_spec_argument, required=False),
               required=True),
        option("--vocab-size", type=arg(positive_int),
               help="vocabulary size: overrides model.vocab_size"),
        defaults(func=_params),
    )  # fmt: skip


def families_table() -> list[dict]:
    """One dict per registered family (what ``attnlm models --json`` prints)."""
    from attnlm.models import registry
    from attnlm.models.hf import model_types

    return [
        {
            "type": f.type,
            "description": f.description,
            "objective": f.objective,
            "capabilities": sorted(f.capabilities),
            "hf_model_types": model_types(f.model),
            "config": f.config.__name__,
            "presets": registry.presets_of(f.type),
        }
        for f in registry.families()
    ]


def _available(as_json: bool) -> int:
    import json

    from attnlm.loading.sources import available

    rows = available()
    if as_json:
        print(json.dumps({"available": rows}, indent=1))
        return 0
    for r in rows:
        state = f"cached: {r['path']}" if r["cached"] else "not cached (fetched on first use)"
        print(f"{r['name']}: {r['description'] or r['source']}")
        size = f"; {r['size'] / 2**20:,.0f} MiB" if r.get("size") else ""
        print(
            f"  from: {r['source']}" + (f"; license {r['license']}" if r["license"] else "") + size
        )
        print(f"  {state}")
    return 0


def _models(args: argparse.Namespace) -> int:
    """list the model families and their presets

    List every registered model family: its type name (the [model] type of presets and checkpoints),
    training objective, capabilities, Hugging Face model types it loads, and the built-in presets
    that use it."""
    import json

    if args.available:
        return _available(args.json)
    rows = families_table()
    if args.json:
        print(json.dumps({"families": rows}, indent=1))
        return 0
    for r in rows:
        print(f"{r['type']}: {r['description']}")
        print(f"  objective: {r['objective']}; can: {', '.join(r['capabilities'])}")
        if r["hf_model_types"]:
            print(f"  loads Hugging Face: {', '.join(r['hf_model_types'])}")
        print(f"  presets: {', '.join(r['presets']) or '(none)'}")
    return 0


def _params(args: argparse.Namespace) -> int:
    import torch

    from attnlm.base.config import load_preset
    from attnlm.base.errors import ConfigError
    from attnlm.models import registry

    if args.model is not None:
        return _model_params(args.model)
    preset = load_preset(args.preset)
    if "model" not in preset:
        raise ConfigError(f"preset {args.preset!r} has no [model] table")
    data = dict(preset["model"])
    note = ""
    if args.vocab_size is not None:
        data["vocab_size"] = args.vocab_size
    elif "vocab_size" not in data:
        bpe = preset.get("train", {}).get("bpe_vocab_size")
        sized = isinstance(bpe, int) and bpe > 0  # 0: sized from the data when training
        source = "train.bpe_vocab_size" if sized else "the default"
        size = bpe if sized else DEFAULT_VOCAB_SIZE
        note = (
            f"(model.vocab_size is not in the preset; using {size} from "
            f"{source}, pass --vocab-size to change it)"
        )
        data = registry.complete_table(data, vocab_size=size)
    with shapes_only(), torch.device("meta"):  # shapes only: no memory, no initialisation
        family, config = registry.make_config(data)
        model = family.model(config)
    _print_params(f"preset {args.preset}", family, config, model, note)
    return 0


def _model_params(spec: str) -> int:
    """``params --model SPEC``: a GGUF file from its header (the model built on the meta
    device, no weights read), any other model loaded."""
    import torch

    from attnlm.loading.sources import gguf_file, load_as_checkpoint

    path = gguf_file(spec, lookup=True)
    if path is None:
        ck = load_as_checkpoint(spec)
        _print_params(f"model {spec}", ck.family, ck.model.config, ck.model)
        return 0
    from attnlm.models import gguf, registry

    with shapes_only(), torch.device("meta"):
        family, config = registry.make_config(gguf.read_config(path))
        model = family.model(config)
    _print_params(f"model {path}", family, config, model, backend=_engine_backend(path))
    stats = gguf.tensor_stats(path)
    total = sum(r["bytes"] for r in stats["by_type"].values())
    print(
        f"in the file: {stats['parameters']:,} parameters in "
        f"{sum(r['tensors'] for r in stats['by_type'].values())} tensors, {total / 2**20:,.1f} MiB"
    )
    print(f"{'type':<8}{'tensors':>9}{'parameters':>15}{'MiB':>10}{'bits/param':>12}")
    for name, r in stats["by_type"].items():
        bits = 8 * r["bytes"] / r["parameters"] if r["parameters"] else 0.0
        mib = r["bytes"] / 2**20
        print(f"{name:<8}{r['tensors']:>9}{r['parameters']:>15,}{mib:>10,.1f}{bits:>12.2f}")
    return 0


def _engine_backend(path) -> tuple[str, str] | None:
    """``("c-engine", why)`` where ``generate``/``chat`` on this GGUF file run on the C engine
    (the planner's rule, :func:`attnlm.runtime.planner.engine_reason`), else None."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.runtime.engine_gguf import engine_format
    from attnlm.runtime.planner import engine_reason

    ok, reason = engine_reason(engine_format(GGUFFile(path), None), "auto")
    return ("c-engine", reason) if ok else None


def _print_params(what: str, family, config, model, note: str = "", backend=None) -> None:
    """The parameter table of ``model`` and, for a model that generates, the backend its
    decoding runs on and why (``backend``: the resolver's choice where it is not the
    planner's PyTorch one)."""
    from attnlm.inspect.params import format_kv_cache, format_llama_lines, format_param_table
    from attnlm.runtime.planner import choose

    print(f"{what}: {family.describe(config) if family.describe else family.type}")
    if note:
        print(note)
    # the 12·L·d² estimate counts GPT-style blocks: only for families with attention heads
    # (Llama's blocks have their own formula)
    heads = hasattr(config, "n_head")
    llama = hasattr(config, "n_kv_head")
    n_layer = getattr(config, "n_layer", None) if heads and not llama else None
    width = getattr(config, "n_embd", None) or getattr(config, "d_model", None)
    print(format_param_table(model, n_layer, width))
    if llama:
        print(format_llama_lines(config))
    if heads and "generate" in family.capabilities and hasattr(config, "n_layer"):
        print(format_kv_cache(config))
    if "generate" in family.capabilities:
        name, reason = backend or choose(model)
        print(f"decoding backend: {name} ({reason})")
