"""The compiled decode step: one ``torch.compile(fullgraph=True)`` graph of a one-token step
over a static decoding state, compiled once and replayed at every position of every call.

Why: a one-token step of a small model is mostly overhead, a dozen small operations per layer,
each a Python call and a kernel launch. Compiled, the whole step is one graph whose small
operations fuse; on CUDA (``mode="reduce-overhead"``) it is also captured as a CUDA graph.

One graph serves every position in one of two modes:

* **fixed** (CUDA, and the encoder-decoder everywhere): the state in fixed mode
  (:meth:`attnlm.nn.static_cache.StaticKVCache.fix`): buffers of one shape at every step, the
  write position a tensor, the slots not yet written masked; static shapes, one graph per
  batch size (and source bucket). Buffers are as long as the window, or without one the
  decode's length rounded up to a power of two (:func:`~attnlm.nn.static_cache.padded_length`).
* **prefix** (``gpt`` and ``llama`` on the CPU, ``Decoding.prefix_step``): the state in its
  ordinary prefix mode under dynamic shapes, so each step attends over the filled prefix only
  and the held length is a symbolic size; it starts once two positions are held
  (:meth:`CompiledStep.ready`), so that size is never specialised to 1.

The prompt is fed uncompiled; each later step is ``step(tokens (B, 1), state)``. States are
kept and reused between calls (CUDA graphs read them at fixed addresses); an encoder-decoder's
state is restarted on each call's sources in the same buffers (``new_state(..., reuse=)``),
its cross-attention keys/values padded to a power of two of the source length. A step object
compiles at most :data:`MAX_GRAPHS` shape combinations; past them its fixed-mode step runs
uncompiled (the same tokens). Dynamo's guards on the model's ``torch.nn`` layers are skipped:
a step belongs to one model, decoded in eval mode; weights changed in place are read as they
are at each call.

Which families have a step: ``Decoding.fixed_state`` without ALiBi
(:func:`has_compiled_step`).
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch
from torch.fx.experimental import _config as fx_config

from attnlm.base.device import model_device
from attnlm.base.errors import InputError
from attnlm.models.registry import decoding_of
from attnlm.runtime.eager import EagerRunner

MAX_GRAPHS = 32  # graphs (shape combinations) one step object compiles

_STEPS: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, CompiledStep]] = (
    weakref.WeakKeyDictionary()
)


def has_compiled_step(model: torch.nn.Module) -> bool:
    """Whether ``model`` can decode through a :class:`CompiledStep`: its family honours a
    fixed static state (``Decoding.fixed_state``) and it has no ALiBi."""
    decoding = decoding_of(model)
    return decoding.fixed_state and decoding.compiles(model.config)


def _one_step(model: torch.nn.Module, tokens: torch.Tensor, state: Any) -> torch.Tensor:
    """What is compiled: the family's own ``step`` (the decoding-state protocol)."""
    return model.step(tokens, state)[:, -1]  # (B, V)


