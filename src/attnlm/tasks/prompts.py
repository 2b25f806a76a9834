"""Few-shot prompts, built as lm-evaluation-harness builds them (its conventions are the field's,
so scores compare).

For a test example with ``K`` shots the prompt is::

    description + (ctx_1 + target_delimiter + answer_1 + fewshot_delimiter) ... x K + ctx

and each answer is scored as the continuation ``target_delimiter + answer``. The ``K`` examples
come from the train split with ``random.Random(seed).sample(train, K)``, one generator for the
whole run, drawn in test order (lm-evaluation-harness's default sampler and its default seed
1234); a task without a train split draws from its test examples, ``K + 1`` at a time, leaving
out the example being asked (its rule for that case).

With ``chat``, the whole prompt above becomes one user message rendered by the model's chat
template (with the assistant's turn opened), and the answers are scored without the target
delimiter: lm-evaluation-harness's ``--apply_chat_template`` without multi-turn few-shot.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from attnlm.tasks.files import Example, Task

DEFAULT_SEED = 1234  # lm-evaluation-harness's default few-shot seed


@dataclass(frozen=True)
class Prompt:
    """What one example asks of the model: the ``context`` and the ``continuations`` scored
    after it (for a generation, the one answer compared with what is generated)."""

    example: Example
    context: str
    continuations: tuple[str, ...]


def fewshot_examples(task: Task, k: int, seed: int = DEFAULT_SEED) -> Iterator[list[Example]]:
    """The ``k`` few-shot examples of each test example, in test order (see the module
    docstring)."""
    rnd = random.Random(seed)
    pool = list(task.train)
    for example in task.test:
        if k == 0:
            yield []
        elif pool:
            yield rnd.sample(pool, k)
        else:  # no train split: the test split, without the example itself
            drawn = rnd.sample(list(task.test), k + 1)
            kept = [e for e in drawn if e != example][:k]
            if len(kept) < k:  # duplicates of the example were drawn: draw again without them
                kept = rnd.sample([e for e in task.test if e != example], k)
            yield kept


def check_shots(task: Task, k: int) -> None:
    """Refuse ``k`` shots the task cannot give (one line naming the split's size)."""
    from attnlm.base.errors import InputError

    available = len(task.train) if task.train else len(task.test) - 1
    if k > available:
        where = "train split" if task.train else "test split (no train split; less the example)"
        raise InputError(f"--num-fewshot {k}: the task's {where} has {available} examples")


def prompts(
    task: Task,
    k: int,
    seed: int = DEFAULT_SEED,
    chat: Callable[[str], str] | None = None,
) -> list[Prompt]:
    """One :class:`Prompt` per test example with ``k`` shots; ``chat(user_text)`` renders a
    user message with the model's template (the continuations then lose the delimiter)."""
    check_shots(task, k)
    out = []
    delim = "" if chat is not None else task.target_delimiter
    for example, shots in zip(task.test, fewshot_examples(task, k, seed), strict=True):
        text = task.description + "".join(
            s.context + task.target_delimiter + s.answer + task.fewshot_delimiter for s in shots
        )
        context = text + example.context
        if chat is not None:
            context = chat(context)
        if task.kind == "generation":
            out.append(Prompt(example, context, example.choices))
        else:
            out.append(Prompt(example, context, tuple(delim + c for c in example.choices)))
    return out
