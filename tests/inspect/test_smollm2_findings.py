"""The findings docs/interpretability.md reports on SmolLM2-135M-Instruct (``slow``: the real
model), checked as stated there."""

from __future__ import annotations

import statistics

import pytest

pytestmark = pytest.mark.slow

FRANCE, ITALY = "The capital of France is", "The capital of Italy is"


@pytest.fixture(scope="module")
def smollm2():
    from attnlm.loading.sources import resolve
    from gguf_support import smollm2_file

    smollm2_file(fetch=True)
    model, tok, _ = resolve("smollm2-135m-instruct", "cpu", "f32")
    return model, tok


def test_induction_heads_in_layers_17_and_18(smollm2):
    from attnlm.inspect.experiments import head_scores

    scores = head_scores(smollm2[0], "induction")["scores"]
    flat = sorted(((v, f"{i}.{j}") for i, row in enumerate(scores) for j, v in enumerate(row)),
                  reverse=True)  # fmt: skip
    median = statistics.median(v for v, _ in flat)
    assert [h for _, h in flat[:5]] == ["18.6", "17.4", "17.3", "17.5", "18.7"]
    assert flat[0][0] == pytest.approx(0.89, abs=0.01) and median < 0.02
    assert flat[4][0] > 20 * median


def test_the_france_prompt_moves_at_layer_24_through_head_23_4(smollm2):
    from attnlm.inspect.experiments import ablation, attribution, patching

    model, tok = smollm2
    out = patching(model, tok, FRANCE, ITALY, " Paris", " Rome")
    france, last = out["tokens"].index(" France"), len(out["tokens"]) - 1
    assert all(out["resid"][layer][france] > 0.99 for layer in range(24))
    assert all(out["resid"][layer][last] > 0.98 for layer in range(24, 30))
    assert all(abs(out["resid"][layer][france]) < 0.05 for layer in range(24, 30))
    heads = sorted(((v, f"{i}.{j}") for i, row in enumerate(out["heads"])
                    for j, v in enumerate(row)), reverse=True)  # fmt: skip
    assert heads[0][1] == "23.4" and heads[0][0] == pytest.approx(0.93, abs=0.01)
    assert heads[1][1] == "29.1" and heads[1][0] == pytest.approx(0.33, abs=0.01)
    ab = ablation(model, tok, FRANCE, [(23, 4)])
    paris = next(r for r in ab["top"] if r["token"] == " Paris")
    assert paris["p"] == pytest.approx(0.77, abs=0.01)
    assert paris["p_ablated"] == pytest.approx(0.14, abs=0.01)
    assert ab["kl"] == pytest.approx(1.20, abs=0.01)
    attr = attribution(model, tok, FRANCE, " Paris")
    best = max((v, f"{i}.{j}") for i, row in enumerate(attr["heads"]) for j, v in enumerate(row))
    assert best[1] == "23.4" and best[0] == pytest.approx(2.8, abs=0.05)
    assert attr["logit"] == pytest.approx(17.4, abs=0.05)
    mlps = sorted(range(30), key=lambda i: -attr["mlps"][i])[:3]
    assert mlps == [29, 28, 27] and attr["mlps"][29] > best[0]
