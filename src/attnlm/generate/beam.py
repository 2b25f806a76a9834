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
from typing import Any

import torch

from attnlm.device import eval_mode, model_device
from attnlm.errors import InputError
from attnlm.generate.sampling import SamplingConfig
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
) -> list[list[int]]:
    """The best hypothesis for each source (a list of token ids), see the module docstring.

    For a decoder-only model the sources are prompts and the result is the continuation (the
    end token included when it was produced); a model's ``prepare_decoding`` may include its
    start token (``keep_prompt``). ``eos_id`` overrides the model's end token.
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


def _search(
    runner: Any,
    setup: DecodingSetup,
    K: int,
    length_penalty: float,
    early_stopping: bool | str,
    max_new_tokens: int,
) -> list[list[int]]:
    device = model_device(runner.model)
    prompts = torch.tensor(setup.prompts, dtype=torch.long, device=device)  # (B, P)
    B, P = prompts.shape
    max_len = P + max_new_tokens
    eos = setup.eos_id
    state = runner.new_state(setup.state_batch)
    expand = torch.arange(B, device=device).repeat_interleave(K)  # row b*K + k <- source b
    logits = runner.step(prompts, state)[:, -1]  # (B, V): the prompt once per source
    state.reorder(expand)  # every beam of a source starts from the source's state
    logits = logits.index_select(0, expand)  # (B*K, V)
    V = logits.shape[-1]

    running = prompts.index_select(0, expand).view(B, K, P)  # (B, K, L)
    running_scores = torch.zeros(B, K, device=device)
    running_scores[:, 1:] = NEG  # only beam 0 is live at the start (no duplicate beams)
    pool = torch.full((B, K, max_len), -1, dtype=torch.long, device=device)
    pool_scores = torch.full((B, K), NEG, device=device)
    pool_done = torch.zeros(B, K, dtype=torch.bool, device=device)
    can_improve = torch.ones(B, 1, dtype=torch.bool, device=device)
    top_k_mask = torch.zeros(2 * K, dtype=torch.bool, device=device)
    top_k_mask[:K] = True
    cur = P
    ids = list(range(B))  # the source of each row of the per-source tensors below
    results: list[torch.Tensor] = [pool[0, 0]] * B  # the best finished hypothesis per source
    while True:
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        if setup.process is not None:  # as transformers: processors see log-probs
            logp = setup.process(logp, cur, max_len)
        logp = logp.view(B, K, V)
        total = (logp + running_scores[:, :, None]).view(B, K * V)
        cand_scores, cand_idx = torch.topk(total, 2 * K)  # (B, 2K), best first
        parent, token = cand_idx // V, cand_idx % V
        cand = torch.cat(
            [running.gather(1, parent[:, :, None].expand(B, 2 * K, cur)), token[:, :, None]],
            dim=2,
        )  # (B, 2K, cur + 1)
        ends = torch.zeros_like(token, dtype=torch.bool) if eos is None else token == eos
        ends = ends | (cur + 1 >= max_len)

        # the best K candidates that go on
        live_scores = cand_scores + ends.float() * NEG
        keep = torch.topk(live_scores, K).indices  # (B, K)
        running = cand.gather(1, keep[:, :, None].expand(B, K, cur + 1))
        running_scores = live_scores.gather(1, keep)
        parents = parent.gather(1, keep)  # (B, K)

        # candidates that end join the finished pool (among the best K only)
        finished = cand_scores / float(cur + 1 - P) ** length_penalty
        pool_full = pool_done.all(dim=1, keepdim=True) & (early_stopping is True)
        finished = finished + pool_full.float() * NEG + (~can_improve).float() * NEG
        just = ends & top_k_mask[None, :]
        finished = finished + (~just).float() * NEG
        padded = torch.full((B, 2 * K, max_len), -1, dtype=torch.long, device=device)
        padded[:, :, : cur + 1] = cand
        merged = torch.cat([pool_scores, finished], dim=1)  # (B, 3K)
        best = torch.topk(merged, K).indices
        pool = torch.cat([pool, padded], dim=1).gather(1, best[:, :, None].expand(B, K, max_len))
        pool_scores = merged.gather(1, best)
        pool_done = torch.cat([pool_done, just], dim=1).gather(1, best)

        cur += 1
        # can a running hypothesis still beat the worst finished one?
        if early_stopping == "never" and length_penalty > 0:
            best_len = max_len - P
        else:
            best_len = cur - P
        best_possible = running_scores[:, :1] / float(best_len) ** length_penalty
        worst = torch.where(pool_done, pool_scores.min(dim=1, keepdim=True).values, NEG)
        can_improve = can_improve & (best_possible > worst).any(dim=-1, keepdim=True)
        # a source is settled when nothing can enter its pool any more (no running hypothesis
        # can beat the worst finished one, or early_stopping=True and K have finished): from
        # then on its pool never changes, so it leaves the batch (the hypotheses of the other
        # sources are unaffected) instead of being decoded until every source is settled
        settled = ~can_improve[:, 0]
        if early_stopping is True:
            settled = settled | pool_done.all(dim=1)
        # every candidate ending (the length limit) fills the pools of unsettled sources
        if bool(ends.all()) or bool(settled.all()):
            break
        rows = torch.arange(B, device=device)
        if bool(settled.any()):
            for b in settled.nonzero()[:, 0].tolist():
                results[ids[b]] = pool[b, 0]
            rows = (~settled).nonzero()[:, 0]  # (B',) the sources that go on
            ids = [ids[b] for b in rows.tolist()]
            running, running_scores = running.index_select(0, rows), running_scores[rows]
            pool, pool_scores, pool_done = pool[rows], pool_scores[rows], pool_done[rows]
            can_improve, parents = can_improve[rows], parents[rows]
            B = len(ids)
        flat = (rows[:, None] * K + parents).view(-1)
        state.reorder(flat)
        logits = runner.step(running[:, :, -1].reshape(B * K, 1), state)[:, -1]

    for b in range(B):
        results[ids[b]] = pool[b, 0]
    start = 0 if setup.keep_prompt else P
    out = []
    for seq in results:
        seq = [t for t in seq.tolist() if t != -1]
        out.append(seq[start:])
    return out
