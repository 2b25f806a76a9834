"""Hugging Face model folders: reading and writing ``config.json``, ``generation_config.json``
and the weights, and loading mapped weights into a model.

A folder written by ``transformers``' ``save_pretrained`` holds ``config.json`` and the weights
in ``model.safetensors`` (or sharded with ``model.safetensors.index.json``), or in the older
``pytorch_model.bin`` (a pickled state dict, read here with ``weights_only=True``); generative
models also ``generation_config.json``. The names and layouts of the weights are mapped by
:mod:`.mapping` with the tables of :mod:`.gpt2`, :mod:`.bert` and :mod:`.marian`;
:func:`attnlm.models.hf.from_hf` picks the adapter from ``model_type``.

This needs neither ``transformers`` nor the network: only ``torch`` and ``safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.base.errors import InputError
from attnlm.base.foreign import check_finite, foreign_reader, load_json
from attnlm.base.foreign import register as _register_reader
from attnlm.models.hf.mapping import Layout, check_weight_shape, refuse_missing, to_ours


def _read_json(file: Path) -> Any:
    return load_json(file, file.name, expect=None)


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face model folder as a dict."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InputError(f"{path}: no config.json (expected a Hugging Face checkpoint folder)")
    data = _read_json(config_file)
    if not isinstance(data, dict):
        raise InputError(f"{config_file}: expected a JSON object")
    return data


def read_generation_config(path: str | Path) -> dict[str, Any]:
    """The folder's ``generation_config.json`` as a dict; ``{}`` when it has none (or it is
    not a JSON object)."""
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return {}
    data = _read_json(file)
    return data if isinstance(data, dict) else {}


def safetensors_files(path: Path) -> list[Path]:
    """The folder's safetensors files: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` names (checked to exist); [] when it has neither."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        return []
    doc = _read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index}: no 'weight_map' of tensor names to shard files")
    shards = sorted(set(weight_map.values()), key=str)
    for shard in shards:
        if isinstance(shard, str) and Path(shard).name != shard:  # a file of the folder only
            raise InputError(f"{index}: shard {shard!r} is not a file name in the folder")
        if not isinstance(shard, str) or not (path / shard).is_file():
            raise InputError(f"{index}: shard {shard!r} is missing from the folder")
    return [path / shard for shard in shards]


def _check_shards(path: Path, names: set[str]) -> None:
    """Every name the sharded folder's index maps is in its shards."""
    index = path / "model.safetensors.index.json"
    if index.is_file() and not (path / "model.safetensors").is_file():
        missing = sorted(set(_read_json(index)["weight_map"]) - names)
        if missing:
            raise InputError(f"{index}: {missing[0]!r} is not in its shard")


def read_hf_weights(path: str | Path) -> dict[str, Tensor]:
    """The state dict stored in a HF checkpoint directory (safetensors preferred)."""
    path = Path(path)
    files = safetensors_files(path)
    if files:
        state: dict[str, Tensor] = {}
        for file in files:
            state.update(_load_safetensors(file))
        _check_shards(path, set(state))
        return state
    pickled = path / "pytorch_model.bin"
    if pickled.is_file():
        try:
            state = torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is bad input
            raise InputError(f"{pickled}: cannot read weights safely ({e})") from None
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise InputError(f"{pickled}: not a state dict of tensors")
        check_finite(state, pickled)
        return state
    raise InputError(
        f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


@foreign_reader("safetensors")
def _load_safetensors(file: Path) -> dict[str, Tensor]:
    """The tensors of one safetensors file, all finite; a 0-byte, truncated or lying file is
    one InputError line naming it."""
    from safetensors.torch import load_file

    state = load_file(file)
    check_finite(state, file)
    return state


def load_mapped_state(
    model: nn.Module, state: dict[str, Tensor], path: Path, optional: tuple[str, ...] = ()
) -> nn.Module:
    """Load ``state`` (already in our names) into ``model`` after checking every shape;
    parameters named in ``optional`` (e.g. a tied head) may be absent. Returns the model in
    eval mode."""
    expected = model.state_dict()
    for key, tensor in state.items():
        check_weight_shape(path, key, tuple(tensor.shape), expected)
    missing, _ = model.load_state_dict(state, strict=False)
    refuse_missing(path, missing, optional)
    return model.eval()


def load_hf_weights(
    model: nn.Module, path: str | Path, layout: Layout, weights: dict[str, Tensor] | None = None
) -> nn.Module:
    """Load the folder's weights (``weights`` when already read) into ``model`` through
    ``layout`` (:func:`~attnlm.models.hf.mapping.to_ours`); the model in eval mode."""
    path = Path(path)
    files = safetensors_files(path) if weights is None else []
    if files:  # read into the model's own tensors: no second copy of the weights
        from attnlm.models.hf.stream import index, stream_weights

        stored = {name: entry for file in files for name, entry in index(file).items()}
        _check_shards(path, set(stored))
        return stream_weights(model, path, layout, stored)
    hf_state = read_hf_weights(path) if weights is None else weights
    return load_mapped_state(model, to_ours(layout, hf_state), path, layout.optional)


def shard_tensors(tensors: dict[str, Tensor], max_shard_size: int) -> list[dict[str, Tensor]]:
    """Tensors in their order, cut into groups of at most ``max_shard_size`` bytes (a larger
    tensor gets a group of its own), as ``save_pretrained(max_shard_size=...)`` cuts them."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        if shards[-1] and size + t.nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += t.nbytes
    return shards


def write_hf_folder(
    path: str | Path,
    config: dict[str, Any],
    state: dict[str, Tensor],
    generation: dict[str, Any] | None = None,
    max_shard_size: int | None = None,
) -> None:
    """Write ``config.json`` and ``model.safetensors`` (contiguous CPU tensors) into ``path``,
    and ``generation_config.json`` when ``generation`` is given. With ``max_shard_size``
    (bytes) and more weights than that, the weights go to ``model-0000i-of-0000n.safetensors``
    shards listed in ``model.safetensors.index.json`` instead (the other layout's files left
    by an earlier save are removed). The folder is locked against a second writer
    (:func:`attnlm.base.fileio.output_lock`)."""
    from attnlm.base.fileio import output_lock

    with output_lock(path):
        _write_hf_folder(Path(path), config, state, generation, max_shard_size)


def _write_hf_folder(path, config, state, generation, max_shard_size) -> None:
    from safetensors.torch import save_file

    from attnlm.base.fileio import atomic_path, atomic_write_text

    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    shards = shard_tensors(tensors, max_shard_size) if max_shard_size else [tensors]
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if len(shards) == 1:
        with atomic_path(single) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt"})
        index.unlink(missing_ok=True)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            with atomic_path(path / name) as tmp:
                save_file(shard, tmp, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.nbytes for t in tensors.values())
        doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        atomic_write_text(index, json.dumps(doc, indent=2) + "\n")
        single.unlink(missing_ok=True)
    if generation is not None:
        atomic_write_text(path / "generation_config.json", json.dumps(generation, indent=2) + "\n")
    # last: config.json makes the folder a model folder, so a writer killed before it leaves
    # a new folder that is not taken for a model (and an old one with its old config)
    atomic_write_text(path / "config.json", json.dumps(config, indent=2) + "\n")


_register_reader("Hugging Face model folder", f"{__name__}.read_hf_weights")
_register_reader("Hugging Face model folder", f"{__name__}.read_hf_config")
_register_reader("Hugging Face model folder", f"{__name__}.read_generation_config")
