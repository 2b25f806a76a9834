"""SentencePiece-style BPE ``tokenizer.json`` files (``byte_fallback``, ``▁`` for spaces) read by
:class:`attnlm.tokenizers.hf_spm.HFSpmBPETokenizer`, checked against the ``tokenizers`` library
(``Tokenizer.from_file``): ids with and without special tokens, decoded text with and without
special tokens, on varied text.

Files: what ``attnlm export`` writes for the GGUF fixtures' SentencePiece vocabularies (Gemma 3,
Llama, Phi-3: a ``Prepend`` + ``Replace`` normalizer), small BPE vocabularies trained here with
the ``tokenizers`` library behind a ``Metaspace`` pre-tokenizer (every ``prepend_scheme``,
``split`` on and off), and (slow) the real Gemma 3 270M vocabulary exported."""

from __future__ import annotations

import json

import pytest

from attnlm.base.errors import InputError
from attnlm.tokenizers import load
from attnlm.tokenizers.gguf import GGUFTokenizer
from attnlm.tokenizers.hf_export import hf_tokenizer
from attnlm.tokenizers.hf_spm import HFSpmBPETokenizer
from support import FIXTURES

tokenizers = pytest.importorskip("tokenizers")

TEXTS = [
    "Hello world, hello there!",
    "  leading spaces and trailing   ",
    "a  b   c    d\t\ttabs",
    "line one\nline two\r\n\n\n  indented\n",
    "digits 12345 3.14159 2024-01-31",
    "日本語のテキスト 中文 한국어",
    "emoji 😀👍🏽 🎉ok",
    "café naïve Ångström Ελληνικά Привет",
    "<bos>hi<eos> there",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<s>inside</s> text <unk> x",
    "a\u2581b ▁▁ c",
    "ẞ ǅ ﬁ ½ ＡＢＣ \u200b\u00ad\ufeff",
    " ",
    "",
]


def _check(path, texts=TEXTS):
    """attnlm's reader of ``path`` against ``tokenizers``'."""
    ref = tokenizers.Tokenizer.from_file(str(path))
    tok = load(path)
    assert isinstance(tok, HFSpmBPETokenizer)
    for text in texts:
        for special in (False, True):
            want = ref.encode(text, add_special_tokens=special).ids
            assert tok.encode(text, add_special_tokens=special) == want, (text, special)
        ids = ref.encode(text, add_special_tokens=True).ids
        for skip in (False, True):
            want = ref.decode(ids, skip_special_tokens=skip)
            assert tok.decode(ids, skip_special_tokens=skip) == want, (text, skip)
    return tok


@pytest.mark.parametrize("arch", ["gemma3", "llama", "phi3"])
def test_exported_gguf_fixture_vocabularies(tmp_path, arch):
    """The ``tokenizer.json`` attnlm exports from a GGUF SentencePiece vocabulary reads back
    with the GGUF tokenizer's own ids."""
    gguf = GGUFTokenizer.from_gguf(FIXTURES / "gguf_arch" / f"{arch}-Q8_0.gguf")
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(hf_tokenizer(gguf).doc, indent=1), encoding="utf-8")
    tok = _check(path)
    for text in TEXTS[:8]:
        assert tok.encode(text) == gguf.encode(text)


@pytest.mark.parametrize("prefix", [True, False], ids=["llama", "gemma-like"])
def test_exported_spm_vocabulary_with_and_without_prefix(tmp_path, prefix):
    """The larger SentencePiece fixture vocabulary, with the space prefix (Llama) and without
    (Gemma: no ``Prepend``, no ``Strip`` in the decoder)."""
    from attnlm.base.ggufio import GGUFFile

    meta = dict(GGUFFile(FIXTURES / "gguf" / "spm-vocab.gguf").metadata)
    meta["tokenizer.ggml.add_space_prefix"] = prefix
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(hf_tokenizer(GGUFTokenizer(meta)).doc), encoding="utf-8")
    _check(path)


CORPUS = [t * 3 for t in TEXTS] + ["the cat sat on the mat, then the dog sat too. " * 8]


