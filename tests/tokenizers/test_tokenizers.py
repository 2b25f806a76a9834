"""Tokenizers: textbook BPE, round trips, save/load, engines, errors and the CLI.

Reference-parity checks against tiktoken and Hugging Face tokenizers live in
``test_tokenizers_parity.py``.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlm.base.errors import ConfigError, InputError
from attnlm.cli import main
from attnlm.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    ClassicBPETokenizer,
    DisallowedSpecialTokenError,
    InvalidTokenIdError,
    TokenizerConfigError,
    TokenizerFileError,
    UnknownTokenError,
    WordTokenizer,
    load,
    split_words,
)
from attnlm.tokenizers.bpe import (
    GPT2_BYTE_ORDER,
    GPT2_PUBLISHED,
    PATTERNS,
    _merge_long,
    _merge_short,
    count_chunks,
    tiktoken_available,
)
from attnlm.tokenizers.classic_bpe import classic_merges
from attnlm.tokenizers.training import learn_merges

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n"
    "All:\nResolved. resolved.\n\nFirst Citizen:\nFirst, you know Caius Marcius is chief enemy "
    "to the people.\n  def f(x):\n      return x ** 2  # 12345 + 678.9\n"
    "Café naïve résumé, 日本語のテキスト, emoji 😀👍🏽 and tabs\tand   runs    of spaces.\n"
) * 3

needs_tiktoken = pytest.mark.skipif(not tiktoken_available(), reason="tiktoken not installed")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(TEXT, 400, special_tokens={"<|endoftext|>": 400})


# ---------------------------------------------------------------- classic BPE (textbook)


def test_textbook_classic_bpe_merges() -> None:
    table = {"l o w </w>": 5, "l o w e r </w>": 2, "n e w e s t </w>": 6, "w i d e s t </w>": 3}
    merges = classic_merges(table, 3)
    assert merges[:2] == [(("e", "s"), 9), (("es", "t"), 9)]
    assert merges[2] == (("est", "</w>"), 9)


def test_classic_bpe_trains_textbook_from_text() -> None:
    text = " ".join(["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3)
    tok = ClassicBPETokenizer.train(text, 1 + 11 + 4)
    assert tok.merges == [("e", "s"), ("es", "t"), ("est", "</w>"), ("l", "o")]
    ids = tok.encode("newest lowest")
    assert [tok.token_text(i) for i in ids] == ["n", "e", "w", "est</w>", "lo", "w", "est</w>"]
    assert tok.decode(ids) == "newest lowest"


def test_classic_bpe_roundtrip_and_unknown() -> None:
    tok = ClassicBPETokenizer.train(TEXT, 200)
    assert tok.vocab_size == 200
    line = "First Citizen:\nSpeak, speak.\n"
    assert tok.decode(tok.encode(line)) == line
    ids = tok.encode("ZQXa")  # Z, Q, X never seen: <unk>
    assert ids.count(0) == 3
    assert tok.decode(tok.encode("a  b\tc")) == "a b c"  # other whitespace is normalised


# ---------------------------------------------------------------- incremental trainer


def naive_merges(words: list[list[int]], counts: list[int], n_base: int, vocab: int):
    """Textbook BPE: recount every pair after every merge; ties to the smallest id pair."""
    symbols = [(i,) for i in range(n_base)]
    index = {s: i for i, s in enumerate(symbols)}
    words = [list(w) for w in words]
    merges = []
    while len(index) < vocab:
        pairs: dict[tuple[int, int], int] = {}
        for w, n in zip(words, counts):
            for p in zip(w, w[1:]):
                pairs[p] = pairs.get(p, 0) + n
        if not pairs:
            break
        (a, b), c = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        content = symbols[a] + symbols[b]
        new = index.setdefault(content, len(symbols))
        if new == len(symbols):
            symbols.append(content)
        merges.append((a, b, new, c))
        for k, w in enumerate(words):
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[k] = out
    return merges


@SETTINGS
@given(
    st.lists(st.text(alphabet="abc", min_size=1, max_size=12), min_size=1, max_size=30),
    st.integers(4, 40),
)
def test_incremental_trainer_equals_recounting(words: list[str], extra: int) -> None:
    table: dict[str, int] = {}
    for w in words:
        table[w] = table.get(w, 0) + 1
    ids = [[ord(c) - ord("a") for c in w] for w in table]
    counts = list(table.values())
    expected = naive_merges(ids, counts, 3, 3 + extra)
    got = learn_merges([list(w) for w in ids], counts, [(0,), (1,), (2,)], 3 + extra)
    assert got == expected


# ---------------------------------------------------------------- byte-level BPE


def test_bpe_train_basics(bpe: BPETokenizer) -> None:
    assert bpe.vocab_size == 401
    assert len(bpe.merges) == 400 - 256
    assert bpe.special_tokens == {"<|endoftext|>": 400}
    # single bytes in GPT-2 order: '!' is 0, the space (0x20) comes after the printable bytes
    assert bpe.encode("!") == [0]
    assert bpe.encode_ordinary(" ")[0] == GPT2_BYTE_ORDER.index(0x20)
    first = bpe.merges[0]
    assert isinstance(first, tuple) and all(isinstance(x, bytes) for x in first)
    ids = bpe.encode(TEXT)
    assert len(ids) < len(TEXT.encode()) / 2
    assert bpe.decode(ids) == TEXT


@SETTINGS
@given(st.text())
def test_bpe_roundtrip_any_unicode(bpe: BPETokenizer, text: str) -> None:
    bpe.engine = "python"
    assert bpe.decode(bpe.encode_ordinary(text)) == text


@SETTINGS
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_bpe_roundtrip_cl100k_pattern(text: str) -> None:
    tok = _cl100k_trained()
    tok.engine = "python"
    assert tok.decode(tok.encode_ordinary(text)) == text


_CACHE: dict[str, BPETokenizer] = {}


def _cl100k_trained() -> BPETokenizer:
    if "cl100k" not in _CACHE:
        _CACHE["cl100k"] = BPETokenizer.train(TEXT, 330, pattern="cl100k")
    return _CACHE["cl100k"]


def test_lone_surrogates_are_replaced_like_tiktoken(bpe: BPETokenizer) -> None:
    bpe.engine = "python"
    assert bpe.decode(bpe.encode("a\ud800b")) == "a\ufffdb"
    assert bpe.decode(bpe.encode("x\ud83d\ude00")) == "x😀"  # a surrogate pair is one char


def test_bpe_special_tokens(bpe: BPETokenizer) -> None:
    for engine in ("python", "tiktoken") if tiktoken_available() else ("python",):
        bpe.engine = engine
        text = "Speak<|endoftext|>hear"
        with pytest.raises(DisallowedSpecialTokenError, match="position 5"):
            bpe.encode(text)
        ids = bpe.encode(text, allowed_special={"<|endoftext|>"})
        assert ids.count(400) == 1 and bpe.decode(ids) == text
        assert bpe.encode(text, allowed_special="all") == ids
        ordinary = bpe.encode(text, disallowed_special=())
        assert 400 not in ordinary and ordinary == bpe.encode_ordinary(text)
        assert bpe.decode(ordinary) == text
    with pytest.raises(TokenizerConfigError, match="not a special token"):
        bpe.encode("x", allowed_special={"<|nope|>"})


def test_special_token_ids_must_be_above_merges() -> None:
    with pytest.raises(TokenizerConfigError, match="belong to the merges"):
        BPETokenizer.train(TEXT, 300, special_tokens={"<|endoftext|>": 10})
    tok = BPETokenizer.train(TEXT, 300, special_tokens=["<|a|>", "<|b|>"])
    assert tok.special_tokens == {"<|a|>": 300, "<|b|>": 301}


def test_special_tokens_are_cut_out_of_training_text() -> None:
    text = "<|endoftext|>" * 50 + "abc abc"
    tok = BPETokenizer.train(text, 270, special_tokens={"<|endoftext|>": 270})
    assert all(b"<|" not in a + b and b"|>" not in a + b for a, b in tok.merges)


def test_decode_partial_utf8_does_not_crash(bpe: BPETokenizer) -> None:
    ids = bpe.encode("😀")
    raw = bpe.decode_bytes(ids)
    assert raw == "😀".encode()
    single = [bpe.encode_ordinary(" ")[0]]
    first_byte = [i for i in range(256) if bpe.token_bytes(i) == raw[:1]]
    assert bpe.decode(first_byte) == "\ufffd"
    assert bpe.decode(single + first_byte) == " \ufffd"


def test_long_chunk_merge_equals_short(bpe: BPETokenizer) -> None:
    ranks = bpe.ranks
    rng = random.Random(0)
    alphabet = "ab eéthr😀\n"
    for n in [2, 3, 10, 65, 200, 1000]:
        for _ in range(5):
            piece = "".join(rng.choice(alphabet) for _ in range(n)).encode()
            assert _merge_long(piece, ranks) == _merge_short(piece, ranks)
    piece = b" " * 3000
    assert _merge_long(piece, ranks) == _merge_short(piece, ranks)


@SETTINGS
@given(
    st.one_of(
        st.text(),
        st.text(alphabet=st.sampled_from(list(" \t\n\r'sStdDllrevm1a.,!é😀\u00a0")), max_size=40),
    )
)
def test_gpt2_pattern_splits_like_published_regex(text: str) -> None:
    import regex

    assert regex.findall(PATTERNS["gpt2"], text) == regex.findall(GPT2_PUBLISHED, text)


@SETTINGS
@given(
    st.one_of(
        st.text(),
        st.text(alphabet=st.sampled_from(list(" \t\n\r'sab1.,é😀\u00a0")), max_size=60),
    )
)
def test_chunk_counting_shortcut_equals_findall(text: str) -> None:
    import regex

    for name in ("gpt2", "cl100k"):
        expected = Counter(regex.findall(PATTERNS[name], text))
        assert count_chunks(text, PATTERNS[name]) == expected
    assert count_chunks(text, GPT2_PUBLISHED) == Counter(regex.findall(GPT2_PUBLISHED, text))


def test_bpe_custom_regex_pattern() -> None:
    tok = BPETokenizer.train(TEXT, 300, pattern=r"\S+|\s+")
    assert tok.pattern == r"\S+|\s+" and tok.pattern_name == ""
    assert tok.decode(tok.encode(TEXT)) == TEXT


@needs_tiktoken
@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", r"\w+|[^\w\s]+|\s+"])
def test_engines_identical_on_trained_tokenizers(pattern: str) -> None:
    tok = BPETokenizer.train(TEXT, 420, pattern=pattern, special_tokens={"<|endoftext|>": 420})
    texts = [TEXT, "", " ", "  x  ", "😀😀😀", "a" * 500, " " * 300 + "\n\n", "<|endoftext|>x"]
    for t in texts:
        tok.engine = "python"
        py = tok.encode(t, allowed_special="all")
        tok.engine = "tiktoken"
        assert tok.encode(t, allowed_special="all") == py
    assert tok.encode_batch(texts[:3]) == [tok.encode(t) for t in texts[:3]]


@needs_tiktoken
@SETTINGS
@given(st.text(max_size=60))
def test_engines_identical_property(bpe: BPETokenizer, text: str) -> None:
    bpe.engine = "python"
    py = bpe.encode_ordinary(text)
    bpe.engine = "tiktoken"
    assert bpe.encode_ordinary(text) == py


def test_bpe_pickles(bpe: BPETokenizer) -> None:
    import pickle

    bpe.engine = "auto"
    bpe.encode("warm up")
    back = pickle.loads(pickle.dumps(bpe))
    assert back.encode(TEXT) == bpe.encode(TEXT) and back.merges == bpe.merges


def test_engine_choice_errors(bpe: BPETokenizer) -> None:
    with pytest.raises(TokenizerConfigError, match="unknown engine"):
        bpe.engine = "rust"
    bpe.engine = "python"
    assert bpe.engine == "python"


def test_bpe_cache_is_bounded() -> None:
    tok = BPETokenizer(BPETokenizer.train(TEXT, 300).ranks, cache_size=50)
    tok.engine = "python"
    out = tok.encode(TEXT)
    assert len(tok._cache) <= 50
    assert tok.decode(out) == TEXT
    assert tok.encode(TEXT) == out
    other = "Zebras, quixotic jumps; 99 bottles. " * 3
    for text in [other, TEXT, other[:20], TEXT]:
        assert tok.decode(tok.encode(text)) == text
        assert len(tok._cache) <= 50


# ---------------------------------------------------------------- char and word


def test_char_tokenizer() -> None:
    tok = CharTokenizer.train("hello world")
    assert tok.chars == sorted(set("hello world"))
    assert tok.vocab_size == 8
    assert tok.decode(tok.encode("hello")) == "hello"
    with pytest.raises(UnknownTokenError, match=r"'z' \(U\+007A\) at position 2"):
        tok.encode("hoz")
    unk = CharTokenizer.train("hello world", unk=True)
    assert unk.vocab_size == 9 and unk.special_tokens == {"<unk>": 8}
    assert unk.encode("hoz") == [tok.encode("h")[0], tok.encode("o")[0], 8]
    assert unk.decode(unk.encode("hoz")) == "ho<unk>"


def test_split_words() -> None:
    assert split_words("Don't stop!  Élan, 42.") == [
        "Don", "'", "t", "stop", "!", "Élan", ",", "42", "."
    ]  # fmt: skip


def test_word_tokenizer() -> None:
    text = "the cat sat on the mat. the dog sat! a rare word."
    tok = WordTokenizer.train(text, min_freq=2)
    assert tok.words[:3] == ["<unk>", "the", "."]
    assert set(tok.words) == {"<unk>", "the", "sat", "."}
    assert tok.decode(tok.encode("the cat sat.")) == "the <unk> sat."
    small = WordTokenizer.train(text, max_size=3)
    assert small.vocab_size == 3
    full = WordTokenizer.train("Don't stop, (he said) now!")
    assert full.decode(full.encode("Don't stop, (he said) now!")) == "Don't stop, (he said) now!"
    with pytest.raises(TokenizerConfigError, match="min_freq"):
        WordTokenizer.train(text, min_freq=0)
    with pytest.raises(TokenizerConfigError, match="too small"):
        WordTokenizer.train(text, max_size=1)


# ---------------------------------------------------------------- save / load


def _all_kinds() -> list:
    return [
        CharTokenizer.train(TEXT),
        CharTokenizer.train(TEXT, unk=True),
        WordTokenizer.train(TEXT, min_freq=2),
        ClassicBPETokenizer.train(TEXT, 150),
        BPETokenizer.train(TEXT, 300, special_tokens={"<|endoftext|>": 300}),
        BPETokenizer.train(TEXT, 300, pattern=r"\S+|\s+"),
    ]


@pytest.mark.parametrize("k", range(6))
def test_save_load_roundtrip(tmp_path, k: int) -> None:
    tok = _all_kinds()[k]
    path = tmp_path / "tok.json"
    tok.save(path)
    back = load(path)
    assert type(back) is type(tok)
    assert back.vocab_size == tok.vocab_size
    assert back.special_tokens == tok.special_tokens
    sample = "First Citizen:\nYou are all resolved, 12345 😀?"
    if isinstance(tok, CharTokenizer) and not tok.unk:
        sample = "First Citizen:\nYou are all resolved"
    assert back.encode(sample) == tok.encode(sample)
    assert back.decode(tok.encode(sample)) == tok.decode(tok.encode(sample))
    if hasattr(tok, "merges"):
        assert back.merges == tok.merges
    assert json.loads(path.read_text())["kind"] == tok.kind


def test_tiktoken_file_roundtrip(tmp_path, bpe: BPETokenizer) -> None:
    path = tmp_path / "ours.tiktoken"
    bpe.save_tiktoken(path)
    line = path.read_text().splitlines()[0]
    assert line == "IQ== 0"  # base64 of b"!" and its rank, as in tiktoken's files
    back = BPETokenizer.from_tiktoken(path, "gpt2", {"<|endoftext|>": 400})
    assert back.ranks == bpe.ranks
    assert back.merges == bpe.merges  # recovered from the ranks
    assert back.encode(TEXT) == bpe.encode(TEXT)


# ---------------------------------------------------------------- errors


def test_bad_settings_raise_clear_errors() -> None:
    with pytest.raises(TokenizerConfigError, match="too small"):
        BPETokenizer.train(TEXT, 100)
    with pytest.raises(TokenizerConfigError, match="unknown pattern name 'gpt5'"):
        BPETokenizer.train(TEXT, 300, pattern="gpt5")
    with pytest.raises(TokenizerConfigError, match="invalid pre-tokenization regex"):
        BPETokenizer.train(TEXT, 300, pattern="(unclosed")
    with pytest.raises(TokenizerConfigError, match="at least"):
        ClassicBPETokenizer.train(TEXT, 5)
    # settings errors are both ConfigError and InputError
    assert issubclass(TokenizerConfigError, ConfigError)
    assert issubclass(TokenizerConfigError, InputError)


def test_bad_ids_and_text_raise(bpe: BPETokenizer) -> None:
    for tok in [bpe, CharTokenizer.train("ab"), WordTokenizer.train("a b"), _all_kinds()[3]]:
        with pytest.raises(InvalidTokenIdError, match="not in the vocabulary"):
            tok.decode([0, 10**6])
        with pytest.raises(InputError, match="expected text as a str, got bytes"):
            tok.encode(b"ab")  # type: ignore[arg-type]
    trainers = [
        lambda: BPETokenizer.train(None, 300),
        lambda: ClassicBPETokenizer.train(None, 300),
        lambda: CharTokenizer.train(None),
        lambda: WordTokenizer.train(None),
    ]
    for train in trainers:
        with pytest.raises(InputError, match="expected text as a str"):
            train()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "invalid JSON"),
        ('{"kind": "bpe"}', "not an attnlm tokenizer file"),
        ('{"format": "attnlm-tokenizer", "version": 1, "kind": "zzz"}', "unknown tokenizer kind"),
        ('{"format": "attnlm-tokenizer", "version": 1, "kind": "bpe"}', "missing field 'ranks'"),
        ('{"format": "attnlm-tokenizer", "version": 9, "kind": "bpe"}', "version 9"),
        ('{"format": "attnlm-tokenizer", "version": 1, "kind": "char", "chars": 5}', "corrupt"),
    ],
)
def test_corrupt_files(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TokenizerFileError, match=message):
        load(path)


def test_missing_file_and_bad_rank_file(tmp_path) -> None:
    with pytest.raises(TokenizerFileError, match="no such tokenizer file"):
        load(tmp_path / "nope.json")
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("IQ== 0\nnot-base64!! x\n")
    with pytest.raises(TokenizerFileError, match=r"bad.tiktoken:2: expected"):
        BPETokenizer.from_tiktoken(bad, "gpt2")
    bad.write_text("IQ== 0\n")
    with pytest.raises(TokenizerFileError, match="single-byte"):
        BPETokenizer.from_tiktoken(bad, "gpt2")


# ---------------------------------------------------------------- CLI


def test_cli_train_encode_show(tmp_path, capsys) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "tok.json"
    args = ["tokenize", "train", "--kind", "bpe", "--vocab-size", "300", "--text", str(text)]
    assert main([*args, "--out", str(out), "--special", "<|endoftext|>"]) == 0
    tok = load(out)
    assert isinstance(tok, BPETokenizer) and tok.special_tokens == {"<|endoftext|>": 300}
    capsys.readouterr()
    assert main(["tokenize", "encode", "--tokenizer", str(out), "Speak, speak."]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    assert ids == tok.encode("Speak, speak.")
    assert main(["tokenize", "decode", "--tokenizer", str(out), *map(str, ids)]) == 0
    assert capsys.readouterr().out == "Speak, speak.\n"
    assert main(["tokenize", "show", "--tokenizer", str(out), "--color", "never", "Speak 😀"]) == 0
    shown = capsys.readouterr().out
    # the emoji's four byte tokens are shown as one piece
    assert shown.startswith("[S][peak][ ][😀]\n") and "bytes per token: 1.67" in shown
    assert main(["tokenize", "show", "--tokenizer", str(out), "--color", "always", "Speak"]) == 0
    assert "\x1b[" in capsys.readouterr().out
    for kind in ("char", "word", "classic-bpe"):
        dest = tmp_path / f"{kind}.json"
        extra = ["--vocab-size", "120"] if kind == "classic-bpe" else []
        argv = ["tokenize", "train", "--kind", kind, "--text", str(text), "--out", str(dest)]
        assert main([*argv, *extra]) == 0
        assert load(dest).kind == kind


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kind", "bpe", "--vocab-size", "10"], "too small"),
        (["--kind", "bpe"], "needs --vocab-size"),
        (["--kind", "bpe", "--vocab-size", "300", "--pattern", "nope"], "unknown pattern"),
        (["--kind", "classic-bpe", "--vocab-size", "3"], "too small"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, argv: list[str], message: str) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    full = ["tokenize", "train", *argv, "--text", str(text), "--out", str(tmp_path / "o.json")]
    assert main(full) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlm: error: ") and message in err and err.count("\n") == 1


def test_cli_encode_errors(tmp_path, capsys) -> None:
    char = tmp_path / "c.json"
    CharTokenizer.train("abc").save(char)
    assert main(["tokenize", "encode", "--tokenizer", str(char), "abz"]) == 2
    assert "'z' (U+007A) at position 2" in capsys.readouterr().err
    assert main(["tokenize", "encode", "--tokenizer", str(tmp_path / "none.json"), "a"]) == 2
    assert "no such tokenizer file" in capsys.readouterr().err
    bpe_path = tmp_path / "b.json"
    BPETokenizer.train(TEXT, 260, special_tokens=["<|endoftext|>"]).save(bpe_path)
    assert main(["tokenize", "encode", "--tokenizer", str(bpe_path), "a<|endoftext|>"]) == 2
    assert "special token '<|endoftext|>'" in capsys.readouterr().err
    argv = ["tokenize", "encode", "--tokenizer", str(bpe_path), "--allow-special"]
    assert main([*argv, "a<|endoftext|>"]) == 0
    assert capsys.readouterr().out.split()[-1] == "260"
