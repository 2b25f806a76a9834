"""Issue 15: custom pre-tokenizer patterns, absurd ids in tokenizer files, non-UTF-8 input."""

import base64
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlm.base.config import load_preset
from attnlm.base.errors import ConfigError
from attnlm.cli import main
from attnlm.tokenizers import BPETokenizer, CharTokenizer, load
from attnlm.tokenizers.base import MAX_VOCAB_SIZE, TokenizerConfigError, TokenizerFileError
from attnlm.tokenizers.bpe import resolve_pattern, tiktoken_available
from attnlm.tokenizers.tiktoken_io import read_tiktoken

TRAIN = "Hello, World! It's 2024: naïve café, 日本語 text\n\tand more text 123 456.\n" * 5
needs_tiktoken = pytest.mark.skipif(not tiktoken_available(), reason="tiktoken not installed")


# ---------------------------------------------------------------- patterns


@pytest.mark.parametrize("pattern", [r"([a-z]+)", r"(\w+)|(\s+)", r"(?P<w>\w+)|\s"])
def test_capturing_groups_rejected_at_train(pattern):
    with pytest.raises(TokenizerConfigError, match="capturing group"):
        BPETokenizer.train(TRAIN, 260, pattern=pattern)


def test_capturing_groups_rejected_at_load(tmp_path):
    p = tmp_path / "tok.json"
    BPETokenizer.train(TRAIN, 260, pattern=r"\w+|\s+").save(p)
    doc = json.loads(p.read_text())
    doc["pattern"] = r"(\w+)|\s+"
    p.write_text(json.dumps(doc))
    with pytest.raises(TokenizerFileError, match="capturing group") as e:
        load(p)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("pattern", [r"\w*", r"a?", r"(?:x*)|\s+"])
def test_empty_matching_pattern_rejected(pattern):
    with pytest.raises(TokenizerConfigError, match="empty string"):
        resolve_pattern(pattern)


@pytest.mark.parametrize("engine", ["python", pytest.param("tiktoken", marks=needs_tiktoken)])
def test_uncovered_text_is_kept(engine):
    tok = BPETokenizer.train(TRAIN, 300, pattern=r"[a-z]+")  # covers lower-case letters only
    tok.engine = engine
    text = "Hello, World! 123 日本 x\n"
    assert tok.decode(tok.encode(text)) == text


@needs_tiktoken
def test_engines_agree_on_uncovered_text():
    # the pattern covers letters and whitespace only: the punctuation and digits used to be
    # dropped; now each is a chunk of its own in both engines
    tok = BPETokenizer.train(TRAIN, 300, pattern=r" ?(?:\p{L}+)|\s+")
    text = "Hello, World! 123"
    py = BPETokenizer.from_dict(tok.to_dict())
    py.engine = "python"
    tk = BPETokenizer.from_dict(tok.to_dict())
    tk.engine = "tiktoken"
    assert py.encode(text) == tk.encode(text)
    assert py.decode(py.encode(text)) == text


ATOMS = [
    r"[a-z]+",
    r"\p{L}+",
    r" ?\p{L}+",
    r" ?\p{N}+",
    r"\p{N}{1,3}",
    r"\s+",
    r"\s+(?!\S)",
    r"[^\s\p{L}\p{N}]+",
    r"'(?:s|t|re)",
    r"(?i:the)",
    r"[aeiou]",
    r"\d",
    r".",
    r"[A-Z][a-z]*",
    r"[\r\n]+",
]


@st.composite
def patterns(draw):
    atoms = draw(st.lists(st.sampled_from(ATOMS), min_size=1, max_size=4, unique=True))
    return "|".join(atoms)


TEXTS = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),  # lone surrogates cannot round-trip
    max_size=80,
) | st.text(alphabet="aAb 1\n\t.'é日", max_size=80)


@needs_tiktoken
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns(), text=TEXTS)
def test_any_accepted_pattern_round_trips_and_engines_agree(pattern, text):
    """For any accepted pattern and any text: decode(encode(text)) == text, and the Python and
    tiktoken engines give the same ids."""
    tok = BPETokenizer.train(TRAIN, 280, pattern=pattern)
    py = BPETokenizer.from_dict(tok.to_dict())
    py.engine = "python"
    tk = BPETokenizer.from_dict(tok.to_dict())
    tk.engine = "tiktoken"
    ids = py.encode(text)
    assert py.decode(ids) == text
    assert tk.encode(text) == ids


# ---------------------------------------------------------------- absurd ids


def _bpe_doc():
    doc = json.loads(json.dumps({"format": "attnlm-tokenizer", "version": 1, "kind": "bpe"}))
    doc.update(BPETokenizer.train(TRAIN, 260).to_dict())
    return doc


@pytest.mark.parametrize("where", ["rank", "special"])
def test_absurd_ids_rejected_on_load(tmp_path, where):
    doc = _bpe_doc()
    if where == "rank":
        ranks = {t: i for i, t in enumerate(doc["ranks"])}
        ranks[doc["ranks"][-1]] = 10**12
        doc["ranks"] = ranks
        doc["merges"] = None
    else:
        doc["special_tokens"] = {"<|endoftext|>": 10**12}
    p = tmp_path / "tok.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TokenizerFileError, match=str(MAX_VOCAB_SIZE - 1) + "|below") as e:
        load(p)
    assert "\n" not in str(e.value)
    assert main(["tokenize", "info", "--tokenizer", str(p)]) == 2


def test_absurd_tiktoken_rank_rejected_with_line(tmp_path):
    lines = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256)]
    lines.append(base64.b64encode(b"ab") + b" 1000000000000")
    p = tmp_path / "r.tiktoken"
    p.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokenizerFileError, match=r":257: rank 1000000000000 out of range"):
        read_tiktoken(p)


# ---------------------------------------------------------------- non-UTF-8 input


def _stdin(monkeypatch, data: bytes):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.mark.parametrize("action", ["encode", "decode"])
def test_non_utf8_stdin_is_one_line_error(tmp_path, monkeypatch, capsys, action):
    p = tmp_path / "c.json"
    CharTokenizer.train("caf\ufffd 012").save(p)  # U+FFFD is in the vocabulary
    _stdin(monkeypatch, b"caf\xe9 0 1\n")
    assert main(["tokenize", action, "--tokenizer", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid UTF-8" in err and "0xe9" in err


def test_utf8_stdin_still_works(tmp_path, monkeypatch, capsys):
    p = tmp_path / "c.json"
    CharTokenizer.train("café").save(p)
    _stdin(monkeypatch, "café".encode())
    assert main(["tokenize", "encode", "--tokenizer", str(p)]) == 0
    ids = capsys.readouterr().out.split()
    assert CharTokenizer.train("café").decode([int(i) for i in ids]) == "café"


def test_non_utf8_preset_is_config_error(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_bytes(b'[train]\ntext = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not valid UTF-8") as e:
        load_preset(p)
    assert "\n" not in str(e.value)
