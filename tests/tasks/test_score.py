"""The fast scorer (one prefill per context, continuations from its KV cache, left-padded
batches) equals one full forward per continuation, and tokenization follows
lm-evaluation-harness's rules (``attnlm.tasks.score``)."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.tasks.score import (
    Request,
    check_requests,
    encode_request,
    encoder,
    loglikelihoods,
    loglikelihoods_full,
    takes_cache,
)
from gguf_export_support import tiny_model

CONTEXTS = ["the quick brown", "a small model learns to count: one, two,", "hello", "the lazy "]
CHOICES = [" fox jumps", " dog", " three, 123", "!", " world the quick brown fox"]


def _requests(tok):
    enc = encoder(tok)
    return [encode_request(enc, c, CHOICES, None) for c in CONTEXTS]


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_cached_batches_equal_full_forwards(family, batch_size):
    torch.manual_seed(0)
    model, tok = tiny_model(family)
    requests = _requests(tok)
    assert takes_cache(model)
    fast = loglikelihoods(model, requests, batch_size=batch_size)
    full = loglikelihoods_full(model, requests, batch_size=1)
    greedy_seen = False
    for f_row, r_row in zip(fast, full, strict=True):
        for (f_ll, f_g), (r_ll, r_g) in zip(f_row, r_row, strict=True):
            assert f_ll == pytest.approx(r_ll, abs=1e-4)
            assert f_g == r_g
            greedy_seen |= f_g
    # and one by hand: the sum of log-softmax entries of a plain forward
    ctx, cont = requests[1].context, requests[1].continuations[2]
    with torch.no_grad():
        logp = model(torch.tensor([list(ctx + cont)])).logits[0].log_softmax(-1)
    hand = sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
    assert fast[1][2][0] == pytest.approx(hand, abs=1e-4)


def test_greedy_flag_is_true_for_the_models_own_continuation():
    model, tok = tiny_model("llama")
    ctx = tok.encode("the quick brown")
    seq = list(ctx)
    with torch.no_grad():
        for _ in range(4):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    own = tuple(seq[len(ctx) :])
    other = own[:-1] + ((own[-1] + 1) % tok.vocab_size,)
    (scores,) = loglikelihoods(model, [Request(tuple(ctx), (own, other))])
    assert scores[0][1] is True and scores[1][1] is False


class _Spaces:
    """A word tokenizer with a visible space token, to see where spaces go."""

    vocab = {" ": 0, "a": 1, "b": 2, "ab": 3, "c": 4, "<s>": 5}

    def encode(self, text):
        out, i = [], 0
        while i < len(text):
            if text.startswith("ab", i):
                out.append(3)
                i += 2
            else:
                out.append(self.vocab[text[i]])
                i += 1
        return out


def test_encoding_rules_of_lm_eval():
    tok = _Spaces()
    enc = encoder(tok)
    # the context's trailing spaces move to the continuation
    r = encode_request(enc, "c ", ["a"], None)
    assert r == Request((4,), ((0, 1),))
    # a merge across the boundary: the continuation is what the whole text holds after
    # the context's own tokens ("ca" + "b" -> c, ab)
    r = encode_request(enc, "ca", ["b", "c"], None)
    assert r == Request((4, 1), ((), (4,)))
    with pytest.raises(InputError, match="tokenizes to nothing"):
        check_requests([r], None)
    # an empty context is the prefix token; a continuation starting with it is not doubled
    assert encode_request(enc, "", ["ab"], 5) == Request((5,), ((3,),))
    assert encode_request(enc, "", ["abc"], 3) == Request((3,), ((4,),))
    with pytest.raises(InputError, match="needs a BOS or EOS"):
        encode_request(enc, "", ["a"], None)


def test_long_contexts_keep_their_last_tokens():
    r = Request(tuple(range(10)), ((1, 2, 3),))
    (kept,) = check_requests([r], max_len=8)
    assert kept.context == (4, 5, 6, 7, 8, 9) and len(kept.context) + 3 - 1 == 8
    with pytest.raises(InputError, match="longer than the model's 2 positions"):
        check_requests([Request((1,), ((1, 2, 3, 4),))], max_len=2)


def test_a_model_without_the_cache_protocol_takes_the_full_forward():
    from attnlm.models.registry import build

    model, _, _ = build({"type": "rnn", "vocab_size": 20, "block_size": 32, "n_layer": 1,
                         "n_embd": 8})  # fmt: skip
    model.eval()
    assert not takes_cache(model)
    requests = [Request((1, 2, 3), ((4, 5), (6,))), Request((7,), ((8, 9, 10),))]
    scores = loglikelihoods(model, requests)
    with torch.no_grad():
        logp = model(torch.tensor([[1, 2, 3, 4]])).logits[0].log_softmax(-1)
    assert scores[0][0][0] == pytest.approx(float(logp[2, 4] + logp[3, 5]), abs=1e-5)
    assert len(scores[1]) == 1
