"""``attnlm compare --init-from SPEC``: a pretrained model fine-tuned on the text for the same
budget, scored on the same characters with its own tokenizer."""

from __future__ import annotations

import json

import pytest
from tests.support import ROMEO
from tests.train.test_finetune import tiny_gpt2_folder

pytestmark = pytest.mark.usefixtures("one_thread")


def test_compare_adds_a_fine_tuned_row(cli, tmp_path):
    from attnlm.data.corpus import DEFAULT_VAL_FRACTION, split_text

    source = tiny_gpt2_folder(tmp_path / "gpt2")
    text = tmp_path / "text.txt"
    text.write_text(ROMEO)
    out = tmp_path / "cmp"
    r = cli("compare", "--text", text, "--models", "ngram", "--init-from", source, "--budget",
            "2s", "--out", out, "--val-chars", "200", "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    name = f"init-from:{source.resolve()}"
    assert name in r.out
    rows = {row["model"]: row for row in json.loads((out / "compare.json").read_text())["rows"]}
    assert set(rows) == {"ngram", name}
    run = out / ("init-from-" + str(source.resolve()).strip("/").replace("/", "-"))
    config = json.loads((run / "checkpoint" / "config.json").read_text())
    assert config["init_from"]["spec"] == str(source.resolve())
    # the row's score is the run's exact bits per character on the same 200 characters
    _, val = split_text(ROMEO, DEFAULT_VAL_FRACTION)
    scored = tmp_path / "scored.txt"
    scored.write_text(val[:200])
    r = cli("eval", "--model", run, "--text", scored, "--json")
    assert r.code == 0, r.err
    assert rows[name]["val_bpc"] == pytest.approx(json.loads(r.out)["bpc"], abs=1e-3)


def test_compare_refuses_an_empty_init_from_row(cli, tmp_path):
    r = cli("compare", "--models", "gpt,init-from:", "--out", tmp_path / "cmp")
    assert r.code == 2 and "init-from:SPEC" in r.err
