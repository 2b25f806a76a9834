"""Checkpoints: a folder written atomically, loaded with clear errors.

Layout of ``RUN/checkpoint/``::

    model.safetensors   model weights (shared tensors such as tied embeddings stored once)
    config.json         {"format", "step", "preset", "model": {"type": ..., config fields},
                        "train": TrainConfig}; a model table without "type" is a GPT
    tokenizer.json      the tokenizer (``attnlm.tokenizers.load`` restores it); for a
                        sequence-to-sequence model the target side's (or the shared one)
    source_tokenizer.json, target_tokenizer.json, pair_tokenizers.json
                        only for sentence-pair models (a ``PairTokenizers``: two tokenizers or
                        one shared, the special token strings, start/end rules); the source
                        and target files only when the sides have separate tokenizers
    state.pt            optimizer, step, RNG states, data position, timers; plain tensors and
                        containers only, read back with ``torch.load(weights_only=True)``
    shards/             only for runs trained with FSDP (``train.parallel = "fsdp"``): the
                        weights and optimizer state, one file per process
                        (:mod:`attnlm.train.fsdp`); ``state.pt`` then holds no optimizer

Atomic replacement: everything is written into a temporary sibling folder first; only when
every file is complete is the old checkpoint renamed to ``checkpoint.old``, the new folder
renamed into place and the old one removed. A failure while writing (disk full) removes the
temporary folder and leaves the previous checkpoint untouched; a kill between the two renames
leaves ``checkpoint.old``, which :func:`resolve_checkpoint` finds. Temporary folders left by
a killed save are removed by the next save.

Loading needs no training code: generation, evaluation, inspection and the web explorer use
:func:`load_checkpoint`, which builds the model of the family the config names
(:mod:`attnlm.models.registry`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlm.base.errors import AttnlmError, InputError
from attnlm.base.fileio import atomic_write_text, fsync_dir, kill_point
from attnlm.base.foreign import check_finite, load_json, reading, register
from attnlm.base.foreign import register as _register_reader
from attnlm.lora.layers import has_lora, load_lora_state_dict, lora_state_dict
from attnlm.nn.layout import standard_layout

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
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def _save_tokenizer(folder: Path, tokenizer: Any) -> list[str]:
    """Write the tokenizer files; returns their names. A pair of tokenizers (an object with
    ``source`` and ``target``, :class:`attnlm.data.pairs.PairTokenizers`) writes its own
    folder layout plus ``tokenizer.json`` (the target side), so that every checkpoint has
    one."""
    if hasattr(tokenizer, "source") and hasattr(tokenizer, "target"):
        tokenizer.save(folder)
        if not (folder / "tokenizer.json").is_file():
            tokenizer.target.save(folder / "tokenizer.json")
        return sorted(p.name for p in folder.glob("*tokenizer*.json"))
    tokenizer.save(folder / "tokenizer.json")
    return ["tokenizer.json"]


def save_checkpoint(
    ckpt_dir: str | os.PathLike[str],
    model: torch.nn.Module,
    config: dict[str, Any],
    tokenizer: Any,
    state: dict[str, Any],
    move_in: dict[str, Path] | None = None,
) -> Path:
    """Write a checkpoint atomically to ``ckpt_dir`` (see the module docstring).
    ``move_in``: folders written beforehand (a sharded checkpoint's ``shards/``, already
    synced to disk), renamed into the new checkpoint under these names before it replaces
    the old one."""
    from safetensors.torch import save_file, save_model

    final = Path(ckpt_dir)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{final.name}.tmp-{os.getpid()}"
    old = parent / f"{final.name}.old"
    for leftover in parent.glob(f".{final.name}.tmp-*"):  # from killed saves (and ours)
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        tmp.mkdir()
        if has_lora(model):  # a LoRA run keeps its adapters only: the base is its SPEC
            save_file(
                {k: v.contiguous() for k, v in lora_state_dict(model).items()},
                str(tmp / "model.safetensors"),
            )
        else:
            save_model(standard_layout(model), str(tmp / "model.safetensors"))
        _write_json(tmp / "config.json", {"format": FORMAT, **config})
        written = _save_tokenizer(tmp, tokenizer)
        torch.save(state, tmp / "state.pt")
        for name in sorted(set(FILES) | set(written)):
            _fsync(tmp / name)
        for name, folder in (move_in or {}).items():
            os.replace(folder, tmp / name)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"the previous checkpoint in {final} is intact" if final.exists() else "none saved"
        if isinstance(e, OSError):
            raise CheckpointError(
                f"could not write the checkpoint ({e.strerror or e}); {kept}"
            ) from None
        raise
    kill_point("replace")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(parent)  # the renames are durable before the old checkpoint goes
    shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (on ``device``), its family, tokenizer, configs and
    training state."""

    path: Path
    model: torch.nn.Module
    tokenizer: Any
    model_config: Any
    train_config: dict[str, Any]
    step: int
    config: dict[str, Any]
    family: Any = None
    # sentence-pair models: the PairTokenizers (``tokenizer`` is then its target side) and
    # the source side's tokenizer (the same object as ``tokenizer`` when shared)
    pair_tokenizers: Any = None
    source_tokenizer: Any = None

    def load_state(self) -> dict[str, Any]:
        """The training state (optimizer, RNG, data position), loaded with weights_only=True."""
        return load_state(self.path)


