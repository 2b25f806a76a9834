"""A model with more output rows than its tokenizer has ids (an embedding padded to a round
size): decoding never picks an id the tokenizer cannot decode, on the PyTorch loop and on the
engine without PyTorch, greedy and sampled."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlm.generate import SamplingConfig, generate_text
from attnlm.generate.sampling import mask_from, token_limit
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.tokenizers import CharTokenizer
from attnlm.tokenizers.base import InvalidTokenIdError


def padded_model(tok):
    """A GPT with 16 rows past the tokenizer's ids, those rows' logits made the largest."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size + 16, block_size=64, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[tok.vocab_size :] *= 50  # the padded rows would win every pick
    return model


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_padded_rows_are_never_picked(temperature):
    tok = CharTokenizer.train("abcdefgh ")
    model = padded_model(tok)
    assert token_limit(model, tok) == tok.vocab_size
    sampling = SamplingConfig(max_new_tokens=30, temperature=temperature, seed=1)
    texts = generate_text(model, tok, ["ab", "ba"], sampling)
    assert all(len(t) == 30 and set(t) <= set("abcdefgh ") for t in texts)
    # the masking is what makes it work: unmasked, the padded rows win
    from attnlm.generate import decode

    raw = decode(model, [tok.encode("ab")], SamplingConfig(max_new_tokens=5, temperature=0))
    assert max(raw[0]) >= tok.vocab_size
    with pytest.raises(InvalidTokenIdError):
        tok.decode(raw[0])


def test_no_limit_where_the_rows_match():
    tok = CharTokenizer.train("abc")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert token_limit(GPT(cfg), tok) is None


def test_mask_from_takes_tensors_and_arrays():
    t = mask_from(torch.zeros(2, 5), 3)
    a = mask_from(np.zeros((2, 5), np.float32), 3)
    for x in (t.numpy(), a):
        assert np.isneginf(x[:, 3:]).all() and (x[:, :3] == 0).all()
