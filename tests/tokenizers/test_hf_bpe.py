"""Byte-level BPE ``tokenizer.json`` files against the ``tokenizers`` library itself: files
built and trained here with ``tokenizers`` (GPT-2 style ``ByteLevel``, Llama-3 style ``Split``
regex with ``ignore_merges`` and a BOS template, SmolLM2 style ``Digits`` + ``ByteLevel``),
loaded by ``attnlm.tokenizers.load``, must give the same ids on varied text (CJK, emoji,
code, whitespace runs, added and special tokens) and decode back."""

from __future__ import annotations

import json

import pytest

from attnlm.tokenizers import HFByteBPETokenizer, TokenizerFileError, load
from attnlm.tokenizers.hf_bpe import BYTE_TO_CHAR
from support import CITIZENS, ROMEO

tk = pytest.importorskip("tokenizers", reason="the tokenizers library is the reference")
from tokenizers import (  # noqa: E402
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)  # Llama 3's pre-tokenizer regex (from its published tokenizer.json)
VARIED = [
    "日本語のテキストと中文字符，한국어도 있어요。",
    "emoji 👍🏽 and a family 👨\u200d👩\u200d👧 🎉🎉",
    "def f(x):\n    return x**2  # square\n\tif a != b: {'k': [1, 2]}\n",
    "a   b\t\t\n\n\n  c     \n \u3000 end   ",
    "I'm sure you're right, THEY'LL see; it's 2024-11-25 at 13:45, 3.14159 and 1234567.",
    "café naïve coöperate e\u0301 Ångström ﬁ ①②",
    "<|endoftext|>first<|endoftext|> second <|begin_of_text|>x",
    "",
    " leading space and trailing ",
    "x" * 300 + " " + "ab" * 200,
]
TRAIN = [CITIZENS, ROMEO, *VARIED[:6]] * 3


def _train(tok: Tokenizer, special: list[str], vocab: int = 700) -> Tokenizer:
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator(TRAIN, trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def gpt2_style() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = _train(tok, [])
    tok.add_special_tokens(["<|endoftext|>"])  # after the merges, as GPT-2's id 50256
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def llama3_style() -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok = _train(tok, [])
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )  # fmt: skip
    return tok


def smollm2_style() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])  # fmt: skip
    tok = _train(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])  # ids 0, 1, 2
    tok.add_tokens([tk.AddedToken("<tool>", normalized=True),
                    tk.AddedToken("[[sep]]", lstrip=True, rstrip=True)])  # fmt: skip
    return tok


STYLES = {"gpt2": gpt2_style, "llama3": llama3_style, "smollm2": smollm2_style}


@pytest.fixture(scope="module", params=list(STYLES))
def pair(request, tmp_path_factory):
    ref = STYLES[request.param]()
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    ref.save(str(path))
    return ref, load(path)


def test_ids_equal_the_tokenizers_library(pair):
    ref, ours = pair
    assert isinstance(ours, HFByteBPETokenizer)
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    texts = [*VARIED, CITIZENS, "<tool>x [[sep]] y <|im_start|>user\nhi<|im_end|>"]
    for text in texts:
        expected = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == expected, text
        assert ours.encode(text, add_special_tokens=True) == ref.encode(text).ids, text
        assert ours.decode(expected) == ref.decode(expected, skip_special_tokens=False)
        assert ours.decode(expected, skip_special_tokens=True) == ref.decode(expected)
    if '"add_prefix_space": true' not in json.dumps(ours.doc["pre_tokenizer"]):
        assert ours.decode(ours.encode(VARIED[0] + VARIED[2])) == VARIED[0] + VARIED[2]


def test_the_bos_template_and_ignore_merges_of_llama3(tmp_path):
    ref = llama3_style()
    doc = json.loads(ref.to_str())
    assert doc["model"]["ignore_merges"] and doc["pre_tokenizer"]["type"] == "Sequence"
    (tmp_path / "tokenizer.json").write_text(ref.to_str(), encoding="utf-8")
    ours = load(tmp_path)  # a folder holding a tokenizer.json
    bos = ours.special_tokens["<|begin_of_text|>"]
    assert ours.encode("hi there", add_special_tokens=True)[0] == bos
    assert ours.encode("hi there") == ref.encode("hi there", add_special_tokens=False).ids


