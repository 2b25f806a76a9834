"""How a decode runs (:class:`DecodeOptions`), kept apart from PyTorch: a command that decodes on
the C engine builds it without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class DecodeOptions:
    """How a decode runs, apart from how tokens are picked (that is
    :class:`~attnlm.generate.sampling.SamplingConfig`): the same tokens whatever they say.

    ``use_cache``: feed only new tokens to the decoding state (False: recompute the context
    each step); ``static``: families with a static state (``gpt``, ``llama``, ``transformer``)
    decode into buffers allocated once (:mod:`attnlm.nn.static_cache`); ``compile``: every
    one-token step after the prompt through one compiled graph (:mod:`attnlm.runtime.compiled`;
    True or a :class:`~attnlm.runtime.compiled.CompiledStep`) while prompt + new tokens fit the
    window; ``lookahead``: greedy decoding of one prompt that fits the window checks up to this
    many draft tokens per pass (:mod:`attnlm.generate.lookahead`), 0 turns it off; ``draft``:
    a cheaper model whose greedy tokens are those drafts instead of copies from the context
    (:func:`~attnlm.generate.speculative.draft_model`); ``runner``: the backend every step goes
    through (:mod:`attnlm.runtime`; None: :func:`~attnlm.runtime.planner.runner_for` chooses
    it once, ``compile`` included)."""

    use_cache: bool = True
    static: bool = True
    compile: Any = False
    lookahead: int = 8
    draft: Any = None
    runner: Any = None

    def with_(self, **changes: Any) -> DecodeOptions:
        """A copy with ``changes``."""
        return replace(self, **changes)
