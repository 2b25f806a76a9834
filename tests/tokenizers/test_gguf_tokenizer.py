"""Tokenizers from GGUF metadata (attnlm.tokenizers.gguf) against llama.cpp's own tokenizer
(reference ids made once by ``tests/fixtures/gguf/make_llamacpp_tokens.py``), Hugging Face
``tokenizers`` (the same vocabulary as a ``tokenizer.json``) and ``transformers``' tokenizer
read from the same GGUF file."""

from __future__ import annotations

import json

import pytest

from attnlm.base.errors import InputError
from attnlm.tokenizers import GGUFTokenizer, load
from attnlm.tokenizers.gguf import GPT4O, LLAMA3, QWEN2
from gguf_support import Writer, smollm2_file
from support import FIXTURES

FIXTURE = FIXTURES / "gguf" / "llamacpp-tokens.json"
SPM_FILE = FIXTURES / "gguf" / "spm-vocab.gguf"
VARIANTS = [(a, s) for a in (False, True) for s in (False, True)]  # (add_special, parse_special)


def _check_against_llamacpp(tok, name):
    refs = json.loads(FIXTURE.read_text(encoding="utf-8"))["files"][name]
    assert len(refs) >= 25
    for text, ids in refs.items():
        for (add, special), expected in zip(VARIANTS, ids, strict=True):
            got = tok.encode(text, add_special_tokens=add, parse_special=special)
            assert got == expected, (text, add, special)


def test_spm_ids_equal_llamacpp():
    """The SentencePiece-style vocabulary: score-ordered merges, ``▁`` spaces with a prefix,
    byte fallback, BOS by default, control vs user-defined tokens written in the text."""
    tok = load(SPM_FILE)
    assert (tok.model, tok.add_bos, tok.add_space_prefix, tok.bos_id) == ("llama", True, True, 1)
    _check_against_llamacpp(tok, "spm-vocab.gguf")


def test_smollm2_ids_equal_llamacpp():
    tok = load(smollm2_file(fetch=False))
    assert (tok.model, tok.pre, tok.add_bos, tok.bos_id, tok.eos_id) == (
        "gpt2",
        "smollm",
        False,
        1,
        2,
    )
    assert tok.eot_id == 2 and {0, 2} <= tok.eog_ids  # <|im_end|>, <|endoftext|>
    _check_against_llamacpp(tok, "smollm2-135m-instruct")


def test_spm_byte_fallback_and_decode():
    tok = load(SPM_FILE)
    ids = tok.encode("the 日")
    byte_tokens = [tok.tokens[i] for i in ids[-3:]]
    assert byte_tokens == ["<0xE6>", "<0x97>", "<0xA5>"]
    for text in ("the quick brown fox", "日本 and émoji 😀", "  spaced   out  "):
        assert tok.decode(tok.encode(text)) == text
    with_bos = tok.encode("hello", add_special_tokens=True)
    assert with_bos[0] == 1 and with_bos[1:] == tok.encode("hello")
    assert tok.decode(with_bos, skip_special_tokens=True) == "hello"


# -- byte-level BPE against Hugging Face tokenizers -----------------------------------------------

TEXTS = [
    "Hello world, hello there!",
    "I'm you're THEY'RE 12345 3.14 x=1000000",
    "日本語 中文 한국어 😀👍🏽 naïve",
    "def f(x):\n    return x**2\n\n\n  \t end  ",
    "special <|endoftext|> inside<|endoftext|>",
    "   leading and trailing   ",
]


def _hf_pre(pre):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = {"llama-bpe": LLAMA3, "qwen2": QWEN2, "gpt-4o": GPT4O}
    if pre == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split[pre]), behavior="isolated"), byte_level]
    )


def _bpe_pair(tmp_path, pre):
    """A byte-level BPE trained by ``tokenizers`` with the pre-tokenizer llama.cpp's ``pre``
    name stands for, and the same vocabulary written as a GGUF file."""
    from tokenizers import Tokenizer, decoders, models, trainers

    hf = Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    hf.pre_tokenizer = _hf_pre(pre)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=__import__("tokenizers").pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [t * 3 for t in TEXTS] + ["the cat sat on the mat 2024 1999 " * 5]
    hf.train_from_iterator(corpus, trainer)
    doc = json.loads(hf.to_str())
    vocab = doc["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    w = Writer(tmp_path / "b.gguf", "llama")
    w.w.add_tokenizer_model("gpt2")
    w.w.add_tokenizer_pre(pre)
    w.w.add_token_list(tokens)
    w.w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.w.add_token_merges(merges)
    w.w.add_eos_token_id(vocab["<|endoftext|>"])
    w.w.add_add_bos_token(False)
    return hf, w.close()


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "llama-bpe", "qwen2", "gpt-4o"])
def test_bpe_ids_equal_hf_tokenizers(tmp_path, pre):
    pytest.importorskip("tokenizers")
    hf, path = _bpe_pair(tmp_path, pre)
    tok = load(path)
    assert tok.pre == pre
    for text in TEXTS + [t.upper() for t in TEXTS]:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(tok.encode(text)) == text
    eot = tok.ids["<|endoftext|>"]
    assert eot in tok.encode("a<|endoftext|>b")
    assert eot not in tok.encode("a<|endoftext|>b", parse_special=False)  # a control token


