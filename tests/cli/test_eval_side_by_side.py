"""``attnlm eval --model BASE --model RUN --text FILE``: both models in one table whose rows are
what ``attnlm eval --model SPEC --text FILE --json`` gives for each alone; ``--json`` gives
them as a list; without ``--text`` a one-line refusal; one ``--model`` prints as before."""

from __future__ import annotations

import json

import pytest

from support import run_cli
from support_lora import TEXT, make_base, make_lora_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def models(tmp_path):
    base = make_base(tmp_path)
    run, _, _ = make_lora_run(tmp_path, base)
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 8, encoding="utf-8")
    return base, run, text


def _alone(capsys, spec, text):
    got = run_cli(capsys, "eval", "--model", spec, "--text", text, "--json")
    assert got.code == 0, got.err
    return json.loads(got.out)


def test_base_and_run_side_by_side_match_each_alone(models, capsys):
    base, run, text = models
    want = [_alone(capsys, spec, text) for spec in (base, run)]
    assert want[0]["bpc"] != want[1]["bpc"]  # the adapters change the model
    got = run_cli(capsys, "eval", "--model", base, "--model", run, "--text", text)
    assert got.code == 0, got.err
    lines = got.out.splitlines()
    assert lines[0] == f"evaluated: {want[0]['data']}" and want[0]["data"] == want[1]["data"]
    lines = lines[-3:]
    assert lines[0].split() == ["model", "loss", "perplexity", "bits/char", "bits/token",
                                "tokens", "vs", "(1)"]  # fmt: skip
    for i, (line, w) in enumerate(zip(lines[1:], want), start=1):
        cells = line.split()
        assert cells[0] == f"({i})" and cells[1] == str([base, run][i - 1])
        assert float(cells[2]) == pytest.approx(w["loss"], abs=1e-4)
        assert float(cells[4]) == pytest.approx(w["bpc"], abs=1e-4)
    change = 100 * (want[1]["bpc"] - want[0]["bpc"]) / want[0]["bpc"]
    assert lines[2].split()[-1] == f"{change:+.2f}%"

    as_json = run_cli(capsys, "eval", "--model", base, "--model", run, "--text", text, "--json")
    assert as_json.code == 0, as_json.err
    doc = json.loads(as_json.out)
    assert [r["model"] for r in doc["results"]] == [str(base), str(run)]
    for r, w in zip(doc["results"], want):
        assert r["bpc"] == pytest.approx(w["bpc"], abs=1e-6) and r["data"] == w["data"]


def test_side_by_side_needs_a_text_and_one_model_prints_as_before(models, capsys):
    base, run, text = models
    refused = run_cli(capsys, "eval", "--model", base, "--model", run)
    assert refused.code == 2 and "--text" in refused.err and refused.err.count("\n") == 1
    one = run_cli(capsys, "eval", "--model", base, "--text", text)
    assert one.code == 0 and one.out.startswith("evaluated: ")
    assert "bits per character: " in one.out
