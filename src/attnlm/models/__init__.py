"""Model families and the registry that maps ``[model] type`` to them.

:mod:`.base` (output record, loss, :class:`~attnlm.models.base.Family`), :mod:`.registry`
(``get``, ``register``, ``build``), one file per family (:mod:`.gpt`), and the package
:mod:`.hf` (Hugging Face model folders: reading and writing them, the one name mapping, one
adapter module per architecture; ``from_hf(path)`` and ``save_hf(model, path)`` come from
there). Names load on first use.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".base": "Family ModelOutput count_params",
        ".registry": "register get families build",
        ".hf": "from_hf save_hf",
    },
)
