"""Configuration helpers: presets as TOML data files, dataclass configs, CLI overrides.

A preset is a TOML file with one table per part, e.g. ``[model]`` and ``[train]``. Built-in
presets ship inside the package (``attnlm/configs/NAME.toml``) so they work from a wheel too;
``load_preset`` also accepts a path to the user's own file. Values map onto frozen dataclasses
with :func:`from_dict`, which rejects unknown keys and values of the wrong type with a
:class:`~attnlm.base.errors.ConfigError` that names the field.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from attnlm.base.errors import ConfigError
from attnlm.base.fileio import read_file_text
from attnlm.base.foreign import register as _register_reader

PRESET_DIR = Path(__file__).parent.parent / "configs"  # src/attnlm/configs
T = TypeVar("T")


def list_presets() -> list[str]:
    """Names of the built-in presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_preset(name_or_path: str | Path) -> dict[str, Any]:
    """Load a built-in preset by name, or a TOML file by path, as a dict of tables."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(list_presets()) or "none"
        raise ConfigError(f"unknown preset {str(name_or_path)!r} (built-in presets: {known})")
    # TOML files are UTF-8 by definition: the one strict reader (bounded: /dev/zero is one block)
    text = read_file_text(path, "TOML preset", ConfigError)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({' '.join(str(e).split())})") from None
    except RecursionError:  # arrays or inline tables nested thousands deep
        raise ConfigError(f"{path}: invalid TOML (nested too deeply)") from None


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def from_dict(cls: type[T], data: dict[str, Any], *, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrongly typed values raise
    :class:`ConfigError` naming ``where.field``. Ints are accepted for float fields."""
    prefix = f"{where}." if where else ""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix}{unknown[0]} (known keys: {', '.join(sorted(fields))})"
        )
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        if not _type_ok(value, tp):
            name = getattr(tp, "__name__", str(tp))
            raise ConfigError(f"config key {prefix}{key} must be {name}, got {value!r}")
        if tp is float and isinstance(value, int):
            value = float(value)
        if typing.get_origin(tp) is tuple:
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass config as a plain dict (JSON/TOML friendly)."""
    return dataclasses.asdict(obj)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` (value as a TOML scalar, falling back to a plain string)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise ConfigError(f"override {key.strip()!r}: the value is nested too deeply") from None
    return key.strip(), value


_register_reader("preset", f"{__name__}.load_preset")
