"""Fuzz target: GPT-2's two-file tokenizer (``vocab.json`` + ``merges.txt``, and an optional
``tokenizer_config.json``) through :func:`attnlm.tokenizers.gpt2.vocab_merges_tokenizer`, then
encode and decode a line. One input holds the files separated by NUL bytes, in that order.
Policy: fuzz/fuzzkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fuzzkit  # noqa: E402

with fuzzkit.instrumented():
    from attnlm.tokenizers.gpt2 import vocab_merges_tokenizer

TEXT = "Hello, world! 123 <|endoftext|> Ünïcödé 日本語 \n\t  end"
NAMES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def target(data: bytes) -> None:
    parts = data.split(b"\0", 2)
    folder = fuzzkit.scratch(NAMES[0], parts[0]).parent
    for name, part in zip(NAMES[1:], parts[1:] + [None] * 2):
        if part is None:
            (folder / name).unlink(missing_ok=True)
        else:
            fuzzkit.scratch(name, part)
    tok = vocab_merges_tokenizer(folder)
    ids = tok.encode(TEXT)
    assert all(isinstance(i, int) and i >= 0 for i in ids)
    tok.decode(ids)


if __name__ == "__main__":
    sys.exit(fuzzkit.main(target))
