"""A LoRA run folder: the adapters of a fine-tune, the base model's SPEC and its fingerprint.

A LoRA run's ``checkpoint/model.safetensors`` holds only the adapter tensors
(:func:`attnlm.lora.layers.lora_state_dict`, a few MB); ``config.json`` holds the usual tables plus
``"lora"``::

    {"r", "alpha", "dropout", "targets",
     "base": SPEC (an absolute path when SPEC was a path; else the name or Hub id),
     "fingerprint": {"config": the base's [model] table,
                     "files": {file name: {"size", "sha256_ends"}}}}

The fingerprint is cheap enough to check at every load (a 540 MB float32 135M model takes
milliseconds): each weight file's size and the SHA-256 of its first and last MiB, and the
base model's resolved config. Modification times are left out, so a copied or re-downloaded
file is still the same base; an edit that keeps the size and both ends of a file is not seen.
Loading a run whose base no longer matches is refused in one line (:func:`check_base`).

:mod:`attnlm.loading.sources` loads such a run (``--model RUN`` on every command): it resolves the
base SPEC, checks the fingerprint and calls :func:`attach`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from attnlm.base.errors import AttnlmError, InputError
from attnlm.lora.layers import LoRAConfig, apply_lora, load_lora_state_dict, merge_lora

WEIGHT_FILES = ("*.safetensors", "*.gguf", "*.bin")
END_BYTES = 1 << 20


def weight_files(path: Path) -> list[Path]:
    """The files that hold a model's weights: ``path`` itself when it is a file, else the
    ``.safetensors``, ``.gguf`` and ``.bin`` files directly in the folder."""
    if path.is_file():
        return [path]
    return sorted({f for pattern in WEIGHT_FILES for f in path.glob(pattern) if f.is_file()})


def _ends_digest(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            digest.update(f.read(END_BYTES))
            if size > END_BYTES:
                f.seek(max(END_BYTES, size - END_BYTES))
                digest.update(f.read(END_BYTES))
    except OSError as e:
        raise InputError(f"{path}: cannot read the base model ({e.strerror or e})") from None
    return {"size": size, "sha256_ends": digest.hexdigest()}


def fingerprint(path: Path, model_table: dict[str, Any]) -> dict[str, Any]:
    """The base model's fingerprint (see the module docstring): ``path`` is where its weights
    are (:attr:`attnlm.loading.sources.ModelInfo.path`), ``model_table`` its ``[model]`` table."""
    return {
        # as stored in config.json: tuples (a Gemma's layer_types) compare as lists
        "config": json.loads(json.dumps(model_table)),
        "files": {f.name: _ends_digest(f) for f in weight_files(Path(path))},
    }


def stored_spec(spec: str) -> str:
    """What a run stores to find its base again: an existing path made absolute (the run may be
    used from another folder), a name or Hub id as it was given."""
    p = Path(spec).expanduser()
    return str(p.resolve()) if p.exists() else spec


def lora_table(cfg: LoRAConfig, spec: str, path: Path, model_table: dict[str, Any]) -> dict:
    """The ``"lora"`` table of a run's ``config.json``."""
    return {**cfg.to_dict(), "base": stored_spec(spec),
            "fingerprint": fingerprint(path, model_table)}  # fmt: skip


def check_base(table: dict[str, Any], path: Path, model_table: dict[str, Any], run: Any) -> None:
    """Refuse (one line) a base that is not the one the adapters of ``run`` were trained on."""
    want = table.get("fingerprint")
    if not isinstance(want, dict):
        raise InputError(f"{run}: config.json has no base fingerprint in its lora table")
    have = fingerprint(path, model_table)
    if have == want:
        return
    if have["config"] != want.get("config"):
        what = "its model config differs"
    else:
        old, new = set(want.get("files", {})), set(have["files"])
        changed = sorted(
            (old ^ new) | {n for n in old & new if want["files"][n] != have["files"][n]}
        )
        what = f"{changed[0] if changed else 'a weight file'} changed"
    raise InputError(
        f"{run}: the base model {table.get('base')} is not the one these adapters were "
        f"trained on ({what}); restore it or train the adapters again"
    )


def read_adapters(ckpt: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA checkpoint folder."""
    from safetensors.torch import load_file

    from attnlm.base.foreign import check_finite

    try:
        state = load_file(str(ckpt / "model.safetensors"))
    except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError(f"{ckpt}/model.safetensors: missing or corrupt ({first})") from None
    check_finite(state, ckpt / "model.safetensors")
    return state


def attach(
    model: torch.nn.Module, table: dict[str, Any], ckpt: Path, merge: bool = True, load: bool = True
) -> Any:
    """Put the run's adapters (``table``: its ``"lora"`` table, ``ckpt``: its checkpoint folder)
    on the base ``model`` and, with ``load``, their values; with ``merge``, fold them into the
    weights (:func:`attnlm.lora.layers.merge_lora`: plain layers, every decoding fast path
    applies). Returns ``model``."""
    try:  # the table is read from the run's file: a bad value names it
        cfg = LoRAConfig.from_dict(table)
        device = next(model.parameters()).device
        apply_lora(model, cfg)
    except AttnlmError as e:
        raise InputError(f"{ckpt}/config.json: lora table: {e}") from None
    if not load:
        return model
    state = {k: v.to(device) for k, v in read_adapters(ckpt).items()}
    load_lora_state_dict(model, state, where=f"{ckpt}/model.safetensors")
    if merge:
        merge_lora(model)
    return model
