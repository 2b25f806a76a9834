"""The runtime: the ways a model runs, as backends of one protocol.

A backend is a *runner* over one model: ``runner.new_state(batch, max_len=None)`` makes the
decoding state (one word for it: a :class:`~attnlm.nn.cache.KVCache` for the causal decoders,
the family's own record for the others) and ``runner.step(tokens (B, T), state,
last_only=False)`` feeds new tokens and returns their logits ``(B, T, V)`` (``(B, 1, V)``
with ``last_only``); ``runner.name`` and ``runner.reason`` say which backend runs and why.

- ``eager`` (:mod:`.eager`): the family's own PyTorch ``step``, with the flat one-token step
  for the causal decoders;
- ``compiled`` (:mod:`.compiled`): one ``torch.compile`` graph per one-token step;
- ``c-step`` (:mod:`.cstep`): the C step (:mod:`attnlm.native`) inside a PyTorch model, its
  weights read in their stored format;
- ``c-engine`` (:mod:`.engine`, built from a GGUF file by :mod:`.engine_gguf`): the C step
  without PyTorch, its weights numpy arrays.

:func:`~attnlm.runtime.planner.runner_for` chooses among the first three once per decode;
:func:`attnlm.loading.sources.resolve` returns an engine where
:func:`~attnlm.runtime.planner.engine_reason` says so. The model files know none of this.
Names load on first use.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".planner": "BACKENDS engine_reason runner_for",
        ".eager": "EagerRunner",
        ".engine": "Engine",
    },
)
