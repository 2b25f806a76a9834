"""Fuzz target: a GGUF file (llama.cpp's format) through attnlm's one GGUF reader
(:mod:`attnlm.base.ggufio`: header, metadata, tensor table, each tensor's bytes), the tokenizer
built from its metadata (:class:`attnlm.tokenizers.gguf.GGUFTokenizer`: encode and decode a
line) and the chat template it carries (rendered once). Policy: fuzz/fuzzkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fuzzkit  # noqa: E402

with fuzzkit.instrumented():
    from attnlm.base.ggufio import GGUFFile
    from attnlm.tokenizers.gguf import GGUFTokenizer, gguf_chat_setup

TEXT = "Hello, world! 123 <s> Ünïcödé 日本語 \n\t  end"
MESSAGES = [{"role": "user", "content": "Hi"}]


def target(data: bytes) -> None:
    header = GGUFFile(fuzzkit.scratch("model.gguf", data))
    for info in header.tensors.values():
        if info.nbytes is not None and info.nbytes <= 1 << 20:
            assert header.raw(info).size == info.nbytes
    tok = GGUFTokenizer.from_gguf(header)
    ids = tok.encode(TEXT, add_special_tokens=True)
    assert all(0 <= i < len(tok.tokens) for i in ids)
    tok.decode(ids)
    template, _stops = gguf_chat_setup(tok, "fuzz: tokenizer.chat_template")
    if template is not None:
        template.render(MESSAGES, add_generation_prompt=True)


if __name__ == "__main__":
    sys.exit(fuzzkit.main(target))
