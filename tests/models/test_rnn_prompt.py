"""A recurrent LM trained on carried streams continues a short prompt read from a zero state
with text like its corpus. Stateful training used to zero a stream's state only once per pass
over the text, so the model never learnt to start from zeros, and after a few thousand steps
``lstm-char`` continued "ROMEO:" with noise (digits and punctuation) while a long prompt
worked. Measured as bits per character under a character 5-gram of the corpus
(:mod:`attnlm.ngram`, an independent model): the continuation must score close to the
corpus's own held-out text."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlm import ngram
from attnlm.loading.objectives import StreamBatches


def test_every_stream_starts_from_zeros_within_reset_every_windows():
    src = StreamBatches(np.arange(100_000) % 50, 8, 1.0, reset_every=4)
    gen = torch.Generator()
    resets = torch.stack([src.draw(16, gen)["reset"] for _ in range(12)])  # (windows, streams)
    assert resets[0].all()  # the streams' beginnings
    for w in range(1, 12):
        assert resets[w].sum() == 16 // 4  # a quarter of the streams in every window
    for w in range(1, 9):
        assert resets[w : w + 4].any(dim=0).all()  # each stream within any 4 windows


def _char_sentences(text: str) -> list[list[str]]:
    return [[c if c != " " else "_" for c in line] for line in text.splitlines() if line.strip()]


def _bits_per_char(model, text: str) -> float:
    sentences = _char_sentences(text)
    lp, _ = model.sentence_logprobs(sentences)  # log10, one per character and line end
    return -float(lp.sum()) * math.log2(10) / len(lp)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::attnlm.ngram.DiscountWarning")
@pytest.mark.usefixtures("one_thread")
def test_lstm_continues_a_short_prompt_like_its_corpus(cli, tmp_path):
    """The README's case on the built-in corpus: 1,000 steps of ``lstm-char`` (about 35 s on
    one thread) were enough for "ROMEO:" to continue as ``q4(4)qq$6&05&66...`` before."""
    from attnlm.data.corpus import load_text, split_text

    run = tmp_path / "lstm"
    r = cli(
        "train", "--preset", "lstm-char", "--max-iters", "1000", "--eval-iters", "2",
        "--eval-interval", "1000", "--no-progress", "--out", run,
    )  # fmt: skip
    assert r.code == 0, r.err
    train, valid = split_text(load_text(None), 0.1)
    grams = ngram.train(_char_sentences(train[:600_000]), order=5)
    own = _bits_per_char(grams, valid[:20_000])
    prompt = "ROMEO:"
    for seed in (1, 2):
        r = cli(
            "generate", "--checkpoint", run, "--prompt", prompt, "--max-new-tokens", "300",
            "--temperature", "0.8", "--top-k", "20", "--seed", seed,
        )  # fmt: skip
        assert r.code == 0, r.err
        assert r.out.startswith(prompt)
        continuation = r.out[len(prompt) :]
        got = _bits_per_char(grams, continuation)
        # noise scores far above 6 bits/char; sampled text at temperature 0.8 near the corpus
        assert got < own + 1.5, f"{got:.2f} vs corpus {own:.2f} bits/char:\n{continuation}"
