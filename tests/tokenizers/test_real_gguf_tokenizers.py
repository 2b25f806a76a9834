"""attnlm's GGUF tokenizer on the real files attnlm fetches by name (Gemma 3's 262,144-token
SentencePiece vocabulary, Qwen2.5-Coder's 151,936-token byte-level BPE with the ``qwen2``
pre-tokenizer) equals llama.cpp's: the ids of every text of
``tests/fixtures/real_models/tokens.json`` with and without BOS and special-token parsing, and
the decoded text with and without special tokens (recorded by
``benchmarks/make_real_model_fixtures.py`` with llama-cpp-python 0.3.36). The files come from
attnlm's cache (skipped when a file is not there; the slow tests fetch them)."""

from __future__ import annotations

import json
import time

import pytest

from support import FIXTURES, attnlm_process
from support_real import real_file

DOC = json.loads((FIXTURES / "real_models" / "tokens.json").read_text("utf-8"))
NAMES = sorted(DOC["files"])


_loaded: dict = {}


def _tokenizer(name: str):
    from attnlm.tokenizers.gguf import GGUFTokenizer

    if name not in _loaded:
        path = real_file(name)
        start = time.perf_counter()
        _loaded[name] = GGUFTokenizer.from_gguf(path), time.perf_counter() - start
    return _loaded[name]


@pytest.mark.parametrize("name", NAMES)
def test_encode_equals_llama_cpp(name) -> None:
    tok, _ = _tokenizer(name)
    for text, want in zip(DOC["texts"], DOC["files"][name]["encode"], strict=True):
        got = [tok.encode(text, add_special_tokens=add, parse_special=special)
               for add in (False, True) for special in (False, True)]  # fmt: skip
        assert got == want, text


@pytest.mark.parametrize("name", NAMES)
def test_decode_equals_llama_cpp(name) -> None:
    tok, _ = _tokenizer(name)
    for text, ids, want in zip(DOC["texts"], DOC["files"][name]["encode"],
                               DOC["files"][name]["decode"], strict=True):  # fmt: skip
        got = [tok.decode_bytes(ids[3], skip_special_tokens=not unparse).decode("utf-8", "replace")
               for unparse in (False, True)]  # fmt: skip
        assert got == want, text


@pytest.mark.parametrize("name", NAMES)
def test_vocabulary_and_special_tokens(name) -> None:
    tok, seconds = _tokenizer(name)
    gemma = name.startswith("gemma")
    assert (tok.model, tok.pre) == (("llama", "default") if gemma else ("gpt2", "qwen2"))
    assert tok.vocab_size == (262_144 if gemma else 151_936)
    assert tok.add_bos is gemma and not tok.add_eos
    names = {"bos": tok.bos_id, "eos": tok.eos_id, "eot": tok.eot_id}
    want = {"bos": 2, "eos": 1, "eot": 106} if gemma else {"bos": 151643, "eos": 151645,
                                                            "eot": 151645}  # fmt: skip
    assert names == want
    assert seconds < 20, f"loading the {tok.vocab_size:,}-token vocabulary took {seconds:.1f} s"


def test_tokenize_command_takes_the_names() -> None:
    """``attnlm tokenize encode --tokenizer NAME`` reads the named file's tokenizer."""
    name = "gemma3-270m"
    real_file(name)
    text = DOC["texts"][8]  # CJK
    r = attnlm_process("tokenize", "encode", "--tokenizer", name, text)
    assert r.returncode == 0, r.stderr
    assert [int(x) for x in r.stdout.split()] == DOC["files"][name]["encode"][text_index(text)][1]


def text_index(text: str) -> int:
    return DOC["texts"].index(text)


def test_user_defined_end_of_generation_name_is_control() -> None:
    """llama.cpp adds its control flag to the names it treats as end of generation, a
    user-defined one too (Gemma 3's ``</s>``): such a token is cut out of text only with
    parse_special (as llama.cpp, recorded for the real Gemma file above)."""
    from attnlm.tokenizers.gguf import GGUFTokenizer

    tokens = ["<unk>", "<bos>", "<eos>", "</s>", "a", "b", "<", "/", "s", ">", "<sep>"]
    tok = GGUFTokenizer({
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(tokens),
        "tokenizer.ggml.token_type": [2, 3, 3, 4, 1, 1, 1, 1, 1, 1, 4],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": False,
    })  # fmt: skip
    assert tok.encode("a</s>b<sep>", parse_special=False) == [4, 6, 7, 8, 9, 5, 10]
    assert tok.encode("a</s>b<sep>", parse_special=True) == [4, 3, 5, 10]
    assert tok.decode_bytes([4, 3, 10], skip_special_tokens=True) == b"a<sep>"
