"""The compiled decode step: one ``torch.compile(fullgraph=True)`` graph of a one-token step
over a static decoding state, compiled once and replayed at every position of every call.

A one-token step of a small model is mostly overhead: per layer a dozen small operations
(norm, split into heads, cache write, two attention products, softmax, residual adds), each a
Python call and a kernel launch. Compiled, the whole step (every layer, the head) is one graph:
the small operations fuse into a few kernels and the Python disappears; on CUDA
(``mode="reduce-overhead"``) the graph is also captured as a CUDA graph, so a step is one
launch.

Two ways make one graph serve every position:

* **prefix** (the default on the CPU): the static state in its ordinary prefix mode, compiled
  with ``dynamic=True``: the number of positions held is a symbolic size, so each step attends
  over the filled prefix only (as the eager step does) and the same graph serves every length
  and every batch size (at batch 16, 200 tokens, about 20% faster than attending over the whole
  buffer; docs/benchmarks.md). Dynamo specialises a size of 0 or 1, so the compiled step starts
  once two positions are held (:meth:`CompiledStep.ready`).
* **fixed** (the default on CUDA, where CUDA graphs need fixed shapes and addresses): the
  static state in fixed mode (:meth:`attnlm.nn.static_cache.StaticKVCache.fix`): the buffers
  have the same shape at every step, the write position is a tensor (not a Python integer the
  graph would specialise on), and the slots not yet written are masked.

The prompt is fed uncompiled (its length varies from call to call); each later step is
``step(tokens (B, 1), state)``. The buffers are as long as the model's window, so calls reuse
the graph whatever their length (fixed mode: a new batch size compiles once more). The states
themselves are kept and reused (on CUDA the graph reads them at fixed addresses).

Families opt in with ``fixed_state = True``: their ``new_state`` takes ``max_len`` and their
``forward`` honours a fixed state (``gpt``). ``torch._dynamo.config.error_on_recompile``
turns any recompilation into an error (the tests decode 64 steps under it).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.fx.experimental import _config as fx_config

from attnlm.device import model_device
from attnlm.errors import InputError

_STEPS: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, CompiledStep]] = (
    weakref.WeakKeyDictionary()
)


def _one_step(model: torch.nn.Module, tokens: torch.Tensor, state: Any) -> torch.Tensor:
    """What is compiled: the family's own ``step`` (the decoding-state protocol)."""
    return model.step(tokens, state)[:, -1]  # (B, V)


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
        if not getattr(model, "fixed_state", False) or getattr(model, "alibi", None) is not None:
            raise InputError(
                f"{type(model).__name__} has no compiled decode step (needs a static decoding "
                f"state and no ALiBi)"
            )
        self._model = weakref.ref(model)  # the model owns this step, not the other way round
        self.cuda = model_device(model).type == "cuda"
        if mode is None and backend is None and self.cuda:
            mode = "reduce-overhead"
        options = None
        if backend is None and mode is None and not self.cuda:
            # the graph's kernels called from generated C++ instead of Python: a one-token step
            # is dozens of small kernels, and their Python calls were a third of its time
            options = {"cpp_wrapper": True}
        self.prefix = not self.cuda if prefix is None else bool(prefix)
        self.fn = torch.compile(
            _one_step,
            fullgraph=True,
            dynamic=True if self.prefix else None,
            backend=backend or "inductor",
            mode=mode,
            options=options,
        )
        self._states: dict[tuple, Any] = {}

    def fits(self, model: torch.nn.Module, total: int) -> bool:
        """Whether a decode reaching ``total`` positions runs in one buffer (no window slide)."""
        block = getattr(getattr(model, "config", None), "block_size", None)
        return block is None or total <= block

    def buffer_length(self, model: torch.nn.Module, total: int) -> int:
        """The state's length: the model's window (one graph for calls of any length)."""
        block = getattr(getattr(model, "config", None), "block_size", None)
        return total if block is None else int(block)

    def state(self, batch: dict[str, Any] | None, max_len: int) -> Any:
        """A fresh static state of ``max_len`` positions, reusing the buffers of the last one
        of this length (a state is used by one decode at a time)."""
        key = (max_len, None if batch is not None else "lm")
        state = self._states.get(key) if batch is None else None
        if state is None:
            state = self._model().new_state(batch, max_len=max_len)
            if batch is None:
                self._states[key] = state
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
        if self.prefix:  # the state advances itself inside the graph, as an eager step
            if state.fixed:
                state.unfix()
            # no duck sizing: a length that happens to equal another size (the number of
            # heads, say) must not be tied to it, or the next length would recompile
            with fx_config.patch(use_duck_shape=False):
                return self.fn(self._model(), tokens, state)[:, None]
        if not state.fixed:
            state.fix()
            if self.cuda:  # CUDA graphs read the state at fixed addresses
                for t in (*state.k_buf, *state.v_buf, state.cursor):
                    torch._dynamo.mark_static_address(t)
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        logits = self.fn(self._model(), tokens, state)
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
