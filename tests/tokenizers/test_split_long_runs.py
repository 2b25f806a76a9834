"""Issue 15 (scale): the mixed re/regex pre-tokenizer stays linear on a long ASCII run without
safe breaks followed by a non-ASCII character, and still equals ``regex.findall``."""

import random
import time

import pytest
import regex

from attnlm.tokenizers.bpe import GPT2_PUBLISHED, PATTERNS
from attnlm.tokenizers.split import Splitter

ALL = {**PATTERNS, "gpt2-published": GPT2_PUBLISHED}


def _texts():
    rng = random.Random(15)
    yield "a" * 50_000 + "é"
    yield "a" * 50_000 + "é" + "b" * 3000 + "ü" + " x"
    yield "\n" * 20_000 + "é"  # cl100k: line breaks with no non-space after them
    yield "x" * 10_000 + "\n" + "y" * 40_000 + "ß\n"
    yield "1" * 30_000 + "日本" + "!" * 5000 + "\r\n" * 100 + "é"
    for _ in range(20):  # runs of random lengths around the search windows, random breakers
        parts = []
        for _ in range(rng.randint(1, 6)):
            c = rng.choice("ab1!.")
            parts.append(c * rng.choice([1, 255, 256, 257, 4095, 4097, 9000]))
            parts.append(rng.choice(["", " ", "\n", "é", " é", "\né", "\r\n", "  ", "日"]))
        yield "".join(parts)


@pytest.mark.parametrize("name", sorted(ALL))
def test_long_runs_split_like_regex(name):
    pattern = ALL[name]
    split, full = Splitter(pattern), regex.compile(pattern)
    for text in _texts():
        assert split(text) == full.findall(text), (name, text[:40], len(text))


@pytest.mark.parametrize("name", ["gpt2", "cl100k"])
def test_long_run_before_non_ascii_is_linear(name):
    """1 MB took 4.3 s (gpt2) / 1.1 s (cl100k) with the old fixed-step backward search and
    about 0.05 s with the doubling one; the bound leaves room for a busy machine."""
    split = Splitter(PATTERNS[name])
    text = "a" * 1_000_000 + "é"
    t0 = time.process_time()
    out = split(text)
    elapsed = time.process_time() - t0
    assert out == regex.findall(PATTERNS[name], text)
    assert elapsed < 0.8, f"{elapsed:.2f} s for 1 MB: the backward search is not bounded"
