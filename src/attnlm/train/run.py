"""One training run end to end: device, data, model, optimizer, resume, loop, outputs.

``train_run`` is what ``attnlm train`` calls; it is also usable from Python. Under ``torchrun``
each process calls it; rank 0 prepares the data first, the others wait and then load it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from attnlm.config import from_dict
from attnlm.data.windows import Windows
from attnlm.errors import ConfigError, InputError
from attnlm.train import distributed as D
from attnlm.train.checkpoint import (
    CHECKPOINT_DIR,
    build_model,
    read_config,
    resolve_checkpoint,
)
from attnlm.train.config import RESUMABLE_CHANGES, RunSpec, TrainConfig
from attnlm.train.data import prepare
from attnlm.train.optim import make_optimizer
from attnlm.train.trainer import MetricsLog, Trainer, TrainResult, TrainState

METRICS_FILE = "metrics.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"


def resolve_device(spec: str, dist: D.DistInfo | None = None) -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; under torchrun each rank uses its local GPU."""
    dist = dist or D.DistInfo()
    if spec == "auto":
        if torch.cuda.is_available():
            spec = "cuda"
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            spec = "mps"
        else:
            spec = "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("train.device is cuda but no CUDA GPU is available")
        if spec == "cuda":
            spec = f"cuda:{dist.local_rank}"
    if spec == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("train.device is mps but MPS is not available")
    return torch.device(spec)


def check_model_table(model: dict[str, Any]) -> None:
    """Validate a ``[model]`` table before any data work (vocab_size comes later)."""
    from attnlm.models.gpt import GPTConfig

    from_dict(GPTConfig, {**model, "vocab_size": 1}, where="model")


def _barrier(dist: D.DistInfo) -> None:
    if dist.enabled:
        torch.distributed.barrier()


def checkpoint_config(spec: RunSpec, model_cfg: Any) -> dict[str, Any]:
    return {
        "model_type": "gpt",
        "preset": spec.preset,
        "model": dataclasses.asdict(model_cfg),
        "train": dataclasses.asdict(spec.train),
    }


def resume_spec(run_dir: Path, requested: RunSpec | None) -> RunSpec:
    """The spec to continue ``run_dir`` with; refuses changes that would alter the run."""
    stored = read_config(resolve_checkpoint(run_dir))
    stored_model = dict(stored["model"])
    stored_train = from_dict(TrainConfig, stored["train"], where="train")
    if requested is None:
        return RunSpec(model=stored_model, train=stored_train, preset=stored.get("preset", ""))
    model_req = {**stored_model, **requested.model, "vocab_size": stored_model["vocab_size"]}
    for key in sorted(set(stored_model) | set(model_req)):
        if stored_model.get(key) != model_req.get(key):
            raise ConfigError(
                f"cannot resume {run_dir}: model.{key} is {stored_model.get(key)!r} in the "
                f"checkpoint but {model_req.get(key)!r} was requested; start a new run (--out)"
            )
    old, new = dataclasses.asdict(stored_train), dataclasses.asdict(requested.train)
    for key in old:
        if key not in RESUMABLE_CHANGES and old[key] != new[key]:
            raise ConfigError(
                f"cannot resume {run_dir}: train.{key} is {old[key]!r} in the checkpoint but "
                f"{new[key]!r} was requested; start a new run (--out)"
            )
    return RunSpec(model=stored_model, train=requested.train, preset=stored.get("preset", ""))


def train_run(spec: RunSpec, run_dir: str | Path, resume: bool = False, log=print) -> TrainResult:
    """Train (or resume) a GPT in ``run_dir``; returns the result on every rank."""
    from safetensors.torch import load_model

    run_dir = Path(run_dir)
    cfg = spec.train
    check_model_table(spec.model)
    dist = D.from_env()
    device = resolve_device(cfg.device, dist)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    D.init(dist, device.type)
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if dist.is_main:
            data = prepare(run_dir, cfg)
        _barrier(dist)
        if not dist.is_main:
            data = prepare(run_dir, cfg)
        if dist.is_main:
            log(data.stats_line())
        torch.manual_seed(cfg.seed)
        model, model_cfg = build_model({**spec.model, "vocab_size": data.tokenizer.vocab_size})
        if dist.rank:
            torch.manual_seed(cfg.seed + dist.rank)  # dropout differs per rank
        model.to(device)
        block = int(model_cfg.block_size)
        train_w = Windows(data.train.open(), block)
        val_w = Windows(data.val.open(), block)
        opt = make_optimizer(model, cfg, device.type)
        trainer = Trainer(
            model,
            opt,
            cfg,
            train_w,
            val_w,
            data.val.chars_per_token,
            run_dir,
            checkpoint_config(spec, model_cfg),
            data.tokenizer,
            device,
            dist=dist,
            log=log,
        )
        keep_until = None
        if resume:
            ckpt = resolve_checkpoint(run_dir)
            try:
                load_model(model, str(ckpt / "model.safetensors"), strict=True, device=str(device))
            except Exception as e:  # noqa: BLE001
                raise InputError(f"{ckpt}/model.safetensors: missing or corrupt ({e})") from None
            try:
                sd = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
                trainer.load_state_dict(sd)
            except Exception as e:  # noqa: BLE001
                raise InputError(f"{ckpt}/state.pt: missing or corrupt ({e})") from None
            keep_until = trainer.state.step
            if dist.is_main:
                log(f"resuming {run_dir} from step {trainer.state.step}")
        else:
            trainer.state = TrainState()
        n_params = sum(p.numel() for p in model.parameters())
        if dist.is_main:
            log(
                f"model: {n_params / 1e6:.2f}M parameters, {model_cfg.n_layer} layers, "
                f"{model_cfg.n_head} heads, width {model_cfg.n_embd}, block {block}, "
                f"positions {getattr(model_cfg, 'positions', '?')}; device {device}"
                + (f", {dist.world_size} processes" if dist.enabled else "")
            )
        metrics = MetricsLog(run_dir / METRICS_FILE, dist.is_main, keep_until)
        trainer.wrap(ddp=True, compile=cfg.compile)
        result = trainer.fit(metrics)
        if dist.is_main:
            _loss_curve(run_dir, metrics.records)
        _barrier(dist)  # leave together: no rank tears the group down under another
        return result
    finally:
        D.shutdown(dist)


def _loss_curve(run_dir: Path, records: list[dict[str, Any]]) -> None:
    from attnlm.inspect.heatmap import plot_loss_curve

    if records:
        plot_loss_curve(records, run_dir / LOSS_CURVE_FILE, title=f"{run_dir.name}: loss")


def new_run_dir_check(run_dir: Path) -> None:
    """Refuse to start a new run over an existing checkpoint (use --resume instead)."""
    if (run_dir / CHECKPOINT_DIR).exists() or (run_dir / f"{CHECKPOINT_DIR}.old").exists():
        raise InputError(
            f"{run_dir} already holds a checkpoint; continue it with --resume {run_dir} "
            "or choose another --out"
        )
