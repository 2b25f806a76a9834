"""One training run end to end: device, data, model, objective, optimizer, resume, loop, outputs.

``train_run`` is what ``attnlm train`` calls; it is also usable from Python. The model family
comes from the preset's ``[model] type`` (:mod:`attnlm.models.registry`), the batches from that
family's objective (:mod:`attnlm.loading.objectives`); nothing here depends on a particular family.
Under ``torchrun`` each process calls it; rank 0 prepares the data first, the others wait and
then load it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlm.base.config import from_dict
from attnlm.base.device import resolve_device
from attnlm.base.errors import AttnlmError, ConfigError, InputError
from attnlm.loading.checkpoint import (
    CHECKPOINT_DIR,
    load_state,
    load_weights,
    read_config,
    resolve_checkpoint,
)
from attnlm.loading.evaluation import bos_windows
from attnlm.loading.objectives import OBJECTIVES, make_objective
from attnlm.lora.training import lora_model
from attnlm.models import registry
from attnlm.models.base import count_params
from attnlm.train import distributed as D
from attnlm.train.budget import run_origin
from attnlm.train.config import RESUMABLE_CHANGES, RunSpec, TrainConfig
from attnlm.train.data import prepare, prepare_pairs
from attnlm.train.finetune import (
    check_pair_fields,
    check_vocab,
    freeze,
    start_from,
    take_model,
)
from attnlm.train.fsdp import load_sharded, shard
from attnlm.train.job import MetricsLog, TrainJob, TrainResult, TrainState
from attnlm.train.optim import make_optimizer
from attnlm.train.trainer import Trainer

METRICS_FILE = "metrics.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"


def _barrier(dist: D.DistInfo) -> None:
    if dist.enabled:
        torch.distributed.barrier()


def objective_data(objective_name: str) -> str:
    """What an objective trains on: ``"text"`` (token streams) or ``"pairs"`` (its
    ``data`` attribute); this picks the data preparation of a run."""
    return getattr(OBJECTIVES.get(objective_name), "data", "text")


def _prepare(
    run_dir: Path,
    cfg: TrainConfig,
    kind: str,
    resume: bool = False,
    log: Any = None,
    extra: dict[str, Any] | None = None,
) -> Any:
    if cfg.chat_data is not None:
        return _prepare_chat(cfg, kind, extra or {})
    if kind == "pairs" and cfg.text is not None:
        raise ConfigError("this model family trains on sentence pairs: give --pairs, not --text")
    if kind != "pairs" and cfg.pairs is not None:
        raise ConfigError("--pairs applies to translation models; this family trains on --text")
    if kind == "pairs":
        return prepare_pairs(run_dir, cfg)
    return prepare(run_dir, cfg, resume=resume, log=log)


def _prepare_chat(cfg: TrainConfig, kind: str, extra: dict[str, Any]) -> Any:
    """Conversations (``--chat-data``) encoded with the ``--init-from`` model's tokenizer and
    chat template (:mod:`attnlm.train.chat_data`)."""
    from attnlm import tokenizers
    from attnlm.tokenizers.chat_template import ChatTemplate
    from attnlm.train.chat_data import prepare_chat

    if cfg.init_from is None:
        from attnlm.data.chat import read_conversations

        read_conversations(cfg.chat_data)  # a damaged file is named first
        raise ConfigError("--chat-data fine-tunes a pretrained chat model: give --init-from SPEC")
    if kind != "text":
        raise ConfigError("--chat-data trains causal language models (gpt, llama)")
    stored = extra.get("chat_template")
    template = None
    if stored:
        origin = f"{cfg.init_from}: chat template"
        template = ChatTemplate(stored["source"], stored.get("special_tokens"), origin=origin)
    return prepare_chat(cfg, tokenizers.load(cfg.tokenizer), template)


def _model_fields(data: Any) -> dict[str, Any]:
    """The ``[model]`` fields the prepared data decides (``vocab_size``, special ids)."""
    fields = getattr(data, "model_fields", None)
    return fields() if fields else {"vocab_size": data.tokenizer.vocab_size}


def _data_fields(model: dict[str, Any], data: Any) -> dict[str, Any]:
    """:func:`_model_fields`, checked against a preset that states them (``gpt2-small`` says
    ``vocab_size = 50257``: right for GPT-2's tokenizer, refused for any other)."""
    fields = _model_fields(data)
    for name, value in fields.items():
        if name in model and model[name] != value:
            raise ConfigError(
                f"model.{name} = {model[name]!r} in the preset, but the data gives {value!r} "
                f"(the tokenizer decides it): remove model.{name} or use a matching tokenizer"
            )
    return fields


def _sources(objective: Any, data: Any, kind: str, block_size: int = 0) -> tuple[Any, Any]:
    """Training and validation batch sources of the objective over the prepared data
    (``block_size``: text windows of that many tokens; 0 = the model's); windows start with
    the BOS of a tokenizer that puts one first (Gemma), as in evaluation."""
    if hasattr(data, "sources"):  # conversations: their own batches
        return data.sources(block_size)
    if kind == "pairs":
        return (
            objective.source(data.encoded("train"), data.target_chars("train")),
            objective.source(data.encoded("valid"), data.target_chars("valid")),
        )
    window, more = block_size or None, bos_windows(objective, data.tokenizer)
    return tuple(objective.source(np.asarray(s.open()), s.chars_per_token, window, **more)
                 for s in (data.train, data.val))  # type: ignore[return-value]  # fmt: skip


def checkpoint_config(
    spec: RunSpec, family: Any, model_cfg: Any, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a checkpoint's ``config.json`` holds; ``extra``: more top-level entries (a
    fine-tuned run's ``init_from`` record and ``chat_template``)."""
    return {
        "preset": spec.preset,
        "model": registry.config_table(family, model_cfg),
        "train": dataclasses.asdict(spec.train),
        **(extra or {}),
    }


def _with_type(table: dict[str, Any]) -> dict[str, Any]:
    return {"type": registry.DEFAULT_TYPE, **table}


def _check_time_left(run_dir: Path, cfg: TrainConfig, state: Any) -> None:
    """A resume whose wall-clock budget the earlier sessions already spent would stop at once
    (the budget counts over all sessions, as the learning-rate schedule does): refuse it in one
    line saying which flag gives it time (a run stopped by its budget: ``budget_stop``)."""
    budget = cfg.time_budget_s or 0.0
    spent = state.elapsed >= budget or 0 < budget <= state.budget_stop
    if budget and spent and state.step < cfg.max_iters:
        more = math.ceil(state.elapsed + max(60.0, 0.5 * budget))
        raise ConfigError(
            f"cannot resume {run_dir}: its time budget ({budget:g} s) is spent "
            f"({state.elapsed:.0f} s over its sessions, step {state.step} of {cfg.max_iters}); "
            f"the budget counts over all sessions: raise it, e.g. --time-budget {more}s"
        )


def resume_spec(run_dir: Path, requested: RunSpec | None) -> RunSpec:
    """The spec to continue ``run_dir`` with; refuses changes that would alter the run."""
    stored = read_config(resolve_checkpoint(run_dir))
    stored_model = _with_type(stored["model"])
    stored_train = from_dict(TrainConfig, stored["train"], where="train")
    if requested is None:
        return RunSpec(model=stored_model, train=stored_train, preset=stored.get("preset", ""))
    # fields the data decided (vocab_size) are the stored ones
    model_req = {**stored_model, **_with_type(requested.model)}
    if "vocab_size" in stored_model:
        model_req["vocab_size"] = stored_model["vocab_size"]
    for key in sorted(set(stored_model) | set(model_req)):
        if stored_model.get(key) != model_req.get(key):
            raise ConfigError(
                f"cannot resume {run_dir}: model.{key} is {stored_model.get(key)!r} in the "
                f"checkpoint but {model_req.get(key)!r} was requested; start a new run (--out)"
            )
    old, new = dataclasses.asdict(stored_train), dataclasses.asdict(requested.train)
    for key in old:
        if key not in RESUMABLE_CHANGES and old[key] != new[key]:
            hint = "start a new run (--out)"
            if key == "parallel" and old[key] == "fsdp":
                hint = "to continue without FSDP, attnlm export-checkpoint it first"
            raise ConfigError(
                f"cannot resume {run_dir}: train.{key} is {old[key]!r} in the checkpoint but "
                f"{new[key]!r} was requested; {hint}"
            )
    return RunSpec(model=stored_model, train=requested.train, preset=stored.get("preset", ""))


def _checked_spec(
    spec: RunSpec, run_dir: Path, resume: bool, log: Callable[..., Any]
) -> tuple[RunSpec, Any, dict[str, Any], Any]:
    """``(spec, init, extra, family)``: the spec to train, taken from the ``--init-from``
    source when there is one (``init``: the source, ``extra``: its ``config.json`` records),
    its ``[model]`` table checked and its family's data matching the files given."""
    cfg = spec.train
    init, extra = None, {}
    if cfg.init_from is not None:  # the architecture, weights and tokenizer of a pretrained model
        spec, init, extra = start_from(spec, run_dir, resume, D.from_env().is_main, log)
        cfg = spec.train
    # stand-ins for the fields the data decides, large enough for any special id
    registry.check_table(spec.model, vocab_size=1 << 16, src_vocab_size=1 << 16)
    family = registry.get(spec.model.get("type"))
    if objective_data(family.objective) != "pairs" and (cfg.valid_pairs or cfg.test_pairs):
        raise ConfigError(
            f"--valid-pairs/--test-pairs apply to translation families; {family.type} trains "
            "on text (its validation split is the last val_fraction of --text)"
        )
    return spec, init, extra, family


def _check_parallel(cfg: TrainConfig, dist: D.DistInfo) -> None:
    """Refuse the combinations of FSDP, LoRA and HMM EM with the launch that cannot run."""
    fsdp = cfg.parallel == "fsdp"
    if fsdp and not dist.launched:
        raise ConfigError(
            'train.parallel = "fsdp" shards the model across processes: start the run with '
            "torchrun --nproc_per_node N -m attnlm train ..."
        )
    if cfg.lora and not getattr(cfg, "init_from", None):
        raise ConfigError(
            "--lora puts adapters on a pretrained model: give it with --init-from SPEC"
        )
    if cfg.lora and fsdp:
        raise ConfigError("--lora trains the adapters without FSDP (use DDP or one process)")
    if cfg.hmm_em and (fsdp or dist.enabled):
        raise ConfigError("train.hmm_em runs in one process; start it without torchrun")


def _start_device(cfg: TrainConfig, dist: D.DistInfo) -> torch.device:
    """The run's device, made current, with the process group joined (FSDP always joins)."""
    device = resolve_device(cfg.device, dist.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    D.init(dist, device.type, always=cfg.parallel == "fsdp")
    return device


def _prepare_on_ranks(
    run_dir: Path,
    cfg: TrainConfig,
    kind: str,
    resume: bool,
    log: Callable[..., Any],
    extra: dict[str, Any],
    dist: D.DistInfo,
) -> Any:
    """The prepared data on every rank: rank 0 prepares it, the others wait and then load it."""
    if dist.is_main:
        data = _prepare(run_dir, cfg, kind, resume, log, extra)
    _barrier(dist)
    if not dist.is_main:
        data = _prepare(run_dir, cfg, kind, resume, extra=extra)
    if dist.is_main:
        log(data.stats_line())
    return data


def _build_model(
    spec: RunSpec,
    data: Any,
    kind: str,
    init: Any,
    extra: dict[str, Any],
    run_dir: Path,
    resume: bool,
    dist: D.DistInfo,
    log: Callable[..., Any],
) -> tuple[Any, Any, Any]:
    """``(model, model_cfg, family)``: the model built from the completed ``[model]`` table
    (or the ``--init-from`` source's own), with LoRA adapters when asked and layers frozen;
    the LoRA record goes into ``extra``."""
    cfg = spec.train
    if cfg.init_from is not None:
        table = spec.model  # the source's: complete, checked against the tokenizer
        if kind == "pairs":  # the special ids and vocabulary sizes are the model's
            check_pair_fields(_model_fields(data), table, cfg.init_from)
        else:
            check_vocab(data.tokenizer, table, cfg.init_from)
    else:
        table = registry.complete_table(spec.model, **_data_fields(spec.model, data))
    if init is not None:  # the source's own model: its weights are not copied
        model = take_model(init)
        model_cfg, family = model.config, registry.family_of(model)
    else:
        model, model_cfg, family = registry.build(table)
    if cfg.lora:  # adapters on the source model, the base frozen (lora/training.py)
        model, extra["lora"] = lora_model(model, cfg, init, run_dir, resume)
    frozen = freeze(model, cfg.freeze_embeddings, cfg.freeze_layers)
    if frozen and dist.is_main:
        log(f"frozen: {frozen / 1e6:.2f}M parameters (no gradients, no optimizer state)")
    return model, model_cfg, family


def _place_model(
    model: Any, cfg: TrainConfig, device: torch.device, dist: D.DistInfo
) -> int | None:
    """Seed dropout per rank and move the model to ``device``, sharded under FSDP; returns
    the number of FSDP units (None without FSDP)."""
    if dist.rank:
        torch.manual_seed(cfg.seed + dist.rank)  # dropout differs per rank
    model.to(device)
    if cfg.parallel == "fsdp":
        return shard(model, device)  # before the optimizer sees the parameters
    return None


def _em_fit_step(model: Any, cfg: TrainConfig) -> Any:
    """The model's own EM step under ``train.hmm_em`` (None otherwise)."""
    fit_step = getattr(model, "fit_step", None) if cfg.hmm_em else None
    if cfg.hmm_em and fit_step is None:
        raise ConfigError('train.hmm_em needs a model fitted by EM (model.type = "hmm")')
    return fit_step


def _start_state(trainer: Trainer, resume: bool) -> int | None:
    """Set the trainer's starting state: a fresh one, or on ``resume`` the checkpoint's
    weights (sharded under FSDP) and trainer state; returns the step the metrics log is kept
    up to (None for a new run)."""
    if not resume:
        trainer.state = TrainState()
        return None
    run_dir, cfg, dist = trainer.run_dir, trainer.cfg, trainer.dist
    ckpt = resolve_checkpoint(run_dir)
    if cfg.parallel == "fsdp":
        load_sharded(trainer.raw_model, trainer.opt, ckpt)
    else:
        load_weights(trainer.raw_model, ckpt, trainer.device)
    try:
        trainer.load_state_dict(load_state(ckpt))
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a state.pt of another shape
        raise InputError(f"{ckpt}/state.pt: does not fit this run ({e})") from None
    _check_time_left(run_dir, cfg, trainer.state)
    if dist.is_main:
        trainer.log(f"resuming {run_dir} from step {trainer.state.step}")
    return trainer.state.step


def _model_line(trainer: Trainer, model_cfg: Any, family: Any, units: int | None) -> str:
    """The log line that describes the trainer's model, its device and its parallelism
    (``units``: FSDP units, None without FSDP)."""
    what = family.describe(model_cfg) if family.describe else family.type
    n, device, dist = count_params(trainer.raw_model), trainer.device, trainer.dist
    return (
        f"model: {n / 1e6:.2f}M parameters, {what}; device {device}"
        + (f", {dist.world_size} processes" if dist.enabled else "")
        + (f", FSDP over {units} blocks + root" if units is not None else "")
    )


def _fit(trainer: Trainer, keep_until: int | None) -> TrainResult:
    """Run the trainer's loop (under DDP or FSDP, compiled when asked), then draw the loss
    curve; every rank leaves together."""
    run_dir, cfg, dist = trainer.run_dir, trainer.cfg, trainer.dist
    metrics = MetricsLog(run_dir / METRICS_FILE, dist.is_main, keep_until)
    trainer.wrap(ddp=cfg.parallel != "fsdp", compile=cfg.compile)
    result = trainer.fit(metrics)
    if dist.is_main:
        _loss_curve(run_dir, metrics.records)
    _barrier(dist)  # leave together: no rank tears the group down under another
    return result


def train_run(
    spec: RunSpec,
    run_dir: str | Path,
    resume: bool = False,
    log: Callable[..., Any] = print,
    on_step: Callable[[int], Any] | None = None,
    replace: bool = False,
) -> TrainResult:
    """Train (or resume) the model family of ``spec`` in ``run_dir``; returns the result on
    every rank. ``on_step(step)`` is called after each optimizer step. ``replace``: a new run
    over an old one; the old checkpoint is retired only after the data is prepared and the
    model built (bad input leaves the old run as it was), and deleted only once the new
    checkpoint is in place."""
    started = run_origin()  # the time budget counts the setup too (train/budget.py)
    run_dir = Path(run_dir)
    spec, init, extra, family = _checked_spec(spec, run_dir, resume, log)
    cfg, objective_name = spec.train, family.objective
    dist = D.from_env()
    _check_parallel(cfg, dist)
    device = _start_device(cfg, dist)
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        kind = objective_data(objective_name)
        data = _prepare_on_ranks(run_dir, cfg, kind, resume, log, extra, dist)
        torch.manual_seed(cfg.seed)
        model, model_cfg, family = _build_model(
            spec, data, kind, init, extra, run_dir, resume, dist, log
        )
        fsdp_units = _place_model(model, cfg, device, dist)
        fit_step = _em_fit_step(model, cfg)
        objective = make_objective(objective_name, data.tokenizer, model_cfg)
        train_src, val_src = _sources(objective, data, kind, cfg.block_size)
        if replace and not resume:
            _retire_old_checkpoint(run_dir, dist)
        trainer = Trainer(
            TrainJob(
                model=model,
                optimizer=make_optimizer(model, cfg, device.type),
                config=cfg,
                train=train_src,
                val=val_src,
                run_dir=run_dir,
                checkpoint_config=checkpoint_config(spec, family, model_cfg, extra),
                tokenizer=data.tokenizer,
                device=device,
                dist=dist,
                log=log,
                on_step=on_step,
                fit_step=fit_step,
                started=started,
            )
        )
        keep_until = _start_state(trainer, resume)
        if dist.is_main:
            log(_model_line(trainer, model_cfg, family, fsdp_units))
        return _fit(trainer, keep_until)
    finally:
        D.shutdown(dist)


def _loss_curve(run_dir: Path, records: list[dict[str, Any]]) -> None:
    from attnlm.inspect.heatmap import plot_loss_curve

    if records:
        plot_loss_curve(records, run_dir / LOSS_CURVE_FILE, title=f"{run_dir.name}: loss")


def _retire_old_checkpoint(run_dir: Path, dist: D.DistInfo) -> None:
    """``--overwrite``: the old checkpoint becomes ``checkpoint.old`` (rank 0 moves it, the
    others wait), which the new run's first save removes once its own checkpoint is in place
    (a kill before that leaves the old one, still found by
    :func:`attnlm.loading.checkpoint.resolve_checkpoint`)."""
    import shutil

    from attnlm.base.fileio import fsync_dir

    ckpt, old = run_dir / CHECKPOINT_DIR, run_dir / f"{CHECKPOINT_DIR}.old"
    if dist.is_main and ckpt.is_dir():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt, old)
        fsync_dir(run_dir)
    _barrier(dist)


_DATA_FIELDS = ("text", "data_dir", "pairs")  # what a run trains on


def _data_of(train: dict[str, Any]) -> str:
    """The corpus a run's train table names, in words (the built-in one when none)."""
    for name in _DATA_FIELDS:
        if train.get(name):
            return str(train[name])
    return "the built-in corpus"


def new_run_dir_check(run_dir: Path, spec: RunSpec | None = None) -> None:
    """Refuse to start a new run over an existing checkpoint, with the way out that fits:
    ``--resume`` only when the new run would train on the same data as the stored one,
    otherwise another ``--out`` or ``--overwrite``."""
    held = (run_dir / CHECKPOINT_DIR, run_dir / f"{CHECKPOINT_DIR}.old")
    if not any(p.exists() for p in held):
        return
    others = "choose another folder with --out NEW, or start over there with --overwrite"
    stored: dict[str, Any] | None = None
    try:
        stored = dict(read_config(resolve_checkpoint(run_dir)).get("train", {}))
    except AttnlmError:
        pass  # an unreadable checkpoint: the generic hint
    if spec is not None and stored is not None:
        new = dataclasses.asdict(spec.train)
        if _data_of(stored) != _data_of(new):
            raise InputError(
                f"{run_dir} already holds a run trained on {_data_of(stored)}, not "
                f"{_data_of(new)}: {others} (--resume continues a run on its own data)"
            )
    raise InputError(
        f"{run_dir} already holds a checkpoint: continue it with --resume {run_dir}, or {others}"
    )
