"""Beam search with length penalty and early stopping as Hugging Face ``transformers`` defines
them, for every family with the decoding-state protocol (``new_state``, ``step``,
``state.reorder``).

Each source keeps ``K = num_beams`` running hypotheses scored by the sum of their tokens'
log-probabilities. Every step:

1. each running hypothesis is extended by every token; the best ``2K`` extensions over all
   beams are candidates (so at least ``K`` remain when some end);
2. a candidate that ends (the end token, or the length limit) joins the finished hypotheses
   only if it ranks among the best ``K`` candidates, with score ``sum_logprobs / L **
   length_penalty`` (``L`` = generated length, the end token included, the prompt or decoder
   start excluded); the finished pool keeps the best ``K``;
3. the best ``K`` candidates that did not end become the running hypotheses; the decoding
   state follows them (``state.reorder``: a hypothesis takes its parent's cache);
4. the search for a source stops when no running hypothesis can beat the worst finished one:
   ``early_stopping=True`` as soon as ``K`` hypotheses are finished; ``False`` when the best
   running score divided by the current generated length ** penalty cannot beat the worst
   finished score; ``"never"`` uses the maximum length instead when the penalty is positive.

The best finished hypothesis of each source is returned. As in ``transformers``, one beam is
plain greedy decoding (length penalty and early stopping do not apply). A model may define
``prepare_decoding(sources) -> DecodingSetup`` (:mod:`attnlm.models.base`) to say what the
decoder starts from (an encoder-decoder starts from its start token and conditions on the
source); by default the sources are prompts that the hypotheses continue.

Shapes: ``B`` sources, ``K`` beams, ``V`` vocabulary, ``L`` tokens so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnlm.base.device import eval_mode, model_device
from attnlm.base.errors import InputError
from attnlm.generate.sampling import SamplingConfig, masking
from attnlm.models.base import DecodingSetup

NEG = -1.0e9  # the score of an impossible hypothesis (as transformers uses)
EARLY_STOPPING = (True, False, "never")


def _setup(model: torch.nn.Module, sources: Sequence[Sequence[int]], eos_id: int | None):
    if hasattr(model, "prepare_decoding"):
        setup = model.prepare_decoding(sources)
    else:
        setup = DecodingSetup(prompts=[list(s) for s in sources])
    if eos_id is not None:
        setup.eos_id = eos_id
    return setup


@torch.inference_mode()
def beam_search(
    model: torch.nn.Module,
    sources: Sequence[Sequence[int]],
    num_beams: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    max_new_tokens: int = 64,
    *,
    eos_id: int | None = None,
    vocab_limit: int | None = None,
) -> list[list[int]]:
    """The best hypothesis for each source (a list of token ids), see the module docstring.

    For a decoder-only model the sources are prompts and the result is the continuation (the
    end token included when it was produced); a model's ``prepare_decoding`` may include its
    start token (``keep_prompt``). ``eos_id`` overrides the model's end token; ids from
    ``vocab_limit`` on are never chosen (a model with more rows than its tokenizer has ids).
    """
    if not isinstance(num_beams, int) or num_beams < 1:
        raise InputError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if early_stopping not in EARLY_STOPPING:
        raise InputError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not sources or any(len(s) == 0 for s in sources):
        raise InputError("beam search needs at least one non-empty source")
    if not hasattr(model, "new_state"):
        raise InputError(f"{type(model).__name__} has no decoding state (new_state/step)")
    setup = _setup(model, sources, eos_id)
    setup.process = masking(setup.process, vocab_limit)
    if num_beams == 1:
        return _greedy(model, setup, max_new_tokens)
    from attnlm.runtime.planner import runner_for

    runner = runner_for(model)  # the backend (attnlm.runtime), chosen once
    results: list[list[int] | None] = [None] * len(sources)
    # rows with equal prompt lengths search together (no padding inside a prompt)
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(setup.prompts):
        groups.setdefault(len(p), []).append(i)
    with eval_mode(model):
        for _, rows in sorted(groups.items()):
            batch = setup.select(rows)
            found = _search(
                runner, batch, num_beams, length_penalty, early_stopping, max_new_tokens
            )
            for i, hyp in zip(rows, found):
                results[i] = hyp
    return [r for r in results if r is not None]


def _greedy(model: torch.nn.Module, setup: DecodingSetup, max_new_tokens: int) -> list[list[int]]:
    """One beam: greedy decoding through the same decoding state."""
    from attnlm.generate.loop import decode
    from attnlm.generate.options import DecodeOptions

    new = decode(
        model,
        setup.prompts,
        SamplingConfig(temperature=0, max_new_tokens=max_new_tokens),
        DecodeOptions(lookahead=0),
        eos_id=setup.eos_id,
        state_batch=setup.state_batch,
        process=setup.process,
    )
    if setup.keep_prompt:
        return [list(p) + n for p, n in zip(setup.prompts, new)]
    return new


@dataclass
class _Beams:
    """The search's tensors for the ``B`` sources still searched (``ids``: the source of each
    row): running hypotheses ``(B, K, L)`` and their scores ``(B, K)``, the finished pool
    ``(B, K, max_len)`` (-1 past a hypothesis' end), its scores and which entries are filled,
    and whether a running hypothesis may still enter the pool ``(B, 1)``."""

    running: torch.Tensor
    running_scores: torch.Tensor
    pool: torch.Tensor
    pool_scores: torch.Tensor
    pool_done: torch.Tensor
    can_improve: torch.Tensor
    ids: list[int]

    @classmethod
    def start(cls, prompts: torch.Tensor, expand: torch.Tensor, K: int, max_len: int) -> _Beams:
        """Every beam of a source its prompt; only beam 0 is live (no duplicate beams)."""
        B, P = prompts.shape
        device = prompts.device
        scores = torch.zeros(B, K, device=device)
        scores[:, 1:] = NEG
        return cls(
            prompts.index_select(0, expand).view(B, K, P), scores,
            torch.full((B, K, max_len), -1, dtype=torch.long, device=device),
            torch.full((B, K), NEG, device=device), torch.zeros(B, K, dtype=torch.bool,
                                                                 device=device),
            torch.ones(B, 1, dtype=torch.bool, device=device), list(range(B)),
        )  # fmt: skip

    def keep(self, rows: torch.Tensor) -> None:
        """Keep the sources of ``rows`` ``(B',)`` alone."""
        self.ids = [self.ids[b] for b in rows.tolist()]
        self.running, self.running_scores = self.running[rows], self.running_scores[rows]
        self.pool, self.pool_scores = self.pool[rows], self.pool_scores[rows]
        self.pool_done, self.can_improve = self.pool_done[rows], self.can_improve[rows]


@dataclass(frozen=True)
class _Rule:
    """What the search is asked: ``K`` beams, prompts of ``P`` tokens, at most ``max_len``
    tokens, the end token, the length penalty and the stopping rule."""

    K: int
    P: int
    max_len: int
    eos: int | None
    length_penalty: float
    early_stopping: bool | str


def _extend(beams: _Beams, logp: torch.Tensor, cur: int, rule: _Rule) -> tuple:
    """One step of every source (the module docstring's steps 1-3) from log-probabilities
    ``(B, K, V)``: the running hypotheses and the pool updated; returns whether each
    candidate ended ``(B, 2K)`` and each new running hypothesis' parent beam ``(B, K)``."""
    B, K, V = logp.shape
    total = (logp + beams.running_scores[:, :, None]).view(B, K * V)
    cand_scores, cand_idx = torch.topk(total, 2 * K)  # (B, 2K), best first
    parent, token = cand_idx // V, cand_idx % V
    gathered = beams.running.gather(1, parent[:, :, None].expand(B, 2 * K, cur))
    cand = torch.cat([gathered, token[:, :, None]], dim=2)  # (B, 2K, cur + 1)
    ends = torch.zeros_like(token, dtype=torch.bool) if rule.eos is None else token == rule.eos
    ends = ends | (cur + 1 >= rule.max_len)
    # the best K candidates that go on
    live_scores = cand_scores + ends.float() * NEG
    keep = torch.topk(live_scores, K).indices  # (B, K)
    beams.running = cand.gather(1, keep[:, :, None].expand(B, K, cur + 1))
    beams.running_scores = live_scores.gather(1, keep)
    # candidates that end join the finished pool (among the best K only)
    finished = cand_scores / float(cur + 1 - rule.P) ** rule.length_penalty
    pool_full = beams.pool_done.all(dim=1, keepdim=True) & (rule.early_stopping is True)
    finished = finished + pool_full.float() * NEG + (~beams.can_improve).float() * NEG
    just = ends & (torch.arange(2 * K, device=ends.device) < K)[None, :]
    finished = finished + (~just).float() * NEG
    padded = torch.full((B, 2 * K, rule.max_len), -1, dtype=torch.long, device=cand.device)
    padded[:, :, : cur + 1] = cand
    merged = torch.cat([beams.pool_scores, finished], dim=1)  # (B, 3K)
    best = torch.topk(merged, K).indices
    pool = torch.cat([beams.pool, padded], dim=1)
    beams.pool = pool.gather(1, best[:, :, None].expand(B, K, rule.max_len))
    beams.pool_scores = merged.gather(1, best)
    beams.pool_done = torch.cat([beams.pool_done, just], dim=1).gather(1, best)
    return ends, parent.gather(1, keep)


def _settled(beams: _Beams, cur: int, rule: _Rule) -> torch.Tensor:
    """Which sources are settled ``(B,)`` after position ``cur`` (step 4): nothing can enter
    their pool any more (no running hypothesis can beat the worst finished one, or
    ``early_stopping=True`` and K have finished), so their pool never changes again."""
    if rule.early_stopping == "never" and rule.length_penalty > 0:
        best_len = rule.max_len - rule.P
    else:
        best_len = cur - rule.P
    best_possible = beams.running_scores[:, :1] / float(best_len) ** rule.length_penalty
    worst = torch.where(beams.pool_done, beams.pool_scores.min(dim=1, keepdim=True).values, NEG)
    beams.can_improve = beams.can_improve & (best_possible > worst).any(dim=-1, keepdim=True)
    settled = ~beams.can_improve[:, 0]
    if rule.early_stopping is True:
        settled = settled | beams.pool_done.all(dim=1)
    return settled


def _search(
    runner: Any,
    setup: DecodingSetup,
    K: int,
    length_penalty: float,
    early_stopping: bool | str,
    max_new_tokens: int,
) -> list[list[int]]:
    prompts = torch.tensor(setup.prompts, dtype=torch.long, device=model_device(runner.model))
    B, P = prompts.shape  # (B, P)
    rule = _Rule(K, P, P + max_new_tokens, setup.eos_id, length_penalty, early_stopping)
    state = runner.new_state(setup.state_batch)
    expand = torch.arange(B, device=prompts.device).repeat_interleave(K)  # row b*K+k <- b
    logits = runner.step(prompts, state)[:, -1]  # (B, V): the prompt once per source
    state.reorder(expand)  # every beam of a source starts from the source's state
    logits = logits.index_select(0, expand)  # (B*K, V)
    beams = _Beams.start(prompts, expand, K, rule.max_len)
    results: list[torch.Tensor] = [beams.pool[0, 0]] * B  # the best finished per source
    cur = P
    while True:
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        if setup.process is not None:  # as transformers: processors see log-probs
            logp = setup.process(logp, cur, rule.max_len)
        ends, parents = _extend(beams, logp.view(len(beams.ids), K, -1), cur, rule)
        cur += 1
        settled = _settled(beams, cur, rule)
        # every candidate ending (the length limit) fills the pools of unsettled sources
        if bool(ends.all()) or bool(settled.all()):
            break
        rows = torch.arange(len(beams.ids), device=prompts.device)
        if bool(settled.any()):  # a settled source leaves the batch, its pool final
            for b in settled.nonzero()[:, 0].tolist():
                results[beams.ids[b]] = beams.pool[b, 0]
            rows = (~settled).nonzero()[:, 0]  # (B',) the sources that go on
            beams.keep(rows)
            parents = parents[rows]
        state.reorder((rows[:, None] * K + parents).view(-1))
        logits = runner.step(beams.running[:, :, -1].reshape(-1, 1), state)[:, -1]
    for b, source in enumerate(beams.ids):
        results[source] = beams.pool[b, 0]
    start = 0 if setup.keep_prompt else P
    return [[t for t in seq.tolist() if t != -1][start:] for seq in results]