def test_string_merges_and_the_saved_file(tmp_path):
    ref = gpt2_style()
    doc = json.loads(ref.to_str())
    doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]  # the older form
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    old = Tokenizer.from_file(str(path))
    ours = load(path)
    for text in VARIED:
        assert ours.encode(text) == old.encode(text, add_special_tokens=False).ids
    ours.save(tmp_path / "ours.json")  # our tokenizer file keeps the document
    again = load(tmp_path / "ours.json")
    assert isinstance(again, HFByteBPETokenizer)
    assert [again.encode(t) for t in VARIED] == [ours.encode(t) for t in VARIED]
    assert again.token_bytes(ours.encode(" the")[0]).startswith(b" ")


def test_byte_alphabet_is_gpt2s():
    assert BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ"
    assert BYTE_TO_CHAR[ord("a")] == "a" and len(set(BYTE_TO_CHAR.values())) == 256
    assert sorted(BYTE_TO_CHAR.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())


def test_other_model_types_are_refused_in_one_line(tmp_path):
    word_level = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    unigram = Tokenizer(models.Unigram([("a", -1.0), ("b", -2.0)], 0, False))
    for name, tok in [("WordLevel", word_level), ("Unigram", unigram)]:
        path = tmp_path / f"{name}.json"
        tok.save(str(path))
        with pytest.raises(TokenizerFileError, match=f"model type '{name}' is not supported") as e:
            load(path)
        assert "\n" not in str(e.value)
    meta = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2, "\u2581": 3}, [("a", "b")]))
    meta.pre_tokenizer = pre_tokenizers.Metaspace()
    meta.save(str(tmp_path / "meta.json"))  # SentencePiece-style: the hf-spm kind reads it
    assert load(tmp_path / "meta.json").encode("ab a") == meta.encode("ab a").ids
    meta.pre_tokenizer = pre_tokenizers.Whitespace()
    meta.save(str(tmp_path / "ws.json"))
    with pytest.raises(TokenizerFileError, match="pre_tokenizer 'Whitespace' is not supported"):
        load(tmp_path / "ws.json")


def _flat_regex(tokens: list[dict]):
    """The added tokens as one alternation, longest first: the form the grouped one must
    match as (``HFByteBPETokenizer._added_regex`` before the grouping)."""
    import re

    tokens = sorted(tokens, key=lambda t: -len(t["content"]))
    alts = []
    for k, t in enumerate(tokens):
        left, right = (r"\s*" if t.get(side) else "" for side in ("lstrip", "rstrip"))
        alts.append(f"(?P<t{k}>{left}{re.escape(t['content'])}{right})")
    return re.compile("|".join(alts)), [t["id"] for t in tokens]


def test_added_tokens_grouped_by_first_character_cut_as_one_alternation():
    """Gemma 3's 6,414 added tokens in one alternation were tried at every character (10 ms a
    character); grouped by first character behind lookaheads they must cut every text the
    same way: random token sets (shared prefixes, whitespace runs, ``rstrip``, and with an
    ``lstrip`` token the flat form kept) against random texts made of their pieces."""
    import random

    rng = random.Random(5)
    pieces = ["<", ">", "<u", "<unused1", "<unused12>", "\n", "\n\n", " ", "  ", "\t", "[x]",
              "a", "ab", "é", "<eos>", "<bos>"]  # fmt: skip
    for trial in range(300):
        contents = list({rng.choice(pieces) + rng.choice(["", *pieces]) for _ in range(12)})
        tokens = [{"content": c, "id": 1000 + i, "normalized": False,
                   "rstrip": rng.random() < 0.2, "lstrip": trial % 3 == 0 and rng.random() < 0.2}
                  for i, c in enumerate(contents)]  # fmt: skip
        tok = HFByteBPETokenizer.__new__(HFByteBPETokenizer)
        tok._added = {t["content"]: t for t in tokens}
        grouped = tok._added_regex(normalized=False)
        flat = _flat_regex(tokens)
        for _ in range(20):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
            assert list(HFByteBPETokenizer._cut(text, grouped)) == list(
                HFByteBPETokenizer._cut(text, flat)
            ), (contents, text)
