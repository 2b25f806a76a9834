"""Fuzz target: a ``tokenizer.json`` (Hugging Face's byte-level BPE or WordPiece, or attnlm's
own tokenizer file) through :func:`attnlm.tokenizers.base.load`, then encode and decode a
line. Policy: fuzz/fuzzkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fuzzkit  # noqa: E402

with fuzzkit.instrumented():
    from attnlm.tokenizers import load

TEXT = "Hello, world! 123 [CLS] <|endoftext|> Ünïcödé 日本語 \n\t  end"


def target(data: bytes) -> None:
    tok = load(fuzzkit.scratch("tokenizer.json", data))
    ids = tok.encode(TEXT)
    assert all(isinstance(i, int) and i >= 0 for i in ids)
    tok.decode(ids)


if __name__ == "__main__":
    sys.exit(fuzzkit.main(target))
