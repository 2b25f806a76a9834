"""Checkpoints: a folder written atomically, loaded with clear errors.

Layout of ``RUN/checkpoint/``::

    model.safetensors   model weights (shared tensors such as tied embeddings stored once)
    config.json         {"format", "model_type", "step", "model": GPTConfig, "train": TrainConfig}
    tokenizer.json      the tokenizer (``attnlm.tokenizers.load`` restores it)
    state.pt            optimizer, step, RNG states, data position, timers; plain tensors and
                        containers only, read back with ``torch.load(weights_only=True)``

Atomic replacement: everything is written into a temporary sibling folder first; only when
every file is complete is the old checkpoint renamed to ``checkpoint.old``, the new folder
renamed into place and the old one removed. A failure while writing (disk full) removes the
temporary folder and leaves the previous checkpoint untouched; a kill between the two renames
leaves ``checkpoint.old``, which :func:`resolve_checkpoint` finds.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from attnlm.errors import AttnlmError, InputError

FORMAT = "attnlm-checkpoint-v1"
CHECKPOINT_DIR = "checkpoint"
FILES = ("model.safetensors", "config.json", "tokenizer.json", "state.pt")


class CheckpointError(AttnlmError):
    """A checkpoint could not be written; the message says what is still intact."""


def _is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint folder for ``path``: a checkpoint folder itself or a run folder."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: no such checkpoint or run folder")
    for cand in (p, p / CHECKPOINT_DIR, p / f"{CHECKPOINT_DIR}.old"):
        if _is_checkpoint(cand):
            return cand
    raise InputError(f"{p}: no checkpoint found (expected {CHECKPOINT_DIR}/model.safetensors)")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")


def save_checkpoint(
    ckpt_dir: str | os.PathLike[str],
    model: torch.nn.Module,
    config: dict[str, Any],
    tokenizer: Any,
    state: dict[str, Any],
) -> Path:
    """Write a checkpoint atomically to ``ckpt_dir`` (see the module docstring)."""
    from safetensors.torch import save_model

    final = Path(ckpt_dir)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{final.name}.tmp-{os.getpid()}"
    old = parent / f"{final.name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        _write_json(tmp / "config.json", {"format": FORMAT, **config})
        tokenizer.save(tmp / "tokenizer.json")
        torch.save(state, tmp / "state.pt")
        for name in FILES:
            _fsync(tmp / name)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"the previous checkpoint in {final} is intact" if final.exists() else "none saved"
        if isinstance(e, OSError):
            raise CheckpointError(
                f"could not write the checkpoint ({e.strerror or e}); {kept}"
            ) from None
        raise
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (on ``device``), tokenizer, configs and training state."""

    path: Path
    model: torch.nn.Module
    tokenizer: Any
    model_config: Any
    train_config: dict[str, Any]
    step: int
    config: dict[str, Any]

    def load_state(self) -> dict[str, Any]:
        """The training state (optimizer, RNG, data position), loaded with weights_only=True."""
        try:
            return torch.load(self.path / "state.pt", map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means an unusable file
            raise InputError(f"{self.path}/state.pt: missing or corrupt ({e})") from None


def read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}/config.json: missing or corrupt ({e})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise InputError(f"{path}/config.json: not an attnlm checkpoint ({FORMAT})")
    return config


def build_model(model_dict: dict[str, Any]) -> tuple[torch.nn.Module, Any]:
    """A fresh GPT from its config dict (``GPTConfig`` fields)."""
    from attnlm.config import from_dict
    from attnlm.errors import ConfigError
    from attnlm.models.gpt import GPT, GPTConfig

    cfg = from_dict(GPTConfig, model_dict, where="model")
    try:
        return GPT(cfg), cfg
    except AttnlmError:
        raise
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"model: {e}") from None


def load_checkpoint(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint or run folder; corrupt or missing files raise InputError."""
    from safetensors.torch import load_model

    from attnlm import tokenizers

    ckpt = resolve_checkpoint(path)
    config = read_config(ckpt)
    try:
        model, model_cfg = build_model(config["model"])
    except KeyError:
        raise InputError(f"{ckpt}/config.json: no model table") from None
    try:
        load_model(model, str(ckpt / "model.safetensors"), strict=True)
    except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
        raise InputError(f"{ckpt}/model.safetensors: missing or corrupt ({e})") from None
    try:
        tok = tokenizers.load(ckpt / "tokenizer.json")
    except AttnlmError:
        raise
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{ckpt}/tokenizer.json: missing or corrupt ({e})") from None
    model.to(device)
    return Checkpoint(
        path=ckpt,
        model=model,
        tokenizer=tok,
        model_config=model_cfg,
        train_config=dict(config.get("train", {})),
        step=int(config.get("step", 0)),
        config=config,
    )


def model_config_dict(cfg: Any) -> dict[str, Any]:
    return asdict(cfg)
