"""The one place that decides how a model runs: :func:`runner_for` picks the backend of a
PyTorch model once, before a decode, from the model, its device and the caller's switches,
and says why; :func:`engine_reason` says whether a GGUF file runs on the C engine without
PyTorch (:func:`attnlm.loading.sources.resolve` asks it).

=============  ==========================================================================
backend        when
=============  ==========================================================================
``compiled``   ``compile`` asked for (``--compile``) and the family has a compiled step
``c-step``     the C library loads, the model is on the CPU and its blocks and weights are
               what the C step computes (:func:`attnlm.runtime.cstep.why_not_supported`)
``eager``      everything else (the reason says what ruled the C step out)
``c-engine``   a local GGUF file of an architecture the engine runs (llama, qwen2, qwen3, phi3,
               gemma2, gemma3), decoded on the CPU with the KV cache, uncompiled (chosen by
               the resolver, not here)
=============  ==========================================================================
"""

from __future__ import annotations

import os
from typing import Any

from attnlm import native

# PyTorch is imported by runner_for alone: engine_reason serves a process that never imports it

__all__ = ["BACKENDS", "choose", "engine_reason", "runner_for"]

BACKENDS = ("eager", "compiled", "c-step", "c-engine")


def runner_for(model: Any, *, compile: Any = False, backend: str | None = None) -> Any:
    """The runner (backend) that decodes ``model``: ``name`` and ``reason`` say which and
    why. ``compile``: True or a :class:`~attnlm.runtime.compiled.CompiledStep` asks for the
    compiled backend; ``backend``: a name from :data:`BACKENDS` to insist on (``c-step``
    raises where it cannot run). On the CPU the float32 weights are stored column-major first
    (:func:`~attnlm.nn.layout.decoding_layout`: one-row products stream them faster, in C and
    in PyTorch alike)."""
    from attnlm.nn.layout import decoding_layout

    decoding_layout(model)
    name, reason = choose(model, compile=compile, backend=backend)
    if name == "compiled":
        from attnlm.runtime.compiled import CompiledRunner

        return CompiledRunner(model, compile, reason, fallback=_build(model, *choose(model)))
    return _build(model, name, reason)


def choose(model: Any, *, compile: Any = False, backend: str | None = None) -> tuple[str, str]:
    """``(name, reason)`` of the backend :func:`runner_for` gives ``model``, without building
    it (``attnlm params`` says it; a model on the ``meta`` device, shapes only, stands for
    the CPU model it describes)."""
    if compile or backend == "compiled":
        return "compiled", "--compile: one torch.compile graph per one-token step"
    why = _why_not_c(model)
    if backend == "eager" or (why is not None and backend != "c-step"):
        return "eager", "asked for" if backend == "eager" else why
    if why is not None:
        raise RuntimeError(f"the c-step backend cannot run this model: {why}")
    from attnlm.quant.layers import weights_format

    return "c-step", f"{weights_format(model)} weights on the CPU: each step is one C call"


def _build(model: Any, name: str, reason: str) -> Any:
    """The uncompiled runner ``name`` (``eager`` or ``c-step``) of ``model``."""
    if name == "eager":
        from attnlm.runtime.eager import EagerRunner

        return EagerRunner(model, reason)
    from attnlm.runtime.cstep import CStepRunner

    return CStepRunner(model, reason)


def _why_not_c(model: Any) -> str | None:
    """Why the C step does not run ``model`` (a phrase), or None."""
    from attnlm.base.device import model_device

    device = model_device(model).type
    if device not in ("cpu", "meta"):
        return f"the model is on {device}; the C step runs on the CPU"
    from attnlm.runtime import cstep

    why = cstep.why_not_supported(model)
    if why is not None:
        return f"the C step does not compute {why}"
    if cstep._library() is None:
        return native.why_not
    return None


def engine_reason(fmt: str | None, device: str | None, *, use_cache: bool = True,
                  compile: bool = False) -> tuple[bool, str]:  # fmt: skip
    """Whether a GGUF file whose weights the engine holds as ``fmt`` (None: it does not,
    :func:`attnlm.runtime.engine_gguf.engine_format`) runs on the C engine for a decode on
    ``device`` with these switches, and why (or why not)."""
    if os.environ.get("ATTNLM_ENGINE", "1") == "0":
        return False, "ATTNLM_ENGINE=0"
    if not use_cache or compile:
        return False, "--no-cache" if not use_cache else "--compile"
    if device not in (None, "cpu", "auto") or (device != "cpu" and _gpu_visible()):
        return False, "a GPU may be used"
    if fmt is None:
        return False, "the C step does not compute this file's model (architecture, parts, types)"
    if native.library() is None:
        return False, native.why_not
    return True, f"a GGUF file in its own {fmt} weights: the C step without PyTorch"


def _gpu_visible() -> bool:
    """Whether ``--device auto`` could pick a GPU (an NVIDIA driver, or macOS's MPS), told
    without importing PyTorch's CUDA."""
    import sys

    return sys.platform == "darwin" or os.path.exists("/dev/nvidiactl")
