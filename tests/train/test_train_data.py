"""Run data preparation (issue 15): the token cache is keyed on the corpus's content and the
tokenizer settings, and the corpus is encoded in chunks that give exactly the whole-text ids."""

from __future__ import annotations

import os

import numpy as np
import pytest

from attnlm.base.errors import InputError
from attnlm.cli import main
from attnlm.data.corpus import split_text
from attnlm.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    chunk_safe,
    encode_text,
    iter_encode,
    load,
    train_tokenizer,
)
from attnlm.train.config import TrainConfig
from attnlm.train.data import prepare

OLD = "the cat sat on the mat\nthe dog sat on the log\n" * 20
NEW = "a bird flew over a tree\nan owl slept in a barn\n" * 20  # other letters, other size


def _ids(path) -> list[int]:
    from attnlm.data.windows import read_token_file

    return np.asarray(read_token_file(path).open()).tolist()


def _expected(text: str) -> tuple[list[int], list[int], CharTokenizer]:
    tok = CharTokenizer.train(text)
    train, val = split_text(text, 0.1)
    return tok.encode(train), tok.encode(val), tok


def test_changed_corpus_is_tokenized_again(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    cfg = TrainConfig(text=str(corpus), tokenizer="char", val_fraction=0.1)
    run = tmp_path / "run"
    prepare(run, cfg)
    corpus.write_text(NEW, encoding="utf-8")
    data = prepare(run, cfg)
    train, val, tok = _expected(NEW)
    assert data.tokenizer.to_dict() == tok.to_dict()
    assert _ids(run / "train.bin") == train and _ids(run / "val.bin") == val
    assert load(run / "tokenizer.json").to_dict() == tok.to_dict()


def test_same_size_and_mtime_but_other_content_is_seen(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    st = corpus.stat()
    cfg = TrainConfig(text=str(corpus), tokenizer="char")
    run = tmp_path / "run"
    prepare(run, cfg)
    swapped = OLD.replace("cat", "cow")  # same length
    corpus.write_text(swapped, encoding="utf-8")
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert corpus.stat().st_size == st.st_size
    prepare(run, cfg)
    assert _ids(run / "train.bin") == _expected(swapped)[0]


def test_unchanged_corpus_is_reused(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    cfg = TrainConfig(text=str(corpus), tokenizer="char")
    first = prepare(tmp_path / "run", cfg)
    again = prepare(tmp_path / "run", cfg)
    assert first.seconds > 0 and again.seconds == 0  # reused, not encoded again


def test_changed_tokenizer_file_is_used(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    tok_file = tmp_path / "tok.json"
    BPETokenizer.train(OLD, 260).save(tok_file)
    cfg = TrainConfig(text=str(corpus), tokenizer=str(tok_file))
    run = tmp_path / "run"
    prepare(run, cfg)
    other = BPETokenizer.train(OLD, 290)
    other.save(tok_file)
    data = prepare(run, cfg)
    assert data.tokenizer.vocab_size == other.vocab_size
    assert _ids(run / "train.bin") == other.encode(split_text(OLD, 0.1)[0])


def test_bpe_vocab_size_change_retrains(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    run = tmp_path / "run"
    prepare(run, TrainConfig(text=str(corpus), tokenizer="bpe", bpe_vocab_size=262))
    data = prepare(run, TrainConfig(text=str(corpus), tokenizer="bpe", bpe_vocab_size=268))
    assert data.tokenizer.vocab_size == 268


def test_resume_refuses_a_changed_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    cfg = TrainConfig(text=str(corpus), tokenizer="char")
    run = tmp_path / "run"
    prepare(run, cfg)
    os.utime(corpus, ns=(1, 1))  # touched only: the content is the same, resuming is fine
    prepare(run, cfg, resume=True)
    corpus.write_text(NEW, encoding="utf-8")
    with pytest.raises(InputError, match="changed since the run started"):
        prepare(run, cfg, resume=True)


def test_train_overwrite_uses_the_new_corpus(tmp_path):
    """End to end: `attnlm train --overwrite` in the same folder after the file changed."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(OLD, encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--preset", "tiny-test", "--text", str(corpus), "--out", str(out)]
    argv += ["--max-iters", "1", "--eval-iters", "1", "--no-progress", "--threads", "1"]
    assert main(argv) == 0
    corpus.write_text(NEW, encoding="utf-8")
    assert main([*argv, "--overwrite"]) == 0
    assert _ids(out / "train.bin") == _expected(NEW)[0]
    assert load(out / "checkpoint" / "tokenizer.json").to_dict() == _expected(NEW)[2].to_dict()


# ---------------------------------------------------------------- chunked encoding

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "  indented line\twith tab\n\u00e9t\u00e9 na\u00efve caf\u00e9 \u2014 \u4e2d\u6587 \U0001f600\n"
    "ALL:\nSpeak, speak. 123 4567 it's we'll\n\n\n-- dashes --\n.\n"
) * 40


@pytest.mark.parametrize(
    "kind,size,pattern",
    [
        ("char", None, None),
        ("word", None, None),
        ("classic-bpe", 300, None),
        ("wordpiece", 300, None),
        ("bpe", 400, None),
        ("bpe", 400, "cl100k"),
    ],
)
def test_chunked_encoding_equals_whole_text(kind, size, pattern):
    tok = train_tokenizer(kind, TEXT, size, pattern=pattern)
    assert chunk_safe(tok)
    whole = encode_text(tok, TEXT, "text")
    for chunk in (1, 7, 50, 1000):
        pieces = list(iter_encode(tok, TEXT, "text", chunk_chars=chunk))
        assert len(pieces) > 1
        assert [i for p in pieces for i in p] == whole
    start = TEXT.index("ALL:")
    part = [i for p in iter_encode(tok, TEXT, "t", start, len(TEXT) - 5, chunk_chars=9) for i in p]
    assert part == encode_text(tok, TEXT[start : len(TEXT) - 5], "t")


def test_pattern_across_line_breaks_is_encoded_whole():
    tok = BPETokenizer.train(TEXT, 300, pattern=r"\n?[^\n]|\n")  # "\nX" is one piece
    assert not chunk_safe(tok)
    pieces = list(iter_encode(tok, TEXT, "text", chunk_chars=10))
    assert len(pieces) == 1 and pieces[0] == tok.encode(TEXT)


def test_prepare_in_chunks_matches_whole_encoding(tmp_path, monkeypatch):
    monkeypatch.setattr("attnlm.tokenizers.factory.ENCODE_CHUNK_CHARS", 100)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    data = prepare(tmp_path / "run", TrainConfig(text=str(corpus), tokenizer="bpe"))
    train, val = split_text(TEXT, 0.1)
    assert _ids(tmp_path / "run" / "train.bin") == data.tokenizer.encode(train)
    assert _ids(tmp_path / "run" / "val.bin") == data.tokenizer.encode(val)
    assert data.train.n_chars == len(train) and data.val.n_chars == len(val)
