"""Fuzz target: a ``.tiktoken`` rank file through
:meth:`attnlm.tokenizers.bpe.tokenizer.BPETokenizer.from_tiktoken` (with cl100k's pattern and
one special token), then encode and decode a line. Policy: fuzz/fuzzkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fuzzkit  # noqa: E402

with fuzzkit.instrumented():
    from attnlm.tokenizers.bpe.tokenizer import BPETokenizer

TEXT = "Hello, world! 123 <|endoftext|> Ünïcödé 日本語 \n\t  end"


def target(data: bytes) -> None:
    path = fuzzkit.scratch("ranks.tiktoken", data)
    tok = BPETokenizer.from_tiktoken(path, "cl100k", {"<|endoftext|>": 1 << 20})
    ids = tok.encode(TEXT, allowed_special="all")
    assert all(isinstance(i, int) and i >= 0 for i in ids)
    assert tok.decode(ids) == TEXT  # every byte is a token: the round trip is exact


if __name__ == "__main__":
    sys.exit(fuzzkit.main(target))
