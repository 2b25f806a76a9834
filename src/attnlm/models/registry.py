"""The model-family registry: one place maps a ``type`` name to its config, model class,
training objective and capabilities.

Presets and checkpoints name their family in ``[model] type = "..."``; a missing type means
``gpt`` (everything written before families existed). Built-in families live one per file in
this package and are imported on first use; :func:`register` adds one from anywhere (a test,
a notebook, a plug-in)::

    register(Family(type="toy", config=ToyConfig, model=ToyLM, objective="causal"))

after which ``attnlm train --preset toy.toml`` (``[model] type = "toy"``), evaluation,
checkpoints and generation work for it unchanged.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnlm.base.errors import ConfigError, InputError
from attnlm.models.base import Decoding, Family

DEFAULT_TYPE = "gpt"

# Built-in families: type -> module defining ``FAMILY``. Imported on first use.
BUILTIN: dict[str, str] = {
    "gpt": "attnlm.models.gpt",
    "transformer": "attnlm.models.transformer",
    "ffnn": "attnlm.models.ffnn",
    "rnn": "attnlm.models.rnn",
    "rnn-seq2seq": "attnlm.models.rnn_seq2seq",
    "bert": "attnlm.models.bert",
    "llama": "attnlm.models.llama",
    "hmm": "attnlm.models.hmm",
}

_FAMILIES: dict[str, Family] = {}


def register(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` to the registry (``replace=True`` to redefine a type)."""
    if not replace and family.type in known_types() and get(family.type) is not family:
        raise ConfigError(f"model family {family.type!r} is already registered")
    _FAMILIES[family.type] = family
    return family


def unregister(type_name: str) -> None:
    """Remove a family added with :func:`register` (built-ins come back on next use)."""
    _FAMILIES.pop(type_name, None)


def known_types() -> list[str]:
    """Every registered or built-in family type, sorted."""
    return sorted(set(BUILTIN) | set(_FAMILIES))


def get(type_name: str | None) -> Family:
    """The family of ``type_name`` (None means ``gpt``); unknown types are a ConfigError."""
    name = DEFAULT_TYPE if type_name is None else type_name
    if name not in _FAMILIES:
        module = BUILTIN.get(name)
        if module is None:
            raise ConfigError(f"unknown model.type {name!r} (known: {', '.join(known_types())})")
        _FAMILIES[name] = importlib.import_module(module).FAMILY
    return _FAMILIES[name]


def families() -> list[Family]:
    """All families, built-in and registered, sorted by type."""
    return [get(t) for t in known_types()]


def split_type(model_table: dict[str, Any]) -> tuple[Family, dict[str, Any]]:
    """The family named by a ``[model]`` table and the table's other fields."""
    fields = dict(model_table)
    type_name = fields.pop("type", None)
    if type_name is not None and not isinstance(type_name, str):
        raise ConfigError(f"model.type must be a string, got {type_name!r}")
    return get(type_name), fields


def make_config(model_table: dict[str, Any]) -> tuple[Family, Any]:
    """The family and its config dataclass from a ``[model]`` table (with ``type``)."""
    from attnlm.base.config import from_dict

    family, fields = split_type(model_table)
    return family, from_dict(family.config, fields, where="model")


def complete_table(model_table: dict[str, Any], **fill: Any) -> dict[str, Any]:
    """The ``[model]`` table with the fields that come from data (e.g. ``vocab_size`` from
    the tokenizer) filled in, for those the family's config has and the table leaves out."""
    import dataclasses

    family, fields = split_type(model_table)
    names = {f.name for f in dataclasses.fields(family.config)}
    extra = {k: v for k, v in fill.items() if k in names and k not in fields}
    return {**model_table, **extra}


def check_table(model_table: dict[str, Any], **fill: Any) -> None:
    """Validate a ``[model]`` table before the data is known: ``fill`` supplies stand-ins for
    the fields that come from data (e.g. ``vocab_size=1``)."""
    make_config(complete_table(model_table, **fill))


def build(model_table: dict[str, Any]) -> tuple[Any, Any, Family]:
    """A fresh model from a ``[model]`` table: ``(model, config, family)``."""
    family, config = make_config(model_table)
    try:
        model = family.model(config)
    except (ConfigError, InputError):
        raise
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"model: {e}") from None
    return model, config, family


def config_table(family: Family, config: Any) -> dict[str, Any]:
    """The ``[model]`` table of a config, with its ``type`` first (checkpoints store this)."""
    import dataclasses

    return {"type": family.type, **dataclasses.asdict(config)}


def family_of(model: Any) -> Family:
    """The registered family whose model class ``model`` is an instance of."""
    for family in families():
        if type(model) is family.model:
            return family
    for family in families():
        if isinstance(model, family.model):
            return family
    raise ConfigError(f"{type(model).__name__} is not a registered model family")


def decoding_of(model: Any) -> Decoding:
    """What the decoders may do with ``model``: its family's :class:`Decoding` record. A module
    of no registered family (a wrapper, a test double) gets the defaults: no static state, no
    compiled step, learned positions, windowed by ``config.block_size`` when it has one."""
    try:
        return family_of(model).decoding
    except ConfigError:
        return Decoding(window=hasattr(getattr(model, "config", None), "block_size"))


def presets_of(type_name: str) -> list[str]:
    """Names of the built-in presets whose ``[model]`` table names this family."""
    from attnlm.base.config import list_presets, load_preset

    out = []
    for name in list_presets():
        try:
            table = load_preset(name).get("model", {})
        except ConfigError:
            continue
        if table.get("type", DEFAULT_TYPE) == type_name:
            out.append(name)
    return out
