"""Hugging Face interop: model folders in the ``transformers`` layout, read and written without
``transformers`` (only ``torch`` and ``safetensors``).

- :mod:`.folder`: reading ``config.json``, ``generation_config.json`` and the weights, loading
  mapped weights into a model, writing a folder;
- :mod:`.mapping`: the one rule-table mechanism between our parameter names and theirs
  (transposes, fused q/k/v, optional and tied keys), applied in both directions;
- one adapter module per architecture: :mod:`.gpt2` (``GPT2LMHeadModel`` <->
  :mod:`attnlm.models.gpt`), :mod:`.bert` (``BertModel`` / ``BertForMaskedLM`` <->
  :mod:`attnlm.models.bert`), :mod:`.marian` (``MarianMTModel`` <->
  :mod:`attnlm.models.transformer`), :mod:`.llama` (``LlamaForCausalLM`` <->
  :mod:`attnlm.models.llama`), and the Llama family's other members on one table
  (:mod:`.llama_family`, one adapter per ``model_type``: ``qwen2``, ``qwen3``, ``mistral``,
  ``phi3``, ``gemma2``, ``gemma3_text``, ``smollm3``, ``granite``, and the mixtures of experts
  ``qwen3_moe`` and ``mixtral``), each loading into a Llama with the parts its
  ``config.json`` names; a Llama is saved as the architecture of its ``model.arch``.

Arrows run from the adapters to the models, never back: an adapter imports its model class and
config, and holds the config translation (both directions), the weight table and
``MODEL_TYPE``, ``MODEL`` (the model class), ``load(path)`` and ``save(model, path, ...)``. A
model file knows no file format. :data:`ARCHITECTURES` maps a ``config.json`` ``model_type``
to its adapter module; :func:`from_hf` dispatches on it and :func:`save_hf` picks the adapter
from the model's class (both also ``attnlm.models.from_hf`` / ``attnlm.models.save_hf``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from attnlm._lazy import lazy_exports
from attnlm.base.errors import ConfigError, InputError
from attnlm.base.foreign import load_json, reading
from attnlm.base.foreign import register as _register_reader

# Hugging Face ``model_type`` -> the adapter that loads and saves it. A new architecture is one
# module with MODEL_TYPE, MODEL, load(path) and save(model, path, ...) and a row here;
# "module:name" is the adapter ``name`` of the module's ADAPTERS (the Llama family's classes,
# one :class:`~attnlm.models.hf.llama_family.Adapter` per architecture).
_FAMILY = "attnlm.models.hf.llama_family"
ARCHITECTURES: dict[str, str] = {
    "gpt2": "attnlm.models.hf.gpt2",
    "bert": "attnlm.models.hf.bert",
    "marian": "attnlm.models.hf.marian",
    "llama": "attnlm.models.hf.llama",
    **{
        t: f"{_FAMILY}:{t}"
        for t in (
            "qwen2",
            "qwen3",
            "mistral",
            "phi3",
            "gemma2",
            "gemma3_text",
            "qwen3_moe",
            "mixtral",
            "smollm3",
            "granite",
            "olmo2",
            "olmo3",
            "gpt_oss",
        )
    },  # fmt: skip
}

# model types we know and do not load, with why (one line each)
REFUSED: dict[str, str] = {
    "gemma3": "Gemma3ForConditionalGeneration has a vision tower (text-only Gemma3ForCausalLM "
    "folders, model_type 'gemma3_text', load)",
    "qwen2_moe": "a mixture of experts with a shared expert",
    "olmoe": "a mixture of experts with q/k norms over every head at once",
    "deepseek_v2": "latent attention (MLA) and experts",
    "deepseek_v3": "latent attention (MLA) and experts", "qwen2_vl": "a vision tower",
    "phimoe": "a mixture of experts", "granitemoe": "a mixture of experts",
    "granitemoehybrid": "a mixture of experts and state-space (Mamba) layers",
}  # fmt: skip

__getattr__, _LAZY = lazy_exports(
    __name__,
    {
        ".folder": "read_hf_config read_generation_config read_hf_weights load_mapped_state "
        "load_hf_weights write_hf_folder",
        ".mapping": "Layout Rule to_ours to_hf",
    },
)
__all__ = sorted(
    [*_LAZY, "ARCHITECTURES", "adapter", "adapter_for", "from_hf", "model_types", "save_hf"]
)


def adapter(model_type: str) -> Any:
    """The adapter of a Hugging Face ``model_type`` (a key of :data:`ARCHITECTURES`): a module,
    or one entry of a module's ``ADAPTERS``."""
    module, _, name = ARCHITECTURES[model_type].partition(":")
    found = importlib.import_module(module)
    return found.ADAPTERS[name] if name else found


def adapter_for(model: Any) -> Any:
    """The adapter module whose ``MODEL`` is the class of ``model`` (a subclass matches when no
    adapter names the class itself); ConfigError when no architecture stores it."""
    adapters = [adapter(t) for t in ARCHITECTURES]
    label = getattr(getattr(model, "config", None), "arch", None)  # a Llama's source layout
    for a in adapters:
        if type(model) is a.MODEL and getattr(getattr(a, "ARCH", None), "arch", "llama") == label:
            return a
    for a in adapters:
        if type(model) is a.MODEL:
            return a
    for a in adapters:
        if isinstance(model, a.MODEL):
            return a
    names = dict.fromkeys(a.MODEL.__name__ for a in adapters)
    raise ConfigError(
        f"{type(model).__name__} has no Hugging Face layout (supported: {', '.join(names)})"
    )


def model_types(model_class: type) -> list[str]:
    """The ``model_type`` values whose adapter loads into ``model_class``."""
    return [t for t in ARCHITECTURES if adapter(t).MODEL is model_class]


def from_hf(path: str | Path) -> Any:
    """Load a Hugging Face model folder into our model of the matching family (by
    ``config.json``'s ``model_type``), in eval mode."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InputError(f"{path}: no config.json (expected a Hugging Face model folder)")
    model_type = load_json(config_file, "config.json").get("model_type")
    if isinstance(model_type, str) and model_type in REFUSED:
        raise InputError(
            f"{config_file}: model_type {model_type!r} is not supported: {REFUSED[model_type]} "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise InputError(
            f"{config_file}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES)) or 'none'})"
        )
    # a config.json value of the wrong type, a weight file that lies: one line naming the folder
    with reading(path, "Hugging Face model folder"):
        return adapter(model_type).load(path)


def save_hf(model: Any, path: str | Path, *, files: Any = None, **options: Any) -> None:
    """Write ``model`` as a Hugging Face folder that ``transformers`` loads, through the
    adapter of its class; ``options`` go to that adapter's ``save`` (``max_shard_size`` for
    Llama, ``max_position_embeddings`` for Marian). ``files(folder)``: writes more files (the
    tokenizer's) into the new folder. The folder is written beside ``path`` and replaces it
    as a whole (:func:`attnlm.base.fileio.atomic_folder`): a reader, or a writer killed at
    any point, sees the old folder or the complete new one. A folder that holds files but no
    ``config.json`` is not replaced (its files would be lost)."""
    from attnlm.base.fileio import atomic_folder

    target = Path(path)
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise InputError(
            f"{target}: holds files but is not a Hugging Face folder (no config.json); "
            "writing one there would replace them: choose a new or empty folder"
        )
    with atomic_folder(target) as folder:
        if files is not None:
            files(folder)
        adapter_for(model).save(model, folder, **options)


_register_reader("Hugging Face model folder", f"{__name__}.from_hf")
