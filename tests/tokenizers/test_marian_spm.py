"""The SentencePiece tokenizers of an OPUS-MT folder (``attnlm.tokenizers.marian_spm``) against
``transformers.MarianTokenizer`` on the same folder: the ids of both sides (the source with
``source.spm``, the target with ``target.spm``, ``</s>`` appended as there), language codes,
special token strings, unknown characters, the empty text, and decoding with
``skip_special_tokens=True``; the run-folder file round trip; damaged folders refused in one
line. The folder is built offline (``tests/opus_mt.py``)."""

from __future__ import annotations

import json
import random
import shutil
import warnings

import pytest

pytest.importorskip("sentencepiece", reason="needs sentencepiece")
transformers = pytest.importorskip("transformers", reason="needs transformers (the reference)")

from tests.opus_mt import CODES, build_opus_folder, tatoeba_pairs  # noqa: E402

from attnlm import tokenizers  # noqa: E402
from attnlm.base.errors import InputError  # noqa: E402
from attnlm.data.pairs import PairTokenizers  # noqa: E402

EDGE = [
    "", " ", "   two  spaces  ", "Zürich 東京 ½ !!", "ｆｕｌｌ　ｗｉｄｔｈ", "e\u0301 \u00e9",
    ">>fra<< Go.", ">>deu<<Stop!", ">>fra<<", ">>xxx<< unknown code", ">> not a code",
    "code >>fra<< inside", "a</s>b", "x <pad> y <unk> z", "</s>", "tab\tand\nnewline",
    "Don't you 'quote' me, okay ?", "\U0001f600 emoji",
]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_opus_folder(tmp_path_factory.mktemp("opus") / "opus", model=False)


def _reference(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses" (unused)
        return transformers.MarianTokenizer.from_pretrained(str(path))


def _texts():
    return [s for pair in tatoeba_pairs() for s in pair] + EDGE


def _check_ids(pairs, ref, texts):
    eos = pairs.target_ids.eos
    for text in texts:
        assert pairs.encode_source(text) == ref(text)["input_ids"], text
        assert pairs.tokens(text, "target") + [eos] == ref(text_target=text)["input_ids"], text


def test_ids_of_both_sides_match_marian_tokenizer(folder):
    tok = tokenizers.load(folder)
    assert type(tok).__name__ == "MarianSPMTokenizer"
    ref = _reference(folder)
    pairs = PairTokenizers.from_tokenizers(tok, bos="<pad>")
    assert (pairs.target_ids.eos, pairs.target_ids.pad) == (ref.eos_token_id, ref.pad_token_id)
    assert tok.vocab_size == len(ref)
    _check_ids(pairs, ref, _texts())
    # the two sides really are cut differently (else the test could not tell them apart)
    assert any(pairs.tokens(t, "source") != pairs.tokens(t, "target") for t in _texts())
    unk = ref.unk_token_id
    assert unk in pairs.encode_source("東京") and pairs.encode_source("") == [ref.eos_token_id]
    code = ref.convert_tokens_to_ids(CODES[0])
    assert pairs.encode_source(f"{CODES[0]} Go.")[0] == code != unk


def test_random_texts_match_marian_tokenizer(folder):
    """Seeded random strings of special tokens, language codes, their fragments, white space
    of several kinds, combining and wide characters."""
    atoms = ["</s>", "<pad>", "<unk>", ">>fra<<", ">>", "<<", " ", "  ", "\t", "\n", "a", "é",
             "e\u0301", "ß", "東", "Go", ".", "!", "'", "ｆ", "\u00a0", "\u200b", "\U0001f600",
             "I", "see", "<", ">", "s>", "</", "\x00"]  # fmt: skip
    rng = random.Random(1)
    texts = ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 10))) for _ in range(500)]
    _check_ids(PairTokenizers.from_tokenizers(tokenizers.load(folder)), _reference(folder), texts)


