"""A tokenizer file too large for one line (Qwen2.5's 151,936 ids and merges made a 5 MB line,
over the text reader's limit, so a fine-tune's ``init_tokenizer.json`` could not be read
back) is written a value per line; a small one stays one line. Both load back the same."""

from __future__ import annotations

from attnlm import tokenizers
from attnlm.tokenizers import base
from attnlm.tokenizers.char import CharTokenizer


def test_large_tokenizer_file_is_written_a_value_per_line(tmp_path, monkeypatch):
    tok = CharTokenizer.train("to be or not to be, that is the question")
    tok.save(tmp_path / "small.json")
    assert (tmp_path / "small.json").read_text().count("\n") == 0
    monkeypatch.setattr(base, "MAX_LINE", 64)  # as if the file were over 2 MB
    tok.save(tmp_path / "large.json")
    text = (tmp_path / "large.json").read_text()
    assert text.count("\n") > 5
    for path in ("small.json", "large.json"):
        back = tokenizers.load(tmp_path / path)
        assert back.encode("not to be") == tok.encode("not to be")
        assert back.vocab_size == tok.vocab_size
