"""Every llama.cpp pre-tokenizer attnlm knows compiles, and the source holds none of its
characters in a form that Unicode normalization rewrites: deepseek-llm's letter class names
six characters (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) whose NFC forms are other
characters; saved by an editor that normalizes, the range U+1F78..U+1F7D became U+1F78..U+03CE,
a reversed range that did not compile (every deepseek-llm GGUF failed to load)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
import regex

from attnlm.tokenizers import gguf
from attnlm.tokenizers.gguf import PRE_TOKENIZERS


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_compiles(name):
    for pattern in PRE_TOKENIZERS[name]:
        regex.compile(pattern)


def test_deepseek_llm_keeps_its_unnormalized_letters():
    letters = PRE_TOKENIZERS["deepseek-llm"][1]
    for ch in "\u1f7d\u1fbe\u1fd3\u1fdb\u2126\u212a":
        assert ch in letters
    # split as llama.cpp does: a Greek word with an ohm sign stays one piece
    assert regex.findall(letters, "a \u1f7d\u2126 b") == ["a", " \u1f7d\u2126", " b"]


def test_the_source_survives_normalization():
    text = Path(gguf.__file__).read_text(encoding="utf-8")
    changed = {c for c in set(text) if unicodedata.normalize("NFC", c) != c}
    assert not changed, sorted(f"U+{ord(c):04X}" for c in changed)
