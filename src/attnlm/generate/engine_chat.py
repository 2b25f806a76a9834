"""Chat on an :class:`~attnlm.runtime.engine.Engine` (the C decode step without PyTorch): the
same :class:`~attnlm.generate.chat.ChatSession`, its model-dependent steps done by the engine
and :mod:`attnlm.generate.engine_decode`'s pick."""

from __future__ import annotations

import contextlib

import numpy as np

from attnlm.generate.chat import ChatSession, _common_prefix
from attnlm.generate.engine_decode import _feed, pick


class EngineChatSession(ChatSession):
    """:class:`~attnlm.generate.chat.ChatSession` over an engine: the same conversation,
    template, stop ids and streaming; the engine's positions cut back to the common prefix of
    each turn's rendered prompt; tokens picked as :func:`decode` picks them."""

    def _setup(self) -> None:
        self.rng = np.random.default_rng(self.sampling.seed)
        self.backend = (self.model.name, self.model.reason)

    def _running(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def _drafts_apply(self) -> bool:
        return True  # the engine drops its newest positions (drop_newest)

    def _logits_every(self, ids: list[int]) -> np.ndarray:
        return _feed(self.model, np.array([ids]), last_only=False)[0]  # (T, V)

    def _drop_state(self, n: int) -> None:
        self.model.drop_newest(n)

    def _pick(self, logits: np.ndarray) -> int:
        return int(pick(logits[None], self.sampling, self.rng)[0])

    def _feed(self, ids: list[int]) -> np.ndarray:
        logits = _feed(self.model, np.array([ids]), last_only=True)[0, -1]  # (V,)
        self.cached = self.cached + ids
        return logits

    def _prefill(self, ids: list[int]) -> tuple[np.ndarray, int]:
        keep = min(_common_prefix(self.cached, ids), len(ids) - 1)  # at least one fed
        if self.state is None:  # the first turn, or after reset()
            self.model.reset(1, room=len(ids) + self.sampling.max_new_tokens)
            self.state, keep = self.model, 0
        self.model.length = keep  # the positions after the common prefix are forgotten
        self.cached = self.cached[:keep]
        return self._feed(ids[keep:]), keep
