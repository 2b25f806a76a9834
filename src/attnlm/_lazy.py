"""Lazy package exports: names imported from their module on first use.

A package whose modules import torch lists its public names by module and sets::

    __getattr__, __all__ = lazy_exports(__name__, {".base": "Family count_params", ...})

so importing the package (as the CLI does for ``attnlm --help``) stays cheap. A module name
starting with ``.`` is relative to the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, by_module: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """A module-level ``__getattr__`` that imports a listed name from its module on first use,
    and the package's ``__all__``. ``by_module`` maps a module (``".base"`` or absolute) to the
    space-separated names it exports."""
    home = {name: module for module, names in by_module.items() for name in names.split()}

    def __getattr__(name: str) -> Any:
        if name in home:
            return getattr(importlib.import_module(home[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted(home)
