"""LoRA in a training run: the two calls :func:`attnlm.train.run.train_run` makes.

* A new run (``--init-from SPEC --lora R``): :func:`adapt` puts the adapters on the model
  loaded from SPEC (the base frozen, so the optimizer built afterwards holds the adapters
  only) and returns the ``"lora"`` table the run's ``config.json`` keeps (rank, alpha,
  dropout, targets, the base's SPEC and fingerprint: :mod:`attnlm.lora.run`).
* A resumed run: :func:`resume_model` loads the base again from the stored SPEC, checks its
  fingerprint and puts the adapters on it unmerged; the checkpoint's adapters are then loaded
  by :func:`attnlm.loading.checkpoint.load_weights` (which loads only adapters into an adapted
  model) and training continues.

The checkpoint writer (:func:`attnlm.loading.checkpoint.save_checkpoint`) stores only the adapters
of an adapted model, so nothing else is needed for checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlm.base.errors import ConfigError
from attnlm.lora.layers import apply_lora
from attnlm.lora.run import lora_table
from attnlm.models import registry
from attnlm.train.config import TrainConfig


def adapt(model: Any, cfg: TrainConfig, base_spec: str, base_path: Path) -> dict | None:
    """Put ``cfg``'s adapters on ``model`` (loaded from ``base_spec``, whose weights are at
    ``base_path``, :attr:`attnlm.loading.sources.ModelInfo.path`), in place; returns the ``"lora"``
    table for ``config.json``, or None when the run has no ``lora``. Call it before the
    optimizer is built."""
    lora = cfg.lora_config()
    if lora is None:
        return None
    family = registry.family_of(model)
    model_table = registry.config_table(family, model.config)  # the base's, before adapting
    table = lora_table(lora, base_spec, Path(base_path), model_table)
    apply_lora(model, lora)
    return table


def lora_model(
    model: Any, cfg: TrainConfig, init: Any, run_dir: Path, resume: bool
) -> tuple[Any, dict]:
    """The model a LoRA run trains and its ``"lora"`` table: a new run adapts ``model`` (the
    ``--init-from`` source's weights, :class:`attnlm.train.finetune.InitSource` ``init``); a
    resumed run loads the base again from the stored SPEC (:func:`resume_model`; the
    checkpoint holds only the adapters) and keeps its stored table."""
    if resume:
        from attnlm.loading.checkpoint import read_config, resolve_checkpoint

        table = read_config(resolve_checkpoint(run_dir)).get("lora")
        stored = {k: table.get(k) for k in ("r", "alpha", "dropout", "targets")} if table else {}
        wanted = cfg.lora_config().to_dict()
        if stored != wanted:
            raise ConfigError(
                f"cannot resume {run_dir}: its adapters are {stored or 'none'}, but "
                f"{wanted} was requested; start a new run (--out)"
            )
        return resume_model(run_dir)[0], table
    if init is None or init.path is None:
        raise ConfigError("--lora puts adapters on a pretrained model: give --init-from SPEC")
    return model, adapt(model, cfg, cfg.init_from, init.path)


def resume_model(run_dir: Path, device: Any = "cpu") -> Any:
    """``(model, tokenizer, info)`` of a LoRA run to resume: its base from the stored SPEC
    (refused in one line if it changed) with the adapters applied, not merged and not yet
    loaded (:func:`attnlm.loading.checkpoint.load_weights` loads them)."""
    from attnlm.loading.checkpoint import read_config, resolve_checkpoint
    from attnlm.loading.sources import load_lora_run

    ckpt = resolve_checkpoint(run_dir)
    if not isinstance(read_config(ckpt).get("lora"), dict):
        raise ConfigError(f"{run_dir}: not a LoRA run (its config.json has no lora table)")
    return load_lora_run(run_dir, device, merge=False, load=False)
