"""Lazy package exports: names imported from their module on first use.

A package whose modules import torch lists its public names in a dict ``{name: module}`` and
sets ``__getattr__ = lazy_exports(__name__, EXPORTS)``, so importing the package (as the CLI
does for ``attnlm --help``) stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that imports ``exports[name]`` and returns its ``name``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