def load_state(ckpt: Path) -> dict[str, Any]:
    """``state.pt`` of a checkpoint folder, read with ``weights_only=True``."""
    try:
        return torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means an unusable file
        raise InputError(f"{ckpt}/state.pt: missing, corrupt or unsafe ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    """A short plain reason from torch's (multi-line, ANSI-coloured) load errors."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    if "Weights only load failed" in text or "weights_only" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        what = f" ({found.group(1)})" if found else ""
        return f"holds objects other than tensors and plain containers{what}; refused"
    first = text.splitlines()[0] if text else type(e).__name__
    return first if len(first) <= 120 else first[:117] + "..."


def read_config(path: Path) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint folder (checked to be ours)."""
    config = load_json(path / "config.json", "checkpoint config.json")
    if config.get("format") != FORMAT:
        raise InputError(f"{path}/config.json: not an attnlm checkpoint ({FORMAT})")
    if not isinstance(config.get("model"), dict):
        raise InputError(f"{path}/config.json: no model table")
    return config


def load_weights(model: torch.nn.Module, ckpt: Path, device: str | torch.device = "cpu") -> None:
    """Load ``model.safetensors`` of ``ckpt`` into ``model`` (strict); a model with LoRA
    adapters (:mod:`attnlm.lora.layers`) loads its adapters only, which is all a LoRA run saves."""
    from safetensors.torch import load_file, load_model

    if has_lora(model):
        try:
            state = load_file(str(ckpt / "model.safetensors"), device=str(device))
        except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise InputError(f"{ckpt}/model.safetensors: missing or corrupt ({first})") from None
        load_lora_state_dict(model, state, where=f"{ckpt}/model.safetensors")
        return
    try:
        path = str(ckpt / "model.safetensors")
        load_model(standard_layout(model), path, strict=True, device=str(device))
    except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{ckpt}/model.safetensors: missing or corrupt ({first})") from None
    check_finite(dict(model.named_parameters()), ckpt / "model.safetensors")  # not buffers (masks)


def check_vocab(tokenizer: Any, model_config: Any, where: str) -> None:
    """A tokenizer whose ids do not fit the model is refused (it would generate garbage)."""
    model_vocab = getattr(model_config, "vocab_size", None)
    tok_vocab = getattr(tokenizer, "vocab_size", None)
    if isinstance(model_vocab, int) and isinstance(tok_vocab, int) and tok_vocab > model_vocab:
        raise InputError(
            f"{where}: the tokenizer has {tok_vocab:,} ids but the model only "
            f"{model_vocab:,} (model.vocab_size); they do not belong together"
        )


def load_tokenizer(ckpt: Path) -> tuple[Any, Any]:
    """``(tokenizer, pair tokenizers or None)`` of a checkpoint folder: a translation run's
    ``pair_tokenizers.json`` (the tokenizer is then its target side), else ``tokenizer.json``;
    a missing or corrupt file raises InputError."""
    from attnlm import tokenizers

    try:
        if (ckpt / "pair_tokenizers.json").is_file():
            from attnlm.data.pairs import PairTokenizers

            pairs = PairTokenizers.load(ckpt)
            return pairs.target, pairs
        return tokenizers.load(ckpt / "tokenizer.json"), None
    except AttnlmError:
        raise
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{ckpt}/tokenizer.json: missing or corrupt ({e})") from None


register("attnlm checkpoint", f"{__name__}.load_checkpoint")


def load_checkpoint(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> Checkpoint:
    """Load a checkpoint or run folder; corrupt or missing files raise InputError."""
    from attnlm.models import registry

    ckpt = resolve_checkpoint(path)
    config = read_config(ckpt)
    if isinstance(config.get("lora"), dict):
        raise InputError(
            f"{ckpt}: a LoRA run (adapters over {config['lora'].get('base')}); load it as "
            "--model (attnlm.loading.sources.resolve), which loads the base and applies them"
        )
    with reading(ckpt / "config.json", "attnlm checkpoint"):
        model, model_cfg, family = registry.build(config["model"])
        step = int(config.get("step", 0))
        train_config = dict(config.get("train", {}))
    load_weights(model, ckpt)
    tok, pairs = load_tokenizer(ckpt)
    check_vocab(tok, model_cfg, str(ckpt))
    model.to(device)
    return Checkpoint(
        path=ckpt,
        model=model,
        tokenizer=tok,
        model_config=model_cfg,
        train_config=train_config,
        step=step,
        config=config,
        family=family,
        pair_tokenizers=pairs,
        source_tokenizer=pairs.source if pairs is not None else tok,
    )


# ---------------------------------------------------------------------------------------------
# One way to name a model: an attnlm checkpoint, a Hugging Face folder, or a pretrained name


_register_reader("attnlm checkpoint", f"{__name__}.load_state")
_register_reader("attnlm checkpoint", f"{__name__}.load_weights")
_register_reader("attnlm checkpoint", f"{__name__}.read_config")
