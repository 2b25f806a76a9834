"""The decode-time weight format of a resolved model (``--weights f32|bf16|q8|q4``).

:func:`apply_weights` is the last step of :func:`attnlm.loading.sources.resolve`: it picks the
format (the one asked for; else the one the model loaded in: a GGUF file's own precision class,
:func:`attnlm.models.gguf.loader.precision_class`, else ``f32``), refuses families that
cannot take one, and stores the weights with :func:`attnlm.quant.layers.quantize_weights`.
``info.details["weights"]`` records the format and ``info.details["weights_note"]`` which
of a GGUF file's tensor types were re-quantized (:func:`attnlm.models.gguf.loader.requantized`:
read off the model's layers and the file's tensor table; nothing is kept on the model).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from attnlm.base.device import release_free_memory
from attnlm.base.errors import InputError

#: families whose linear layers :func:`~attnlm.quant.layers.quantize_weights` may swap
FAMILIES = ("gpt", "llama")


def apply_weights(found: Any, weights: str | None) -> Any:
    """``found`` (a :class:`~attnlm.loading.sources.Resolved`) with its weights in ``weights``
    (None: as loaded: a GGUF file's own precision class, else f32)."""
    from attnlm.quant.layers import quantize_weights, weights_format

    model, _, info = found
    family = getattr(info.family, "type", None)
    if weights is not None and weights != "f32" and family not in FAMILIES:
        raise InputError(
            f"--weights {weights}: only {' and '.join(FAMILIES)} models take a weights format "
            f"(this is a {family} model)"
        )
    have = weights_format(model)  # a GGUF file's matrices load straight into their format
    weights = weights or have
    if have != weights:
        quantize_weights(model, weights)
        release_free_memory()  # the float32 matrices just dropped
    info.details["weights"] = weights
    redone = _requantized(model, info.path, weights)
    if redone:
        note = f"{info.path.name}: {', '.join(redone)} matrices dequantized and re-quantized"
        info.details["weights_note"] = f"{note} to {weights}"
        print(f"attnlm: {info.details['weights_note']}", file=sys.stderr)
    return found


def _requantized(model: Any, path: Path | None, weights: str) -> list[str]:
    """The ggml types of the GGUF file ``path`` that ``model`` holds re-quantized in
    ``weights`` (none for other sources and formats)."""
    if weights not in ("q8", "q4") or path is None or Path(path).suffix.lower() != ".gguf":
        return []
    from attnlm.base.ggufio import GGUFFile
    from attnlm.models.gguf.loader import requantized

    return requantized(GGUFFile(path), model)
