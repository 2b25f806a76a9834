"""``attnlm train``, ``attnlm eval`` and ``attnlm export-checkpoint``."""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from attnlm.base.errors import InputError
from attnlm.base.fileio import output_lock
from attnlm.base.validate import (
    existing_dir,
    int_in_range,
    non_negative_int,
    output_dir,
    positive_float,
    positive_int,
)
from attnlm.cli import finetune, tasks
from attnlm.cli.common import (
    add_command,
    add_corpus_arguments,
    add_data_dir_argument,
    add_device_argument,
    add_json_argument,
    add_model_spec_argument,
    add_overwrite_argument,
    add_pairs_argument,
    add_preset_argument,
    add_progress_argument,
    add_runtime_arguments,
    add_seed_argument,
    add_set_argument,
    add_text_argument,
    add_threads_argument,
    add_time_budget_argument,
    add_weights_argument,
    arg,
    as_given,
    defaults,
    flag,
    option,
    text_file,
    use_threads,
)

FINETUNE_FLAGS = finetune.FLAGS

if TYPE_CHECKING:  # the train package imports torch; the CLI loads it only when used
    from attnlm.train.config import RunSpec

DEFAULT_PRESET = "shakespeare-char"


# CLI flag (argparse dest) -> TrainConfig field
TRAIN_FLAGS = {
    "max_iters": "max_iters",
    "time_budget": "time_budget",
    "batch_size": "batch_size",
    "grad_accum": "grad_accum",
    "lr": "lr",
    "eval_interval": "eval_interval",
    "eval_iters": "eval_iters",
    "early_stop": "early_stop",
    "device": "device",
    "dtype": "dtype",
    "backward_precision": "backward_precision",
    "grad_checkpoint": "grad_checkpoint",
    "compile": "compile",
    "threads": "threads",
    "parallel": "parallel",
    "seed": "seed",
    "tokenizer": "tokenizer",
    "unk": "unk",
    "text": "text",
    "pairs": "pairs",
    "valid_pairs": "valid_pairs",
    "test_pairs": "test_pairs",
    "progress": "progress",
    "data_dir": "data_dir",
    "text_field": "text_field",
    "skip_bad": "skip_bad",
    "workers": "workers",
    "tokenizer_sample": "tokenizer_sample",
    **FINETUNE_FLAGS,
}
PATH_FLAGS = ("text", "pairs", "valid_pairs", "test_pairs", "data_dir", "chat_data")

_PRESET_NOTE = (
    f"default {DEFAULT_PRESET}; with --text and no preset, a tokenizer and model size chosen for "
    "the corpus, printed"
)
_FLOAT_TYPES = ["float32", "bfloat16"]

# ``attnlm train``: where the data comes from, the run folder, the loop, the machine
TRAIN_OPTIONS = (
    partial(add_preset_argument, note=_PRESET_NOTE),
    add_text_argument,
    add_data_dir_argument,
    add_pairs_argument,
    *(option(f"--{which}-pairs", metavar="PATH", default=None, type=text_file(as_given),
             help=f"a pairs file used as the {split} split as it is (then none is held out of "
             "--pairs)")
      for which, split in (("valid", "validation"), ("test", "test"))),
    option("--tokenizer", default=None, type=text_file(as_given),
           help="the tokenizer: char, bpe, wordpiece, gpt2, or a saved tokenizer JSON file"),
    flag("--unk", "char tokenizer: add <unk> for characters the corpus lacks, so `eval --text` "
         "works on other texts (also --set train.unk=true)", default=None),
    add_corpus_arguments,
    option("--out", default=None, metavar="DIR", type=arg(output_dir),
           help="run folder (default runs/PRESET)"),
    option("--resume", default=None, metavar="DIR", type=arg(existing_dir),
           help="continue the run in DIR"),
    partial(add_overwrite_argument, what="in a folder with a checkpoint"),
    option("--max-iters", type=arg(positive_int), default=None),
    partial(add_time_budget_argument, default=None),
    option("--batch-size", type=arg(positive_int), default=None),
    option("--grad-accum", type=arg(positive_int), default=None,
           help="micro-steps per step (all ranks)"),
    option("--lr", type=arg(positive_float), default=None),
    option("--eval-interval", type=arg(positive_int), default=None,
           help="steps between evaluations (default: the preset's)"),
    option("--eval-iters", type=arg(positive_int), default=None),
    option("--early-stop", type=arg(non_negative_int), default=None, metavar="N",
           help="stop after N evals without improvement"),
    partial(add_device_argument, default=None),
    option("--dtype", default=None, choices=_FLOAT_TYPES, help="bfloat16 = autocast"),
    option("--backward-precision", default=None, choices=_FLOAT_TYPES,
           help="bfloat16: the backward's matrix products of linear layers and the LM head on "
           "bfloat16 inputs (CPU with AMX or AVX512-BF16); the forward and the loss stay "
           "float32"),
    option("--grad-checkpoint", default=None, choices=("auto", "on", "off"),
           help="recompute each block's insides in the backward instead of keeping them "
           "(auto, the default: when they would take more than half the free memory)"),
    flag("--compile", "compile with torch.compile: the model's forward and backward",
         default=None),
    add_threads_argument,
    option("--parallel", default=None, choices=["ddp", "fsdp"],
           help="under torchrun: ddp (default; every process holds the model) or fsdp (FSDP2: "
           "parameters and optimizer state sharded, sharded checkpoints)"),
    add_seed_argument,
    partial(add_progress_argument, default=None),
    finetune.add_lora_arguments,
    partial(add_set_argument, example="e.g. model.n_layer=6 or train.min_lr=3e-4"),
    finetune.add_arguments,
)  # fmt: skip

