"""``attnlm export``: a model (an attnlm run, a Hugging Face folder, a GGUF file ...) written
in another format: a GGUF file llama.cpp runs (``--gguf``) or a Hugging Face folder
(``--out``). One function per target (:data:`TARGETS`), each given the resolved model."""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.validate import output_dir, output_file
from attnlm.cli.common import (
    add_command,
    add_json_argument,
    add_model_spec_argument,
    add_overwrite_argument,
    add_runtime_arguments,
    arg,
    flag,
    one_of,
    option,
    use_threads,
)

GGUF_TYPES = ("f32", "f16", "q8_0", "q4_0")


# the model, where it is written (one of two targets), how
OPTIONS = (
    add_model_spec_argument,
    one_of(
        option("--gguf", metavar="OUT.gguf", type=arg(output_file),
               help="write a GGUF file (llama and gpt models, byte-level BPE tokenizers)"),
        option("--out", metavar="DIR", type=arg(output_dir), help="write a Hugging Face folder"),
        required=True,
    ),
    option("--type", choices=GGUF_TYPES, default=None,
           help="GGUF matrix type (default f32; 1-D tensors stay f32, and matrices whose rows are "
           "not a multiple of 32 long are stored f16 under q8_0 / q4_0)"),
    flag("--merge", "a LoRA run (train --lora): fold the adapters into the base (W + scale B A) "
         "and write the merged model"),
    partial(add_overwrite_argument, what="replace an existing output"),
    add_json_argument,
    partial(add_runtime_arguments, device="cpu"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "export", _export, *OPTIONS)


def _export(args: argparse.Namespace) -> int:
    """write a model as a GGUF file (llama.cpp) or a Hugging Face folder

    --gguf OUT.gguf writes a llama or gpt model and its byte-level BPE tokenizer (and chat
    template) in the layout llama.cpp reads, with matrices in --type (f32, f16, q8_0, q4_0);
    --out DIR writes a Hugging Face folder that transformers (AutoTokenizer,
    AutoModelForCausalLM), lm-evaluation-harness and TransformerLens open whole: config.json,
    safetensors, generation_config.json and the tokenizer as tokenizer.json,
    tokenizer_config.json (special tokens, chat template) and special_tokens_map.json (GGUF
    vocabularies, byte-level BPE of any pattern, Hugging Face tokenizer.json, WordPiece and
    char tokenizers; word-level and classic BPE ones have no tokenizer.json form). A LoRA run
    needs --merge: its adapters are merged into the base model's weights and the output holds a
    plain model. An existing output is kept unless --overwrite is given."""
    from attnlm.base.device import resolve_device
    from attnlm.loading.sources import resolve

    target = "gguf" if args.gguf is not None else "hf"
    if args.type is not None and target != "gguf":
        raise InputError("--type applies to --gguf only")
    out = Path(args.gguf if target == "gguf" else args.out)
    _check_overwrite(out, target, args.overwrite)
    lora = _is_lora_run(args.model)
    if lora and not args.merge:
        raise InputError(f"{args.model}: a LoRA run; add --merge to write the merged model")
    use_threads(args)
    # float32 weights (the writer quantizes itself); a LoRA run comes back merged
    found = resolve(args.model, resolve_device(args.device), weights="f32")
    summary = TARGETS[target](found, out, args)
    summary = {"model": args.model, "out": str(out), "lora_merged": lora, **summary}
    if args.json:
        print(json.dumps(summary))
    else:
        detail = ", ".join(f"{n} {t}" for t, n in summary.get("types", {}).items())
        if target == "hf" and not summary["tokenizer"]:
            detail = f"no tokenizer files: {summary.get('tokenizer_note', 'none written')}"
        merged = ", LoRA adapters merged" if lora else ""
        print(f"wrote {out} ({summary['format']}{merged}{': ' + detail if detail else ''})")
    return 0


def _is_lora_run(spec: str) -> bool:
    """Whether ``spec`` is an attnlm run that stores LoRA adapters only."""
    from attnlm.loading.checkpoint import read_config, resolve_checkpoint

    try:
        return isinstance(read_config(resolve_checkpoint(spec)).get("lora"), dict)
    except (InputError, OSError):
        return False  # not an attnlm run: resolve() names the problem


def _check_overwrite(out: Path, target: str, overwrite: bool) -> None:
    from attnlm.loading.checkpoint import CHECKPOINT_DIR

    if target == "hf" and (out / CHECKPOINT_DIR).is_dir():  # its config.json would win over it
        raise InputError(
            f"{out}: holds an attnlm run ({CHECKPOINT_DIR}/); a Hugging Face folder written "
            "into it would hide the run: choose another --out"
        )
    exists = out.exists() if target == "gguf" else (out / "config.json").exists()
    if exists and not overwrite:
        raise InputError(f"{out}: already exists (pass --overwrite to replace it)")


def _to_gguf(found: Any, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from attnlm.models.gguf.writer import export_gguf

    model, tok, info = found
    template = info.chat_template.source if info.chat_template is not None else None
    kind = args.type or "f32"
    done = export_gguf(model, tok, out, kind, chat_template=template, name=Path(args.model).stem)
    return {"format": f"gguf {done['architecture']} {kind}", **done}


def _to_hf(found: Any, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from attnlm.models import save_hf
    from attnlm.models.hf.tokenizer_files import source_sampling, write_tokenizer_files

    model, tok, info = found
    template = info.chat_template.source if info.chat_template is not None else None
    sampling = source_sampling(info.path)
    wrote: list[str] = []
    notes: list[str] = []

    def tokenizer_files(folder: Path) -> None:  # into the new folder, before it replaces out
        wrote.extend(write_tokenizer_files(tok, folder, model.config, chat_template=template,
                                           sampling=sampling, notes=notes))  # fmt: skip

    save_hf(model.cpu(), out, files=tokenizer_files)
    summary: dict[str, Any] = {
        "format": "huggingface",
        "tokenizer": wrote[0] if wrote else None,  # tokenizer.json; Marian: source.spm
        "files": wrote,
    }
    if notes:
        summary["tokenizer_note"] = notes[0]
    return summary


#: ``--gguf`` / ``--out`` -> the function that writes it ``(resolved, out, args) -> summary``
TARGETS = {"gguf": _to_gguf, "hf": _to_hf}