def test_saved_tokenizer_file_reloads_identically(tmp_path):
    tok = load(SPM_FILE)
    tok.save(tmp_path / "t.json")
    again = load(tmp_path / "t.json")
    assert isinstance(again, GGUFTokenizer)
    for text in ("the 日本 fox", "<|user|> hi <sep> x"):
        assert again.encode(text, add_special_tokens=True) == tok.encode(text, True)


# -- refusals -------------------------------------------------------------------------------------


def _vocab_file(tmp_path, model="gpt2", pre="gpt-2", tokens=("a", "b", "ab", "<s>"), edit=None):
    w = Writer(tmp_path / "v.gguf", "llama")
    w.w.add_tokenizer_model(model)
    w.w.add_tokenizer_pre(pre)
    w.w.add_token_merges(["a b"])
    w.w.add_token_list(list(tokens))
    if edit:
        edit(w.w)
    return w.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pre": "no-such-pre"}, r"tokenizer\.ggml\.pre 'no-such-pre' is not supported"),
        ({"model": "rwkv"}, r"tokenizer\.ggml\.model 'rwkv' is not supported"),
        ({"tokens": ("a", "b", "ab", "a")}, r"duplicate token 'a'"),
        ({"edit": lambda w: w.add_add_eos_token(True)}, r"add_eos_token is true"),
        ({"edit": lambda w: w.add_token_types([1])}, r"token_type has 1 entries for 4 tokens"),
    ],
)
def test_bad_tokenizer_metadata_is_one_line(tmp_path, kwargs, message):
    path = _vocab_file(tmp_path, **kwargs)
    with pytest.raises(InputError, match=message) as e:
        load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "ok").mkdir()
    assert load(_vocab_file(tmp_path / "ok")).encode("ab") == [2]  # the unedited file loads


def test_file_without_tokenizer(tmp_path):
    w = Writer(tmp_path / "n.gguf", "llama")
    with pytest.raises(InputError, match="has no tokenizer"):
        load(w.close())


# -- the command line -----------------------------------------------------------------------------


def test_cli_tokenize_encode_show_info(cli):
    r = cli("tokenize", "encode", "--tokenizer", str(SPM_FILE), "the quick fox")
    assert r.code == 0
    assert [int(x) for x in r.out.split()] == load(SPM_FILE).encode("the quick fox")
    r = cli("tokenize", "show", "--tokenizer", str(SPM_FILE), "--color", "never", "the 日本")
    assert r.code == 0 and "tokens:" in r.out
    r = cli("tokenize", "info", "--tokenizer", str(SPM_FILE))
    assert r.code == 0 and "gguf" in r.out


def test_cli_bad_gguf_exits_2(cli, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    r = cli("tokenize", "encode", "--tokenizer", str(bad), "x")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1


@pytest.mark.slow
def test_smollm2_ids_equal_transformers_gguf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = smollm2_file(fetch=True)
    tok = load(path)
    hf = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    texts = json.loads(FIXTURE.read_text(encoding="utf-8"))["files"]["smollm2-135m-instruct"]
    for text in texts:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False), text


def test_folder_holding_one_gguf_file_loads_its_tokenizer(tmp_path):
    """A pretrained name's folder (``attnlm tokenize --tokenizer smollm2-135m-instruct``)."""
    (tmp_path / "m.gguf").write_bytes(SPM_FILE.read_bytes())
    assert load(tmp_path).encode("the fox") == load(SPM_FILE).encode("the fox")


def test_gpt4o_ids_equal_llamacpp():
    """GPT-4o's pre-tokenizer (Phi-4 mini's ``tokenizer.ggml.pre``): case-split words with their
    contractions, digits in threes; llama.cpp's ids on every text, Hindi's combining vowel
    signs split from their letters as llama.cpp's rewrite of the regex splits them."""
    tok = load(FIXTURES / "gguf" / "gpt4o-vocab.gguf")
    assert (tok.model, tok.pre, tok.add_bos) == ("gpt2", "gpt-4o", False)
    _check_against_llamacpp(tok, "gpt4o-vocab.gguf")
