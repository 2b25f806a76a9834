"""A plain prompt is encoded with the special tokens its tokenizer adds (BOS where the files ask:
Gemma's GGUF does, as llama.cpp's and transformers' encoders add it); a rendered chat template
that writes the BOS itself gets no second one; a tokenizer without the option is unchanged."""

from __future__ import annotations

import torch

from attnlm.generate.sampling import SamplingConfig
from attnlm.generate.text import encode_prompt, generate_text
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.tokenizers.base import special_encoder
from attnlm.tokenizers.char import CharTokenizer

BOS = 0


class BosTokenizer:
    """Characters a..z as ids 1..26, BOS 0 first when special tokens are asked for, and the text
    '<bos>' written out as the BOS id (as a GGUF tokenizer parses a control token)."""

    bos_id = BOS
    vocab_size = 27

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls.append(add_special_tokens)
        ids = [BOS] if add_special_tokens else []
        if text.startswith("<bos>"):
            ids, text = ids + [BOS], text[len("<bos>") :]
        return ids + [ord(c) - 96 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i + 96) for i in ids if i != BOS)


def test_plain_prompts_get_the_bos_the_tokenizer_adds():
    tok = BosTokenizer()
    assert encode_prompt(tok, "abc", specials=True) == [BOS, 1, 2, 3]
    assert encode_prompt(tok, "abc") == [1, 2, 3]  # a rendered template: as written
    # a template that writes the BOS itself keeps exactly one
    assert special_encoder(tok)("<bos>ab") == [BOS, 1, 2]


def test_a_tokenizer_without_the_option_encodes_as_before():
    tok = CharTokenizer.train("abc ")
    assert encode_prompt(tok, "abc", specials=True) == tok.encode("abc")


def test_generate_text_encodes_with_specials():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=27, block_size=16, n_layer=1, n_head=1, n_embd=8)).eval()
    tok = BosTokenizer()
    generate_text(model, tok, ["ab"], SamplingConfig(temperature=0.0, max_new_tokens=2))
    assert tok.calls and all(tok.calls)
