"""The fast pre-tokenizer (stdlib ``re`` on ASCII stretches) equals ``regex.findall``."""

import pickle

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlm.tokenizers.bpe import GPT2_PUBLISHED, PATTERNS
from attnlm.tokenizers.split import Splitter

BUILT_IN = [PATTERNS["gpt2"], PATTERNS["cl100k"], GPT2_PUBLISHED]
# pieces that stress the safe breaks: line breaks, whitespace runs, contractions in both cases,
# digits, punctuation, non-ASCII letters, digits and spaces, and U+001C (space to `re`, not to
# `regex`), the long s and the Kelvin sign (case-fold to ASCII letters)
PIECES = ["a", "Zq", "1", "2345", "'", "s", "S", "ll", "VE", "!", ".?", " ", "  ", "\n", "\r",
          "\r\n", "\t", "\x0b", "é", "—", "😀", "中文", "٣", "\x1c", "\xa0", "\u3000", "\u2028",
          "ſ", "K"]  # fmt: skip


@pytest.mark.parametrize("pattern", BUILT_IN, ids=["gpt2", "cl100k", "gpt2-published"])
@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.sampled_from(PIECES), max_size=40))
def test_fast_split_equals_regex(pattern, parts):
    text = "".join(parts)
    assert Splitter(pattern)(text) == regex.findall(pattern, text)


@pytest.mark.parametrize("pattern", BUILT_IN, ids=["gpt2", "cl100k", "gpt2-published"])
@given(text=st.text(max_size=60))
def test_fast_split_equals_regex_any_unicode(pattern, text):
    assert Splitter(pattern)(text) == regex.findall(pattern, text)


def test_long_mixed_text_and_custom_pattern():
    line = "O Romeo, Romeo! wherefore art thou Romeo?\n  Deny thy father — and refuse thy name;\n"
    text = line * 300 + "naïve café 12345 don't\n\n" + line * 300
    for pattern in BUILT_IN:
        assert Splitter(pattern)(text) == regex.findall(pattern, text)
    custom = r"\p{L}+|\s+|."
    assert Splitter(custom)(text) == regex.findall(custom, text)


def test_splitter_pickles():
    s = pickle.loads(pickle.dumps(Splitter(PATTERNS["cl100k"])))
    assert s("it's 2024 — ok\n") == regex.findall(PATTERNS["cl100k"], "it's 2024 — ok\n")