# ``attnlm eval``: a model, the text, pairs or task it is scored on
EVAL_OPTIONS = (
    partial(add_model_spec_argument, checkpoint_synonym=True, repeatable=True),
    add_text_argument,
    add_pairs_argument,
    tasks.add_task_arguments,
    option("--beam", type=arg(positive_int), default=1, metavar="K",
           help="beam size (translation)"),
    option("--limit", type=arg(positive_int), default=None, metavar="N",
           help="translation: the first N distinct sources only; --task: the first N test "
           "examples"),
    option("--split", choices=["all", "val", "test"], default=None,
           help="text: the whole text (default with --text) or its validation split; "
           "translation: every pair (default with --pairs) or the test / validation split "
           "(default without --pairs: the run's own test split)"),
    option("--batch-size", type=arg(positive_int), default=16),
    option("--max-tokens", type=arg(int_in_range, lo=2), default=None,
           help="evaluate only the first N tokens (N >= 2)"),
    add_runtime_arguments,
    add_weights_argument,
    add_json_argument,
)  # fmt: skip

# ``attnlm export-checkpoint``: a sharded run written as an ordinary one
EXPORT_OPTIONS = (
    option("--checkpoint", required=True, metavar="DIR", type=arg(existing_dir),
           help="run or checkpoint folder"),
    option("--out", required=True, metavar="DIR", type=arg(output_dir), help="new run folder"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    # _train locks: on the main process of a torchrun only
    add_command(sub, "train", _train, *TRAIN_OPTIONS, defaults(lock_outputs=False))
    add_command(sub, "eval", _eval, *EVAL_OPTIONS)
    add_command(sub, "export-checkpoint", _export, *EXPORT_OPTIONS)


def _explicit(args: argparse.Namespace) -> list[tuple[str, object]]:
    """CLI flags given on the command line, as (TrainConfig field, value) pairs."""
    out = []
    for dest, field in TRAIN_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest in PATH_FLAGS:
            value = str(Path(value).expanduser().resolve())
        elif dest == "init_from":
            value = finetune.init_spec(value)
        elif dest == "lora":
            value = finetune.lora_rank(args)
        out.append((field, value))
    return out


def _spec(
    args: argparse.Namespace, base_tables: dict | None = None, preset: str | None = None
) -> RunSpec:
    from attnlm.base.config import load_preset
    from attnlm.train.config import apply_overrides, spec_from_tables

    if base_tables is None:
        base_tables = load_preset(args.preset or DEFAULT_PRESET)
    tables = apply_overrides(base_tables, args.set)
    train = dict(tables.get("train", {}))
    for field, value in _explicit(args):
        train[field] = value
    tables["train"] = train
    return spec_from_tables(tables, preset=preset or args.preset or DEFAULT_PRESET)


def _auto_spec(args: argparse.Namespace) -> RunSpec:
    """``--text`` without ``--preset``: a tokenizer and model size chosen for the corpus
    (:mod:`attnlm.train.auto`), printed in one line; explicit settings still win."""
    from attnlm.train.auto import auto_setup

    setup = auto_setup(args.text, args.tokenizer)
    print(setup.describe(Path(args.text).name))
    return _spec(args, setup.tables(), preset="auto")


def _train(args: argparse.Namespace) -> int:
    """train a model (any family: presets, resume, torchrun/DDP)

    Train the model family of a preset ([model] type, gpt by default) on a text; writes checkpoint/,
    metrics.jsonl and loss_curve.png into --out. Runs unchanged under torchrun for several
    processes."""
    from attnlm.train import distributed as D

    if args.show_defaults:
        finetune.show_defaults(args)
        return 0
    if not D.from_env().is_main:  # the main process holds the run folder's lock
        return _train_locked(args)
    if args.resume:
        folder = Path(args.resume)
    else:
        folder = Path(args.out) if args.out else None
    if folder is None:  # the folder is named after the preset: found once the spec is read
        return _train_locked(args)
    with output_lock(folder):
        return _train_locked(args)


def _train_locked(args: argparse.Namespace) -> int:
    from attnlm.base.config import load_preset
    from attnlm.loading.checkpoint import read_config, resolve_checkpoint
    from attnlm.train.run import new_run_dir_check, resume_spec, train_run

    if args.resume:
        run_dir = Path(args.resume)
        stored = read_config(resolve_checkpoint(run_dir))
        if args.out and Path(args.out).resolve() != run_dir.resolve():
            raise InputError("--resume continues in its own folder; leave out --out")
        if args.preset:
            base = load_preset(args.preset)
        else:
            model = {k: v for k, v in stored["model"].items() if k != "vocab_size"}
            base = {"model": model, "train": dict(stored["train"])}
        spec = resume_spec(run_dir, _spec(args, base))
        resume = True
    else:
        if getattr(args, "init_from", None):
            spec = _spec(args, finetune.base_tables(args, load_preset), args.preset or "init-from")
        else:
            spec = _auto_spec(args) if args.preset is None and args.text else _spec(args)
        run_dir = Path(args.out or Path("runs") / Path(spec.preset).stem)
        if not args.overwrite:
            new_run_dir_check(run_dir, spec)
        resume = False
    from contextlib import nullcontext

    from attnlm.train import distributed as D
    from attnlm.train.budget import count_from_process_start

    if getattr(args, "whole_process", False):  # --time-budget counts the imports too
        count_from_process_start()
    # the main process locks the folder (re-entrant: already held when --out or --resume
    # named it); the other ranks of a torchrun write nothing there themselves
    lock = output_lock(run_dir) if D.from_env().is_main else nullcontext()
    with lock:
        # --overwrite: the old checkpoint goes only once the new run's inputs are valid
        result = train_run(spec, run_dir, resume=resume, replace=bool(args.overwrite))

    if D.from_env().is_main:
        ev = result.last_eval
        tail = ""
        if ev is not None:
            tail = f"; val loss {ev.loss:.4f}"
            if ev.bpc is not None:
                tail += f", {ev.bpc:.4f} bits/char"
            elif ev.accuracy is not None:  # masked LM: bits per character are undefined
                tail += f", accuracy {ev.accuracy:.2%}"
        print(
            f"done: {result.step} steps ({result.stop_reason}) in {result.elapsed:.1f}s, "
            f"{result.tokens_per_s:,.0f} tokens/s{tail}"
        )
        before = result.first_eval
        if before is not None and ev is not None:
            what, a, b = "bits/char", before.bpc, ev.bpc
            if a is None or not b:  # conversations: the assistant tokens' loss
                what, a, b = "loss (nats/token)", before.loss, ev.loss
            print(f"held-out {what}: {a:.4f} before, {b:.4f} after "
                  f"({100.0 * (b - a) / a:+.2f}%)")  # fmt: skip
        print(f"run folder: {run_dir} (checkpoint/, metrics.jsonl, loss_curve.png)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    """loss, perplexity and bits per character of a checkpoint (BLEU and chrF for translation
    models)"""

    from attnlm.loading.evaluation import evaluate_checkpoint

    use_threads(args)
    if args.task is not None:
        return tasks.eval_task(args)
    tasks.refuse_task_options(args)
    if args.model is not None and len(args.model) > 1:  # side by side on one text
        from attnlm.cli.eval_side import eval_side_by_side

        return eval_side_by_side(args, _is_run, _docs_capped(args.max_tokens, 1000))
    spec = args.model[0] if args.model is not None else args.checkpoint
    # an attnlm run keeps its own data (the validation split, the pairs' test split); any
    # other model (a Hugging Face folder, a .gguf file, a name) is evaluated on --text
    args.checkpoint, args.model = (spec, None) if _is_run(spec) else (None, spec)
    if args.checkpoint is not None and _trains_on_pairs(args.checkpoint):
        return _eval_pairs(args)
    if args.model is not None and _is_translation_folder(args.model):
        if args.pairs is None:  # no run of its own: no stored test split
            raise InputError(f"{args.model}: a translation model is evaluated on --pairs FILE")
        args.checkpoint, args.model = args.model, None
        return _eval_pairs(args)
    if args.pairs is not None:
        raise InputError("--pairs applies to translation checkpoints; this one is a text model")
    if args.split == "test":
        raise InputError("--split test applies to translation checkpoints; a text has all, val")
    result, what = evaluate_checkpoint(
        args.checkpoint, args.text, args.split, args.batch_size,
        _docs_capped(args.max_tokens, 1000), args.device, model=args.model, weights=args.weights,
    )  # fmt: skip
    if args.json:
        print(json.dumps({**result.to_dict(), "data": what}))
    else:
        print(f"evaluated: {what}")
        print(f"loss: {result.loss:.4f} nats/token")
        print(f"perplexity: {result.ppl:.3f}")
        if result.bpc is not None:
            print(f"bits per character: {result.bpc:.4f}")
        print(f"bits per token: {result.bits_per_token:.4f}")
        if result.accuracy is not None:
            print(f"accuracy: {result.accuracy:.2%}")
        chars = f"  characters: {result.chars:,}" if result.bpc is not None else ""
        print(f"tokens: {result.tokens:,}{chars}")
        if result.unknown is not None:
            print(f"unknown (<unk>): {result.unknown:,} of the text's tokens")
    return 0


def _export(args: argparse.Namespace) -> int:
    """write a sharded (FSDP) checkpoint as an ordinary one

    Read the shards of a run trained with --parallel fsdp (in this one process, no torchrun) and
    write an ordinary checkpoint into OUT/checkpoint/: full weights and AdamW state, train.parallel
    = ddp, so OUT resumes in one process or under DDP."""
    from attnlm.train.fsdp import export_checkpoint

    path = export_checkpoint(args.checkpoint, args.out)
    print(f"exported {args.checkpoint} -> {path}")
    return 0


def _docs_capped(n: int | None, per_step: int) -> int | None:
    """``n`` (None: all), at most ``per_step`` x $ATTNLM_DOCS_BUDGET when that is set (the doc
    tests score a slice of a text, not all of it; the output says "first N tokens")."""
    from attnlm.base.validate import docs_budget

    cap = docs_budget()
    return n if cap is None else min(n or cap * per_step, cap * per_step)


def _is_run(spec: str) -> bool:
    """Whether SPEC is an attnlm run or checkpoint folder (not a Hugging Face folder)."""
    from attnlm.loading.checkpoint import resolve_checkpoint
    from attnlm.loading.sources import is_hf_folder

    path = Path(spec).expanduser()
    if not path.is_dir() or is_hf_folder(path):
        return False
    try:
        resolve_checkpoint(path)
    except InputError:
        return False
    return True


def _is_translation_folder(spec: str) -> bool:
    """Whether SPEC is a Hugging Face folder of a translation model (Marian)."""
    from attnlm.loading.sources import is_hf_folder
    from attnlm.models.hf.folder import read_hf_config
    from attnlm.models.hf.marian import MODEL_TYPE

    path = Path(spec).expanduser()
    return path.is_dir() and is_hf_folder(path) and (
        read_hf_config(path).get("model_type") == MODEL_TYPE)  # fmt: skip


def _trains_on_pairs(checkpoint: str) -> bool:
    """Whether the checkpoint's family trains on sentence pairs (its objective's data)."""
    from attnlm.loading.checkpoint import read_config, resolve_checkpoint
    from attnlm.loading.objectives import OBJECTIVES
    from attnlm.models import registry

    config = read_config(resolve_checkpoint(checkpoint))
    family, _ = registry.split_type(config["model"])
    return getattr(OBJECTIVES.get(family.objective), "data", "text") == "pairs"


def _eval_pairs(args: argparse.Namespace) -> int:
    from attnlm.loading.evaluation import evaluate_translation

    if args.text is not None or args.max_tokens is not None:
        raise InputError("a translation checkpoint is evaluated on --pairs, not --text")
    scores, what = evaluate_translation(
        args.checkpoint, args.pairs, args.beam, args.batch_size, None, args.device, args.limit,
        split=args.split,
    )  # fmt: skip
    if args.json:
        print(json.dumps({**scores, "data": what}))
        return 0
    print(f"evaluated: {what}")
    print(f"BLEU: {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"chrF: {scores['chrf']:.2f}  ({scores['chrf_signature']})")
    print(f"loss: {scores['loss']:.4f} nats/target token  perplexity: {scores['ppl']:.3f}")
    print(f"sentences: {scores['sentences']:,} sources, {scores['pairs']:,} pairs, "
          f"beam {scores['beams']}")  # fmt: skip
    for ex in scores["examples"]:
        print(f"  {ex['source']}  ->  {ex['hypothesis']}   (ref: {ex['references'][0]})")
    return 0
