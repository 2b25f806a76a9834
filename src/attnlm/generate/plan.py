"""The decisions of one decode, taken once before its first step: which backend runs it
(:func:`attnlm.runtime.planner.runner_for`: eager, compiled or the C step), which decoding
state (none, growing, static), the window (crop or slide past it) and whether greedy drafts
from the context check several tokens per pass (lookahead).

They depend on the model's family (its :class:`~attnlm.models.base.Decoding` record: position
scheme, window, static state, compiled step), on the call (one prompt or many, greedy or
sampled, a source to condition on, an end token) and on the caller's switches (``use_cache``,
``static``, ``compile``, ``lookahead``). :func:`attnlm.generate.loop.decode` then runs one loop
that follows the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from attnlm.base.errors import InputError
from attnlm.generate.options import DecodeOptions
from attnlm.models.registry import decoding_of
from attnlm.nn.static_cache import padded_length

if TYPE_CHECKING:
    from attnlm.runtime.compiled import CompiledStep

NO_STATE, GROWING, STATIC = "none", "growing", "static"


@dataclass(frozen=True)
class Plan:
    """How one decode runs.

    ``window``: the most positions the model sees (None: any number). ``slide``: past the
    window the state drops its oldest positions (relative or no positions); otherwise the last
    window is recomputed at every step (learned positions). ``state``: :data:`NO_STATE` (the
    model recomputes the context at every step), :data:`GROWING` (a cache that grows) or
    :data:`STATIC` (buffers of ``max_len`` positions allocated once). ``step``: the compiled
    one-token step, or None for the model's eager ``step``. ``lookahead``: draft tokens checked
    per pass by :mod:`attnlm.generate.lookahead` (greedy, one prompt), 0 for one token a pass.
    ``runner``: the backend (:mod:`attnlm.runtime`) every step goes through.
    """

    window: int | None
    slide: bool
    state: str
    max_len: int | None = None
    step: CompiledStep | None = None
    lookahead: int = 0
    runner: Any = None


def plan_decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    greedy: bool,
    options: DecodeOptions | None = None,
    *,
    conditioned: bool = False,
    watched: bool = False,
) -> Plan:
    """The :class:`Plan` of decoding ``prompts`` by ``max_new_tokens`` as ``options`` say
    (:class:`DecodeOptions`). ``conditioned``: the decode starts from a state batch (an
    encoder-decoder's sources); ``watched``: an end token or a logits processor looks at every
    step (no drafts then). The backend is ``options.runner``, else the one
    :func:`~attnlm.runtime.planner.runner_for` chooses."""
    o = options or DecodeOptions()
    runner = o.runner
    if runner is None:
        from attnlm.runtime.planner import runner_for

        runner = runner_for(model, compile=o.compile)
    plan = _plan(model, prompts, max_new_tokens, greedy, o, runner, conditioned, watched)
    return replace(plan, runner=runner)


def _plan(model, prompts, max_new_tokens, greedy, o: DecodeOptions, runner, conditioned, watched
          ) -> Plan:  # fmt: skip
    """The plan's state, window and drafts (:func:`plan_decode`), for ``runner``."""
    use_cache, static, lookahead = o.use_cache, o.static, o.lookahead
    decoding = decoding_of(model)
    window = decoding.context(model.config) if decoding.window else None
    slide = window is None or decoding.slides(model.config)
    total = max(len(p) for p in prompts) + max_new_tokens
    fits = window is None or total <= window
    has_state = use_cache and hasattr(model, "new_state")
    if conditioned and not has_state:
        raise InputError("decoding with a source needs the model's decoding state")
    step = getattr(runner, "compiled", None)
    drafts = (
        step is None
        and greedy
        and use_cache
        and lookahead > 0
        and max_new_tokens > 0
        and len(prompts) == 1
        and not (conditioned or watched)
        and window is not None
        and fits
        and decoding.drafts
    )
    if drafts:
        return Plan(window, slide, NO_STATE, lookahead=lookahead)
    if not has_state:
        return Plan(window, slide, NO_STATE)
    if not (static and decoding.static_state and total > 0):
        return Plan(window, slide, GROWING)
    if step is not None and fits:  # one graph for every call: buffers of a fixed length
        max_len = padded_length(total) if window is None else window
        return Plan(window, slide, STATIC, max_len, step)
    return Plan(window, slide, STATIC, total if window is None else min(total, window))
