"""SentencePiece-style ``tokenizer.json`` vocabularies written to GGUF (``tokenizer.ggml.model =
"llama"``): the scores made from the merges must make llama.cpp's tokenizer split text as the
``tokenizer.json`` does. Reference: llama.cpp's own ids for the fixtures' test text
(``tests/fixtures/gguf_arch/llamacpp.json``, recorded with llama-cpp-python 0.3.36), and the
fixtures' own GGUF tokenizers for more texts.

Each fixture's vocabulary goes GGUF -> ``tokenizer.json`` (``attnlm export``'s writer) ->
GGUF keys (the writer under test) -> attnlm's GGUF tokenizer, which encodes as llama.cpp does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.vocab import metadata
from attnlm.tokenizers.gguf import GGUFTokenizer
from attnlm.tokenizers.hf_export import hf_tokenizer
from attnlm.tokenizers.hf_spm import HFSpmBPETokenizer
from support import run_cli

HERE = Path(__file__).resolve().parents[2] / "fixtures" / "gguf_arch"
DOC = json.loads((HERE / "llamacpp.json").read_text(encoding="utf-8"))
SPM_ARCHS = ("gemma2", "gemma3", "llama", "mistral", "phi3")  # the fixtures' "llama" vocabularies
TEXTS = [
    "The quick brown fox",
    "  two leading spaces and   runs\n\nof newlines\t tabs",
    "naïve café, Ünïcode 12345 ü ß 漢字 🙂",
    "<s>a special in the text</s> and after",
    "",
    " ",
]


def _original(arch: str) -> GGUFTokenizer:
    return GGUFTokenizer.from_gguf(GGUFFile(HERE / f"{arch}-Q8_0.gguf"))


def _through_json(tok: GGUFTokenizer) -> GGUFTokenizer:
    hf = hf_tokenizer(tok)
    spm = HFSpmBPETokenizer(json.loads(json.dumps(hf.doc)))
    return GGUFTokenizer(metadata(spm, tok.vocab_size, eos_id=tok.eos_id))


@pytest.mark.parametrize("arch", SPM_ARCHS)
def test_written_vocabulary_splits_as_llama_cpp(arch):
    original = _original(arch)
    assert original.model == "llama"
    written = _through_json(original)
    assert written.model == "llama"
    assert written.encode(DOC["test_text"]) == DOC["archs"][arch]["Q8_0"]["test_ids"]
    for text in TEXTS:
        assert written.encode(text) == original.encode(text), text
    assert written.add_bos == original.add_bos
    assert written.add_space_prefix == original.add_space_prefix
    assert (written.bos_id, written.eos_id) == (original.bos_id, original.eos_id)
    # the tokenizer.json names one unknown token (the one llama.cpp takes: id 0 here, as the
    # file names none) and keeps the others as special added tokens, as control tokens are
    unk = written.tokens.index(hf_tokenizer(original).doc["model"]["unk_token"])
    assert written.token_types[unk] == 2
    same = [3 if k == 2 else k for k in original.token_types]
    assert [3 if k == 2 else k for k in written.token_types] == same


def test_scores_follow_the_merges():
    """A token's score is minus the rank of the first merge that makes it; a token no merge
    makes (a character, a byte) scores below every merge."""
    spm = HFSpmBPETokenizer(json.loads(json.dumps(hf_tokenizer(_original("gemma3")).doc)))
    meta = metadata(spm, spm.vocab_size)
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    ids = {t: i for i, t in enumerate(tokens)}
    merges = spm.doc["model"]["merges"]
    first: dict[str, int] = {}
    for r, (a, b) in enumerate(merges):
        first.setdefault(a + b, r)
    for text, r in first.items():  # hand-computed: minus the first merge's rank
        assert scores[ids[text]] == -float(r), text
    made = {x + y for x, y in merges}
    plain = [i for i, t in enumerate(tokens) if t not in made]
    assert plain and all(scores[i] < -len(made) for i in plain)


def _doc(**changes):
    doc = json.loads(json.dumps(hf_tokenizer(_original("llama")).doc))
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"normalizer": {"type": "NFKC"}}, "normalizer other than Prepend"),
        ({"normalizer": None, "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
          "prepend_scheme": "never", "split": True}}, "pre_tokenizer 'Metaspace'"),
        ({"normalizer": None, "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
          "prepend_scheme": "first", "split": False}}, "does not before one that starts"),
        ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\d"},
          "behavior": "Isolated", "invert": False}}, "pre_tokenizer 'Split'"),
    ],
)  # fmt: skip
def test_refuses_what_llama_cpp_cannot_follow(changes, message):
    spm = HFSpmBPETokenizer(_doc(**changes))
    with pytest.raises(InputError, match=message):
        metadata(spm, spm.vocab_size)


def test_metaspace_without_split_or_prefix_is_written():
    """Metaspace with no split and no prefix is the same as Replace(' ', '▁')."""
    spm = HFSpmBPETokenizer(_doc(normalizer=None, pre_tokenizer={
        "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never",
        "split": False}))  # fmt: skip
    written = GGUFTokenizer(metadata(spm, spm.vocab_size))
    assert not written.add_space_prefix
    for text in TEXTS:
        assert written.encode(text) == spm.encode(text), text


def test_cli_hugging_face_folder_to_gguf(tmp_path, capsys):
    """``attnlm export`` of a Gemma 3 folder with a SentencePiece-style tokenizer.json to GGUF
    (refused before): the file's tokenizer splits as llama.cpp split the original's."""
    hf, out = tmp_path / "hf", tmp_path / "back.gguf"
    r = run_cli(capsys, "export", "--model", str(HERE / "gemma3-Q8_0.gguf"), "--out", str(hf))
    assert r.code == 0, r.err
    r = run_cli(capsys, "export", "--model", str(hf), "--gguf", str(out))
    assert r.code == 0, r.err
    back = GGUFTokenizer.from_gguf(GGUFFile(out))
    assert back.encode(DOC["test_text"]) == DOC["archs"]["gemma3"]["Q8_0"]["test_ids"]
