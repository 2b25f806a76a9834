"""The decoding layout (attnlm.nn.layout): linear weights stored column-major in place give
the same model (values, shapes, tied parameters, logits up to float rounding, decoded
tokens), and everything after it (saving, loading, training) works unchanged."""

from __future__ import annotations

import torch
from torch import nn

from attnlm.generate import SamplingConfig, decode
from attnlm.generate.options import DecodeOptions
from attnlm.loading.checkpoint import load_weights, save_checkpoint
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.nn.layout import decoding_layout
from attnlm.tokenizers.char import CharTokenizer


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    base = dict(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=16)
    return GPT(GPTConfig(**(base | kw))).eval()


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_weights_move_column_major_in_place_with_the_same_values():
    model = _gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [p for p in model.parameters()]
    decoding_layout(model)
    for lin in _linears(model):
        assert lin.weight.t().is_contiguous() and not lin.weight.is_contiguous()
    assert [p for p in model.parameters()] == params  # the same Parameter objects
    assert model.lm_head.weight is model.tok_emb.weight  # still tied
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    strides = [lin.weight.stride() for lin in _linears(model)]
    decoding_layout(model)  # idempotent
    assert [lin.weight.stride() for lin in _linears(model)] == strides


def test_logits_and_decoded_tokens_are_unchanged():
    model = _gpt()
    ids = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    prompts = [[1, 2, 3], [4, 5], [6]]
    g = torch.Generator().manual_seed(3)
    ref_tokens = decode(
        _gpt(),
        prompts,
        SamplingConfig(temperature=0.8, max_new_tokens=20),
        DecodeOptions(lookahead=0),
        generator=g,
    )
    decoding_layout(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-5, atol=1e-5)
    g = torch.Generator().manual_seed(3)
    assert (
        decode(
            model,
            prompts,
            SamplingConfig(temperature=0.8, max_new_tokens=20),
            DecodeOptions(lookahead=0),
            generator=g,
        )
        == ref_tokens
    )


def test_decoding_applies_it_and_leaves_other_dtypes_alone():
    model = _gpt()
    decode(
        model, [[1, 2]], SamplingConfig(temperature=0, max_new_tokens=3), DecodeOptions(lookahead=0)
    )
    assert model.blocks[0].attn.qkv_proj.weight.t().is_contiguous()
    double = _gpt().double()
    decoding_layout(double)
    assert all(lin.weight.is_contiguous() for lin in _linears(double))


def test_save_load_and_training_after_decoding(tmp_path):
    model = _gpt()
    decode(
        model, [[1, 2]], SamplingConfig(temperature=0, max_new_tokens=3), DecodeOptions(lookahead=0)
    )  # moves them under inference_mode
    assert model.lm_head.weight.t().is_contiguous()
    tokenizer = CharTokenizer.train("abc")
    save_checkpoint(tmp_path / "ckpt", model, {"model": {"type": "gpt"}}, tokenizer, {"step": 0})
    fresh = _gpt(n_layer=2)
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    decoding_layout(fresh)  # a model that has decoded loads too
    load_weights(fresh, tmp_path / "ckpt")
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    # a training step on the moved weights equals one on the original layout
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(2))
    losses = []
    for m in (_gpt(), model):
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(3):
            loss = m(ids, targets=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(m(ids, targets=ids).loss.item())
    assert abs(losses[0] - losses[1]) < 1e-5
