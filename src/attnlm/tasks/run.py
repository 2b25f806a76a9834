"""One model on one task at one number of shots: prompts built (:mod:`attnlm.tasks.prompts`),
scored (:mod:`attnlm.tasks.score`, or greedy decoding for a generation task), aggregated
(:mod:`attnlm.tasks.metrics`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from attnlm.base.errors import InputError
from attnlm.tasks import metrics
from attnlm.tasks.files import Task
from attnlm.tasks.prompts import DEFAULT_SEED, Prompt, prompts
from attnlm.tasks.score import (
    check_requests,
    encode_request,
    encoder,
    loglikelihoods,
    prefix_id,
    takes_cache,
)


def chat_wrapper(info: Any) -> Callable[[str], str]:
    """``user_text -> prompt`` through the model's chat template (assistant turn opened)."""
    template = getattr(info, "chat_template", None)
    if template is None:
        raise InputError(f"{info.spec}: --chat needs a chat template; this model has none")
    return lambda text: template.render([{"role": "user", "content": text}],
                                        add_generation_prompt=True)  # fmt: skip


def max_positions(model: Any) -> int | None:
    """The most positions the model attends over (None: no limit, e.g. RoPE without one)."""
    config = getattr(model, "config", None)
    value = getattr(config, "block_size", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def evaluate_task(
    model: Any,
    tok: Any,
    task: Task,
    shots: int = 0,
    *,
    seed: int = DEFAULT_SEED,
    chat: Callable[[str], str] | None = None,
    batch_size: int = 16,
    on_done: Callable[[int], None] | None = None,
    stop_ids: Sequence[int] = (),
) -> dict[str, Any]:
    """The task's metrics (lm-evaluation-harness names), its per-example ``samples`` and the
    time taken. ``on_done(n)``: progress, ``n`` more examples scored."""
    if getattr(model, "is_encoder", False) or not hasattr(model, "forward"):
        raise InputError("eval --task needs a causal language model (an encoder cannot be scored)")
    started = time.perf_counter()
    asked = prompts(task, shots, seed, chat)
    if task.kind == "generation":
        samples = _generation(model, tok, task, asked, batch_size, on_done, stop_ids)
    else:
        samples = _loglikelihood(model, tok, task, asked, batch_size, on_done)
    seconds = time.perf_counter() - started
    return {
        "task": task.name,
        "kind": task.kind,
        "num_fewshot": shots,
        "examples": len(samples),
        "metrics": metrics.aggregate(task.kind, samples),
        "samples": samples,
        "seconds": seconds,
        "examples_per_second": len(samples) / seconds if seconds > 0 else None,
        "scored_with": "kv-cache" if takes_cache(model) else "full-forward",
    }


def _loglikelihood(model, tok, task, asked: list[Prompt], batch_size, on_done) -> list[dict]:
    encode, prefix = encoder(tok), prefix_id(tok)
    requests = [encode_request(encode, p.context, p.continuations, prefix) for p in asked]
    limit = max_positions(model)
    requests = check_requests(requests, limit)
    scores = loglikelihoods(model, requests, batch_size, on_done, max_len=limit)
    samples = []
    for i, (p, per_choice) in enumerate(zip(asked, scores, strict=True)):
        lls = [ll for ll, _ in per_choice]
        row: dict[str, Any] = {"index": i, "line": p.example.line, "context": p.context}
        if task.kind == "multiple_choice":
            row |= {"loglikelihoods": lls, "greedy": [g for _, g in per_choice],
                    "gold": p.example.gold}  # fmt: skip
            row |= metrics.choice_scores(lls, p.example.choices, p.example.gold)
        else:
            row |= {"loglikelihood": lls[0], "acc": float(per_choice[0][1]),
                    "target_tokens": len(requests[i].continuations[0])}  # fmt: skip
        samples.append(row)
    return samples


def _generation(model, tok, task, asked: list[Prompt], batch_size, on_done, stop_ids):
    from attnlm.generate.sampling import SamplingConfig
    from attnlm.generate.text import generate_text

    sampling = SamplingConfig(temperature=0.0, max_new_tokens=task.max_gen_toks,
                              stop=task.stops)  # fmt: skip
    samples = []
    for start in range(0, len(asked), batch_size):
        batch = asked[start : start + batch_size]
        texts = generate_text(model, tok, [p.context for p in batch], sampling,
                              stop_ids=tuple(stop_ids))  # fmt: skip
        for j, (p, text) in enumerate(zip(batch, texts, strict=True)):
            norm = (task.ignore_case, task.ignore_punctuation)
            hit = metrics.normalise(text, *norm) == metrics.normalise(p.example.answer, *norm)
            samples.append({"index": start + j, "line": p.example.line, "context": p.context,
                            "generated": text, "answer": p.example.answer,
                            "exact_match": float(hit)})  # fmt: skip
        if on_done is not None:
            on_done(len(batch))
    return samples