def test_decoding_matches_marian_tokenizer(folder):
    tok = tokenizers.load(folder)
    ref = _reference(folder)
    rng = random.Random(0)
    seqs = [ref(t)["input_ids"] for t in _texts()] + [
        ref(text_target=t)["input_ids"] for t in _texts()
    ]
    specials = [ref.eos_token_id, ref.pad_token_id, ref.unk_token_id]
    for _ in range(300):  # any ids a model may produce, special ones anywhere
        n = rng.randint(0, 12)
        seqs.append([rng.choice(specials) if rng.random() < 0.15 else rng.randrange(len(ref))
                     for _ in range(n)])  # fmt: skip
    for ids in seqs:
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), ids
    # what attnlm's translation decoding does with a model's output (start token, stop at </s>)
    pairs = PairTokenizers.from_tokenizers(tok, bos="<pad>")
    ids = ref(text_target="Je vais bien.")["input_ids"]
    out = [ref.pad_token_id, *ids, ref.pad_token_id]
    assert pairs.decode_target(out) == ref.decode(out, skip_special_tokens=True)


def test_a_saved_tokenizer_reloads_the_same(folder, tmp_path):
    tok = tokenizers.load(folder)
    path = tmp_path / "tok.json"
    tok.save(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["kind"] == "marian-spm"
    back = tokenizers.load(path)  # without the folder: the models travel in the file
    shutil.rmtree(tmp_path / "gone", ignore_errors=True)
    assert back.special_tokens == tok.special_tokens and back.vocab_size == tok.vocab_size
    for text in _texts()[::7]:
        for side in ("source", "target"):
            assert back.encode_side(text, side) == tok.encode_side(text, side)
        ids = tok.encode(text)
        assert back.decode(ids) == tok.decode(ids)


def test_added_tokens_and_clean_up_from_tokenizer_config(folder, tmp_path):
    """``added_tokens_decoder`` (an lstrip/rstrip token, a non-special added token),
    ``additional_special_tokens`` and ``clean_up_tokenization_spaces`` as transformers reads
    them."""
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    vocab = json.loads((other / "vocab.json").read_text(encoding="utf-8"))
    vocab["<sep>"], vocab["<extra>"] = len(vocab), len(vocab) + 1
    (other / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")

    def entry(content, special, lstrip=False, rstrip=False):
        return {"content": content, "lstrip": lstrip, "rstrip": rstrip, "normalized": False,
                "single_word": False, "special": special}  # fmt: skip

    config = json.loads((other / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {
        "0": entry("</s>", True), "1": entry("<unk>", True),
        str(vocab["<pad>"]): entry("<pad>", True),
        str(vocab["<sep>"]): entry("<sep>", True, lstrip=True, rstrip=True),
        str(vocab[">>fra<<"]): entry(">>fra<<", False),
    }  # fmt: skip
    config["additional_special_tokens"] = ["<extra>"]
    config["clean_up_tokenization_spaces"] = True
    (other / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = tokenizers.load(other)
    ref = _reference(other)
    pairs = PairTokenizers.from_tokenizers(tok, bos="<pad>")
    texts = _texts()[::5] + ["a <sep> b", "a<sep>b", " <sep>  x", "x >>fra<< y", "<extra>z ."]
    _check_ids(pairs, ref, texts)
    for text in texts:
        ids = ref(text)["input_ids"]
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), text


def _damage(folder, tmp_path, change):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    change(bad)
    return bad


@pytest.mark.parametrize(
    "change,named",
    [
        (lambda d: (d / "source.spm").write_bytes((d / "source.spm").read_bytes()[:200]),
         "source.spm"),
        (lambda d: (d / "target.spm").write_bytes(b"not a model"), "target.spm"),
        (lambda d: (d / "target.spm").unlink(), "target.spm"),
        (lambda d: (d / "vocab.json").write_text('{"a": 1}'), "vocab.json"),
        (lambda d: (d / "vocab.json").write_text('{"</s>": 0, "<unk>": "1"'), "vocab.json"),
        (lambda d: (d / "tokenizer_config.json").write_text('{"separate_vocabs": true}'),
         "tokenizer_config.json"),
    ],
    ids=["cut source", "junk target", "no target", "no specials", "bad json", "separate"],
)  # fmt: skip
def test_a_damaged_folder_is_refused_in_one_line(folder, tmp_path, change, named):
    bad = _damage(folder, tmp_path, change)
    with pytest.raises(InputError) as e:
        tokenizers.load(bad)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and named in message, message