def _trained(tmp_path, scheme: str, split: bool, decoder: str):
    """A small BPE vocabulary trained by ``tokenizers`` behind a ``Metaspace`` pre-tokenizer,
    with the 256 byte tokens, BOS added by a template."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz▁ .,"),
    )
    tok.train_from_iterator(CORPUS[-1:] + ["hello world there"] * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    if decoder == "Metaspace":
        tok.decoder = decoders.Metaspace(prepend_scheme=scheme, split=split)
    else:
        tok.decoder = decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(" ", 1, 0)])  # fmt: skip
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("scheme", ["always", "first", "never"])
@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("decoder", ["Metaspace", "Sequence"])
def test_trained_metaspace_byte_fallback(tmp_path, scheme, split, decoder):
    _check(_trained(tmp_path, scheme, split, decoder))


def test_saved_and_loaded_as_an_attnlm_tokenizer_file(tmp_path):
    path = _trained(tmp_path, "first", False, "Metaspace")
    tok = load(path)
    tok.save(tmp_path / "own.json")
    again = load(tmp_path / "own.json")
    assert isinstance(again, HFSpmBPETokenizer)
    for text in TEXTS:
        assert again.encode(text, add_special_tokens=True) == tok.encode(text, True)
    assert tok.bos_id == tok.encode("x", add_special_tokens=True)[0]


@pytest.mark.parametrize(
    ("where", "spec", "words"),
    [
        ("normalizer", {"type": "Lowercase"}, "normalizer 'Lowercase'"),
        ("pre_tokenizer", {"type": "Whitespace"}, "pre_tokenizer 'Whitespace'"),
        ("decoder", {"type": "WordPiece"}, "decoder 'WordPiece'"),
    ],
)
def test_unsupported_fields_refused_in_one_line(tmp_path, where, spec, words):
    doc = json.loads(_trained(tmp_path, "always", True, "Metaspace").read_text("utf-8"))
    doc[where] = spec
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(InputError, match=words) as e:
        load(path)
    assert "\n" not in str(e.value)


def test_exported_gemma3_folder_loads_whole(tmp_path, capsys):
    """``attnlm export`` of the Gemma 3 fixture, read back by ``resolve(folder)``: the GGUF
    file's ids (the BOS first) and its logits."""
    import torch

    from attnlm.cli import main
    from attnlm.loading.sources import resolve
    from attnlm.tokenizers.base import special_encoder

    gguf = FIXTURES / "gguf_arch" / "gemma3-Q8_0.gguf"
    out = tmp_path / "hf"
    assert main(["export", "--model", str(gguf), "--out", str(out)]) in (0, None)
    capsys.readouterr()
    a, b = resolve(out), resolve(gguf)
    text = "Hello  world,\nthe cat 123 日本 😀"
    ids = special_encoder(a.tokenizer)(text)
    assert ids == special_encoder(b.tokenizer)(text) and ids[0] == b.tokenizer.bos_id
    with torch.no_grad():
        want = b.model.float().eval()(torch.tensor([ids])).logits[0]
        got = a.model.float().eval()(torch.tensor([ids])).logits[0]
    assert float((got - want).abs().max()) <= 1e-3 * float(want.max() - want.min())


@pytest.mark.slow
def test_real_gemma3_vocabulary(tmp_path):
    """Gemma 3 270M's 262,144-token vocabulary, exported from the real GGUF file."""
    from support_real import real_file

    gguf = GGUFTokenizer.from_gguf(real_file("gemma3-270m"))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(hf_tokenizer(gguf).doc, indent=1), encoding="utf-8")
    texts = [*TEXTS, "def f(x):\n    return [i**2 for i in range(x)]  # comment\n",
             "a" * 50 + " " + "ab" * 30]  # fmt: skip
    tok = _check(path, texts)
    for text in texts:
        assert tok.encode(text, add_special_tokens=True) == gguf.encode(text, True)


@pytest.mark.parametrize(
    ("pattern", "behavior"),
    [(" ", "MergedWithPrevious"), ("▁", "MergedWithPrevious"), ("▁", "MergedWithNext"),
     ("▁", "Isolated"), ("▁", "Removed"), ("\n", "Isolated")],
)  # fmt: skip
def test_split_pre_tokenizers(tmp_path, pattern, behavior):
    """A ``Split`` pre-tokenizer after the ``▁`` normalizer (Gemma's files carry one splitting
    on spaces), every behavior, on the exported Gemma 3 fixture vocabulary."""
    gguf = GGUFTokenizer.from_gguf(FIXTURES / "gguf_arch" / "gemma3-Q8_0.gguf")
    doc = hf_tokenizer(gguf).doc
    doc["pre_tokenizer"] = {"type": "Split", "pattern": {"String": pattern},
                            "behavior": behavior, "invert": False}  # fmt: skip
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    _check(path)


def test_bad_regex_refused_in_one_line(tmp_path):
    doc = json.loads(_trained(tmp_path, "always", True, "Metaspace").read_text("utf-8"))
    doc["normalizer"] = {"type": "Replace", "pattern": {"Regex": "(unclosed"}, "content": "x"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(InputError, match="does not compile") as e:
        load(path)
    assert "\n" not in str(e.value)
