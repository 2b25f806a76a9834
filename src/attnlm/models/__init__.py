"""Model families and the registry that maps ``[model] type`` to them.

:mod:`.base` (output record, loss, :class:`~attnlm.models.base.Family`), :mod:`.registry`
(``get``, ``register``, ``build``), one file per family (:mod:`.gpt`), and the package
:mod:`.hf` (Hugging Face model folders: reading and writing them, the one name mapping, one
adapter module per architecture; ``from_hf(path)`` and ``save_hf(model, path)`` come from
there). Names load on first use.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

_EXPORTS = {
    "Family": "attnlm.models.base",
    "ModelOutput": "attnlm.models.base",
    "count_params": "attnlm.models.base",
    "register": "attnlm.models.registry",
    "get": "attnlm.models.registry",
    "families": "attnlm.models.registry",
    "build": "attnlm.models.registry",
    "from_hf": "attnlm.models.hf",
    "save_hf": "attnlm.models.hf",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
