"""``attnlm train --text FILE`` without a preset (issue 22): a tokenizer and model size chosen
for the corpus (:mod:`attnlm.train.auto`), printed in one line, explicit settings winning; and
a BPE text run with ``bpe_vocab_size = 0`` sized from its training text."""

from __future__ import annotations

import json

import pytest

from attnlm.base.config import load_preset
from attnlm.train.auto import CHAR_LIMIT, SIZES, choose

pytestmark = pytest.mark.usefixtures("one_thread")

QUICK = ["--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--batch-size", "2",
         "--no-progress"]  # fmt: skip


def test_choose_by_corpus_size():
    small = choose(50_000, 60)
    assert (small.tokenizer, small.size) == ("char", "small")
    assert small.model == SIZES[0][2]
    medium = choose(1_100_000, 65)  # Shakespeare: characters, the shakespeare-char shape
    assert (medium.tokenizer, medium.size) == ("char", "medium")
    shakespeare = load_preset("shakespeare-char")["model"]
    assert {k: shakespeare[k] for k in ("n_layer", "n_embd", "block_size")} == {
        k: medium.model[k] for k in ("n_layer", "n_embd", "block_size")
    }
    big = choose(CHAR_LIMIT, 300)  # from the limit on: byte-level BPE sized from the corpus
    assert big.tokenizer == "bpe" and big.tables()["train"]["bpe_vocab_size"] == 0
    assert choose(200_000_000, 90).size == "large"
    assert choose(50_000, 60, tokenizer="bpe").tokenizer == "bpe"  # the user's tokenizer


def _config(out):
    return json.loads((out / "checkpoint" / "config.json").read_text(encoding="utf-8"))


def test_train_text_without_preset_prints_and_uses_the_setup(corpus, cli, tmp_path):
    out = tmp_path / "auto"
    r = cli("train", "--text", str(corpus), "--out", str(out), *QUICK)
    assert r.code == 0, r.err
    first = r.out.splitlines()[0]
    n = len(corpus.read_text(encoding="utf-8"))
    assert first.startswith(f"auto setup for corpus.txt ({n:,} characters")
    assert "tokenizer char" in first and "2 layers x 4 heads, width 64" in first
    cfg = _config(out)
    assert cfg["preset"] == "auto" and cfg["train"]["tokenizer"] == "char"
    assert (cfg["model"]["n_layer"], cfg["model"]["n_embd"]) == (2, 64)
    # explicit settings win over the choice
    out2 = tmp_path / "explicit"
    r = cli("train", "--text", str(corpus), "--out", str(out2), "--tokenizer", "bpe",
            "--set", "model.n_layer=1", *QUICK)  # fmt: skip
    assert r.code == 0, r.err
    assert "tokenizer bpe" in r.out.splitlines()[0]
    cfg = _config(out2)
    assert cfg["train"]["tokenizer"] == "bpe" and cfg["model"]["n_layer"] == 1
    # bpe_vocab_size 0: the vocabulary is sized from the training text
    from attnlm import tokenizers
    from attnlm.data.corpus import split_text
    from attnlm.tokenizers.sizing import vocab_size_for

    train_text, _ = split_text(corpus.read_text(encoding="utf-8"))
    tok = tokenizers.load(out2 / "tokenizer.json")
    want = tokenizers.train_tokenizer("bpe", train_text, vocab_size_for([train_text]))
    assert cfg["train"]["bpe_vocab_size"] == 0 and tok.encode(train_text) == want.encode(train_text)
    assert tokenizers.train_tokenizer("bpe", train_text, 300).vocab_size != tok.vocab_size
    assert "vocab" in r.out and f"vocab {tok.vocab_size:,}" in r.out
    # with a preset nothing is chosen
    r = cli("train", "--preset", "tiny-test", "--text", str(corpus), "--out",
            str(tmp_path / "p"), *QUICK)  # fmt: skip
    assert r.code == 0 and "auto setup" not in r.out
