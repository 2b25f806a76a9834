"""A character run evaluated on a text with characters its corpus lacked: without ``<unk>`` the
error counts them and names the flag; ``train --unk`` (or ``--set train.unk=true``) gives a
run whose ``eval`` maps them to ``<unk>`` and reports how many there were."""

from __future__ import annotations

import json

import pytest

from attnlm.tokenizers.base import load

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = "--preset tiny-test --max-iters 2 --eval-iters 1 --no-progress".split()


def _unseen(corpus_text: str, other_text: str) -> int:
    known = set(corpus_text)
    return sum(c not in known for c in other_text)


def test_eval_without_unk_counts_unseen_characters(cli, corpus, romeo_file, tmp_path):
    assert cli("train", *TRAIN, "--text", corpus, "--out", tmp_path / "run").code == 0
    r = cli("eval", "--checkpoint", tmp_path / "run", "--text", romeo_file)
    assert r.code == 2
    n = _unseen(corpus.read_text(), romeo_file.read_text())
    assert n > 0
    assert f"{n:,} characters" in r.err and "--unk" in r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("how", [["--unk"], ["--set", "train.unk=true"]])
def test_train_unk_lets_eval_count_unknown_characters(cli, corpus, romeo_file, tmp_path, how):
    run = tmp_path / "run"
    assert cli("train", *TRAIN, *how, "--text", corpus, "--out", run).code == 0
    tok = load(run / "checkpoint" / "tokenizer.json")
    assert tok.unk and tok.vocab_size == len(set(corpus.read_text())) + 1
    r = cli("eval", "--checkpoint", run, "--text", romeo_file, "--json")
    assert r.code == 0, r.err
    got = json.loads(r.out)
    text = romeo_file.read_text()
    want = _unseen(corpus.read_text(), text)  # every unseen character is one <unk> token
    assert got["unknown"] == want > 0
    r = cli("eval", "--checkpoint", run, "--text", romeo_file)
    assert f"unknown (<unk>): {want:,} of the text's tokens" in r.out


def test_eval_of_a_run_without_unk_reports_no_count(cli, corpus, tmp_path):
    assert cli("train", *TRAIN, "--text", corpus, "--out", tmp_path / "run").code == 0
    r = cli("eval", "--checkpoint", tmp_path / "run", "--text", corpus, "--json")
    assert r.code == 0 and json.loads(r.out)["unknown"] is None