def _recompile_options(limit: int) -> dict:
    """This function's own recompile limit (``torch.compile``'s keywords from PyTorch 2.12;
    before that only the process-wide dynamo setting exists, raised to at least ``limit``)."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return {"recompile_limit": limit, "isolate_recompiles": True}
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, limit)
    return {}


class CompiledStep:
    """A compiled one-token decode step of ``model`` (see the module docstring).

    ``backend``/``mode`` go to ``torch.compile`` (defaults: inductor; ``reduce-overhead`` on
    CUDA). ``prefix``: attend over the filled prefix with dynamic shapes (default: on the CPU)
    instead of the fixed buffers (default: on CUDA). ``step(tokens (B, 1), state) -> logits
    (B, 1, V)`` like ``model.step``."""

    def __init__(
        self,
        model: torch.nn.Module,
        backend: str | None = None,
        mode: str | None = None,
        prefix: bool | None = None,
    ):
        if not has_compiled_step(model):
            raise InputError(
                f"{type(model).__name__} has no compiled decode step (needs a static decoding "
                f"state and no ALiBi)"
            )
        self._model = weakref.ref(model)  # the model owns this step, not the other way round
        self.cuda = model_device(model).type == "cuda"
        if mode is None and backend is None and self.cuda:
            mode = "reduce-overhead"
        options = None
        if mode is None:
            # no guards on the model's torch.nn layers (their parameters' identity, shape and
            # strides), checked before every step otherwise. A step belongs to one model and
            # decodes in eval mode; the weights' values are read at every call (training
            # between decodes is fine, tested), but a layer replaced by one of another shape
            # needs a new model
            options = {"guard_filter_fn": torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe}
        if backend is None and mode is None and not self.cuda:
            # the graph's kernels called from generated C++ instead of Python: a one-token step
            # is dozens of small kernels, and calling each from Python is a large part of it
            options["cpp_wrapper"] = True
        supports_prefix = decoding_of(model).prefix_step
        self.prefix = (not self.cuda and supports_prefix) if prefix is None else bool(prefix)
        if self.prefix and not supports_prefix:
            raise InputError(f"{type(model).__name__} has no prefix-mode compiled step")
        self.fn = torch.compile(
            _one_step,
            fullgraph=True,
            dynamic=self.prefix,  # prefix mode: the held length is a symbolic size
            backend=backend or "inductor",
            mode=mode,
            options=options,
            **_recompile_options(MAX_GRAPHS + 8),  # guards other than shapes
        )
        self._states: dict[tuple, Any] = {}
        self._graphs: set[tuple] = set()  # shapes compiled (or being compiled) so far
        self._eager = False  # this decode's shapes are past MAX_GRAPHS: step uncompiled

    def state(self, batch: dict[str, Any] | None, max_len: int) -> Any:
        """A fresh static state of ``max_len`` positions, reusing the buffers of the last one
        of this length (a state is used by one decode at a time). With a ``batch`` (an
        encoder-decoder's sources) the model encodes it and restarts the kept state on it when
        the rows match (``new_state(..., reuse=)``)."""
        model = self._model()
        if batch is not None:
            key = (max_len, "source")
            state = model.new_state(batch, max_len=max_len, reuse=self._states.get(key))
            self._states[key] = state
            return state
        key = (max_len, "lm")
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = model.new_state(None, max_len=max_len)
        else:
            state.reset()
        return state

    def ready(self, state: Any) -> bool:
        """Whether the compiled step takes the next step of ``state`` (prefix mode: from two
        positions held, so the symbolic length is never specialised to 1)."""
        return state.length > (1 if self.prefix else 0)

    def __call__(self, tokens: torch.Tensor, state: Any) -> torch.Tensor:
        """Logits ``(B, 1, V)`` of one new token per row after what ``state`` holds."""
        if tokens.shape[1] != 1:
            raise InputError(f"the compiled step takes one token per row, got {tokens.shape[1]}")
        model = self._model()
        if self.prefix:  # the state advances itself inside the graph, as an eager step
            if state.fixed:
                state.unfix()
            # no duck sizing: a length that happens to equal another size (the number of
            # heads, say) must not be tied to it, or the next length would recompile
            with fx_config.patch(use_duck_shape=False):
                return self.fn(model, tokens, state)[:, None]
        if not state.fixed:
            state.fix()
            shapes = (tuple(tokens.shape), *(tuple(t.shape) for t in state.fixed_tensors()))
            self._eager = shapes not in self._graphs and len(self._graphs) >= MAX_GRAPHS
            if not self._eager:
                self._graphs.add(shapes)
            if self.cuda and not self._eager:  # CUDA graphs read the state at fixed addresses
                for t in state.fixed_tensors():
                    torch._dynamo.mark_static_address(t)
        if self._eager:  # the same fixed-mode step, uncompiled
            logits = _one_step(model, tokens, state)
            state.commit(1)
            return logits[:, None]
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        logits = self.fn(model, tokens, state)
        state.commit(1)
        # a CUDA graph's output is overwritten by the next replay: keep a copy
        return (logits.clone() if self.cuda else logits)[:, None]


def compiled_step(
    model: torch.nn.Module,
    backend: str | None = None,
    mode: str | None = None,
    prefix: bool | None = None,
) -> CompiledStep:
    """The :class:`CompiledStep` of ``model`` for this backend, mode and ``prefix``, made on
    first use and kept as long as the model lives (so every later call reuses its graphs)."""
    steps = _STEPS.setdefault(model, {})
    key = (backend, mode, prefix)
    if key not in steps:
        steps[key] = CompiledStep(model, backend=backend, mode=mode, prefix=prefix)
    return steps[key]


class CompiledRunner(EagerRunner):
    """The ``compiled`` backend: one-token steps after the prompt through the model's
    :class:`CompiledStep` (the decode loop asks :attr:`compiled` for its state and readiness),
    every other call through ``fallback`` (the uncompiled runner: the C step or eager)."""

    name = "compiled"

    def __init__(self, model: torch.nn.Module, compile: Any = True, reason: str = "",
                 fallback: Any = None) -> None:  # fmt: skip
        super().__init__(model, reason)
        self.compiled = compile if isinstance(compile, CompiledStep) else compiled_step(model)
        self.fallback = fallback or EagerRunner(model)

    def step(self, tokens: torch.Tensor, state: Any, last_only: bool = False) -> torch.Tensor:
        return self.fallback.step(tokens, state, last_only)
