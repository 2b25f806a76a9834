"""Few-shot prompts and metrics against lm-evaluation-harness's own code (its sampler, its
metric functions) and hand-built strings."""

from __future__ import annotations

import math
import random

import pytest

from attnlm.base.errors import InputError
from attnlm.tasks import metrics
from attnlm.tasks.files import Example, Task
from attnlm.tasks.prompts import fewshot_examples, prompts

samplers = pytest.importorskip("lm_eval.api.samplers")
lm_metrics = pytest.importorskip("lm_eval.api.metrics")


def _task(n_test=6, n_train=9, **kw):
    test = tuple(Example(f"Q{i}", (f"a{i}", f"b{i}"), i % 2) for i in range(n_test))
    train = tuple(Example(f"T{i}", (f"x{i}", f"y{i}"), 1) for i in range(n_train))
    return Task(name="t", kind="multiple_choice", test=test, train=train, **kw)


def test_prompt_text_by_hand():
    task = _task(description="Answer.\n")
    shots = list(fewshot_examples(task, 2, seed=7))
    got = prompts(task, 2, seed=7)
    s0, s1 = shots[0]
    assert got[0].context == f"Answer.\n{s0.context} {s0.answer}\n\n{s1.context} {s1.answer}\n\nQ0"
    assert got[0].continuations == (" a0", " b0")
    chat = prompts(task, 0, chat=lambda text: f"<user>{text}</user>")
    assert chat[1].context == "<user>Answer.\nQ1</user>" and chat[1].continuations == ("a1", "b1")


@pytest.mark.parametrize("seed", [1234, 0, 99])
def test_fewshot_draws_equal_lm_evals_sampler(seed):
    task = _task(n_test=20, n_train=30)
    ref = samplers.ContextSampler(list(task.train), rnd=None).set_rnd(seed)
    expected = [ref.sample(4) for _ in task.test]
    assert list(fewshot_examples(task, 4, seed)) == expected


def test_fewshot_from_the_test_split_leaves_the_example_out():
    task = _task(n_test=12, n_train=0)
    ref = samplers.ContextSampler(list(task.test), rnd=None).set_rnd(1234)
    expected = [ref.sample(3, eval_doc=e) for e in task.test]
    got = list(fewshot_examples(task, 3, 1234))
    assert got == expected
    assert all(e not in shots for e, shots in zip(task.test, got))
    with pytest.raises(InputError, match="--num-fewshot 12: the task's test split"):
        prompts(task, 12)


def test_choice_scores_by_hand_and_ties():
    # lengths 1 and 4: acc picks the larger log-likelihood, acc_norm the larger per character
    s = metrics.choice_scores([-2.0, -4.0], ["a", "abcd"], gold=1)
    assert (s["acc"], s["acc_norm"], s["pred"], s["pred_norm"]) == (0.0, 1.0, 0, 1)
    assert metrics.choice_scores([-1.0, -1.0], ["a", "b"], gold=1)["acc"] == 0.0  # first wins


def test_aggregates_equal_lm_evals_functions():
    rng = random.Random(3)
    rows = [{"acc": float(rng.random() < 0.6), "acc_norm": float(rng.random() < 0.5)}
            for _ in range(50)]  # fmt: skip
    agg = metrics.aggregate("multiple_choice", rows)
    accs = [r["acc"] for r in rows]
    assert agg["acc"] == pytest.approx(lm_metrics.mean(accs), abs=1e-12)
    assert agg["acc_stderr"] == pytest.approx(lm_metrics.mean_stderr(accs), abs=1e-12)
    lls = [-rng.uniform(0.5, 6.0) for _ in range(200)]
    cloze = metrics.aggregate("cloze", [{"loglikelihood": x, "acc": 1.0} for x in lls])
    assert cloze["perplexity"] == pytest.approx(lm_metrics.perplexity(lls), rel=1e-12)
    import os

    os.environ["DISABLE_MULTIPROC"] = "1"
    ref = lm_metrics.bootstrap_stderr(lm_metrics.perplexity, lls, iters=2000)
    assert cloze["perplexity_stderr"] == pytest.approx(ref, rel=0.1)  # both are estimates
    assert math.isfinite(cloze["perplexity_stderr"])


def test_exact_match_normalisation():
    assert metrics.normalise("  Paris.\n") == "Paris."
    assert metrics.normalise(" PARIS.", ignore_case=True, ignore_punctuation=True) == "paris"
