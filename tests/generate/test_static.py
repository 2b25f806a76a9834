"""The static decoding state (attnlm.nn.static_cache) and the compiled decode step
(attnlm.runtime.compiled): the same tokens as the growing KV cache, fixed buffers, one graph
for every step."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.generate import SamplingConfig, decode, generate
from attnlm.generate.options import DecodeOptions
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.transformer import Transformer, TransformerConfig
from attnlm.nn.cache import KVCache
from attnlm.nn.static_cache import StaticKVCache
from attnlm.runtime.compiled import CompiledStep

RAGGED = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    base = dict(vocab_size=40, block_size=48, n_layer=2, n_head=2, n_embd=16)
    return GPT(GPTConfig(**(base | kw))).eval()


def _prompts(batch: int) -> list[list[int]]:
    return [RAGGED[r % len(RAGGED)] + [r % 40] * (r // len(RAGGED)) for r in range(batch)]


def _both(model, prompts, sampling, **kw):
    """Tokens with the growing cache and with the static state (a fresh seeded generator each)."""
    out = []
    for static in (False, True):
        g = torch.Generator().manual_seed(7)
        out.append(
            decode(
                model,
                prompts,
                sampling,
                DecodeOptions(lookahead=0, static=static),
                generator=g,
                **kw,
            )
        )
    return out


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_gpt_static_state_gives_the_dynamic_cache_tokens(batch, temperature, positions):
    model = _gpt(positions=positions)
    dynamic, static = _both(
        model, _prompts(batch), SamplingConfig(temperature=temperature, top_k=10, max_new_tokens=30)
    )
    assert static == dynamic
    assert all(len(row) == 30 for row in static)


def test_sliding_window_static_state_equals_dynamic():
    """Past the window (relative positions) the static state slides by trimming in place."""
    model = _gpt(positions="rope", block_size=8)
    dynamic, static = _both(model, _prompts(5), SamplingConfig(temperature=0.0, max_new_tokens=25))
    assert static == dynamic


def test_learned_positions_past_the_window_equal_dynamic():
    model = _gpt(block_size=8)
    dynamic, static = _both(model, _prompts(3), SamplingConfig(temperature=0.0, max_new_tokens=12))
    assert static == dynamic


def test_the_static_state_is_used_and_never_reallocated():
    model = _gpt()
    state = model.new_state(max_len=20)
    assert isinstance(state, StaticKVCache)
    model.step(torch.tensor([[1, 2, 3], [4, 5, 6]]), state)
    buffers = [b.data_ptr() for b in state.k_buf + state.v_buf]
    assert state.k_buf[0].shape == (2, 2, 20, 8) and state.length == 3
    for t in range(5):
        model.step(torch.tensor([[t], [t + 1]]), state)
    assert [b.data_ptr() for b in state.k_buf + state.v_buf] == buffers
    assert state.length == 8 and state.position == 8
    with pytest.raises(InputError, match="holds 20 positions"):
        model.step(torch.ones(2, 13, dtype=torch.long), state)


def _random_kv(g, b=3, h=2, t=4, d=5):
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)


@pytest.mark.parametrize("max_len", [12, None])
def test_static_cache_holds_what_the_dynamic_cache_holds(max_len):
    """append / trim / reorder against KVCache; H_kv (2 here) comes from the keys given, so
    grouped-query attention's fewer key/value heads drop in."""
    g = torch.Generator().manual_seed(0)
    ref, ours = KVCache(2), StaticKVCache(2, max_len)
    idx = torch.tensor([2, 0, 0])

    def check():
        assert ours.length == ref.length
        for a, b in zip(ours.keys + ours.values, ref.keys + ref.values):
            assert torch.equal(a, b)

    for t in (4, 1, 1, 3):
        kv = [_random_kv(g, t=t) for _ in range(2)]
        for layer, (k, v) in enumerate(kv):
            assert torch.equal(ours.append(layer, k, v)[0], ref.append(layer, k, v)[0])
        check()
    ours.trim(5), ref.trim(5)
    check()
    ours.reorder(idx), ref.reorder(idx)
    check()
    ours.reorder(torch.tensor([1, 2])), ref.reorder(torch.tensor([1, 2]))
    check()


def test_fixed_mode_masks_unwritten_slots_and_equals_prefix_mode():
    model = _gpt()
    ids = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 1]])
    prefix, fixed = model.new_state(max_len=16), model.new_state(max_len=16)
    model.step(ids, prefix), model.step(ids, fixed)
    fixed.fix()
    assert fixed.mask(1, torch.float32)[0, :5].eq(0).all()
    assert fixed.mask(1, torch.float32)[0, 5:].eq(float("-inf")).all()
    for tok in ([[2], [3]], [[4], [5]], [[6], [7]]):
        want = model.step(torch.tensor(tok), prefix)
        got = model.step(torch.tensor(tok), fixed)
        fixed.commit(1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    fixed.unfix()
    assert fixed.length == prefix.length == 7
    for a, b in zip(fixed.keys, prefix.keys):
        torch.testing.assert_close(a, b)


def _transformer(**kw) -> Transformer:
    torch.manual_seed(0)
    base = dict(vocab_size=17, d_model=16, n_head=2, n_encoder_layers=2, n_decoder_layers=2,
                dropout=0.0, pad_id=0, bos_id=1, eos_id=2, force_eos=False)  # fmt: skip
    return Transformer(TransformerConfig(**(base | kw))).eval()


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_transformer_static_state_gives_the_dynamic_tokens(batch, temperature):
    model = _transformer()
    sources = [[3 + (r % 7), 4 + (r % 5), 5][: 1 + r % 3] for r in range(batch)]
    setup = model.prepare_decoding(sources)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=20)
    dynamic, static = _both(
        model, setup.prompts, sampling, state_batch=setup.state_batch, process=setup.process
    )
    assert static == dynamic
    state = model.new_state(setup.state_batch, max_len=21)
    model.step(torch.tensor(setup.prompts), state)
    assert state.k_buf[0].shape[2] == 21


# -- the compiled step ----------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [True, False])  # CPU default / CUDA default (fixed buffers)
def test_compiled_step_is_one_graph_without_recompiling(prefix, temperature=1.0):
    """fullgraph=True (a graph break is an error), 64 steps and a second call under
    error_on_recompile, tokens equal to the eager static state. The "eager" backend checks
    the capture quickly; the inductor test below checks the generated code."""
    model = _gpt(block_size=96)
    step = CompiledStep(model, backend="eager", prefix=prefix)
    assert step.prefix is prefix
    prompts = _prompts(4)
    g = torch.Generator().manual_seed(3)
    want = decode(
        model,
        prompts,
        SamplingConfig(temperature=temperature, max_new_tokens=64),
        DecodeOptions(lookahead=0),
        generator=g,
    )
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):  # the second call reuses the graph (and the state's buffers)
            g = torch.Generator().manual_seed(3)
            got = decode(
                model,
                prompts,
                SamplingConfig(temperature=temperature, max_new_tokens=64),
                DecodeOptions(compile=step),
                generator=g,
            )
            assert got == want


def test_prefix_mode_serves_every_length_and_batch_size_with_one_graph():
    """Prefix mode (dynamic shapes): every length, prompts of 1 to 5 tokens, one graph for
    batch 1 (dynamo specialises a size of 1) and one for every other batch size (3, then 5
    and 2 compile nothing more); every call gives the eager tokens; the compiled step attends
    over the filled prefix (the state is never in fixed mode)."""
    model = _gpt(block_size=64)
    step = CompiledStep(model, backend="eager", prefix=True)
    calls = [([[1, 2, 3]], 20), ([[4]], 20), ([[1, 2], [3, 4, 5, 6, 7], [9]], 30)]
    calls += [([[i, i + 1] for i in range(5)], 10), ([[7], [8, 9, 10]], 25)]
    torch._dynamo.reset()
    for i, (prompts, n) in enumerate(calls):
        want = decode(
            model,
            prompts,
            SamplingConfig(temperature=0, max_new_tokens=n),
            DecodeOptions(lookahead=0),
        )
        with torch._dynamo.config.patch(error_on_recompile=i not in (0, 2)):
            assert (
                decode(
                    model,
                    prompts,
                    SamplingConfig(temperature=0, max_new_tokens=n),
                    DecodeOptions(compile=step),
                )
                == want
            )
        assert not any(s.fixed for s in step._states.values())


@pytest.mark.parametrize("prefix", [True, False])
def test_compiled_step_reads_weights_changed_between_decodes(prefix, tmp_path):
    """The step skips dynamo's guards on the model's nn layers: weights trained in place, or
    moved back to the row-major layout by a checkpoint write, between two compiled decodes
    give the tokens the changed model gives eagerly."""
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.tokenizers.char import CharTokenizer

    model = _gpt(block_size=64)
    step = CompiledStep(model, backend="eager", prefix=prefix)
    prompts = _prompts(3)
    assert decode(
        model,
        prompts,
        SamplingConfig(temperature=0, max_new_tokens=20),
        DecodeOptions(compile=step),
    ) == decode(
        model, prompts, SamplingConfig(temperature=0, max_new_tokens=20), DecodeOptions(lookahead=0)
    )
    tok = CharTokenizer.train("abc")
    save_checkpoint(tmp_path / "ck", model, {"model": {"type": "gpt"}}, tok, {"step": 0})
    assert model.blocks[0].attn.qkv_proj.weight.is_contiguous()  # row-major again
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(5))
    for _ in range(3):
        opt.zero_grad()
        model(ids, targets=ids).loss.backward()
        opt.step()
    model.eval()
    want = decode(
        model, prompts, SamplingConfig(temperature=0, max_new_tokens=20), DecodeOptions(lookahead=0)
    )
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert (
            decode(
                model,
                prompts,
                SamplingConfig(temperature=0, max_new_tokens=20),
                DecodeOptions(compile=step),
            )
            == want
        )


def test_compile_true_reuses_one_step_per_model_and_falls_back_past_the_window():
    from attnlm.runtime.compiled import compiled_step

    model = _gpt(block_size=16)
    assert compiled_step(model, backend="eager") is compiled_step(model, backend="eager")
    step = compiled_step(model, backend="eager")
    ids = torch.tensor([[1, 2, 3]])
    torch._dynamo.reset()
    want = generate(
        model, ids, SamplingConfig(temperature=0, max_new_tokens=30), DecodeOptions(lookahead=0)
    )  # past the window
    assert torch.equal(
        generate(
            model,
            ids,
            SamplingConfig(temperature=0, max_new_tokens=30),
            DecodeOptions(compile=step),
        ),
        want,
    )
    with pytest.raises(InputError, match="no compiled decode step"):
        CompiledStep(_gpt(positions="alibi"))


@pytest.mark.slow
def test_inductor_compiled_step_gives_the_eager_tokens():
    model = _gpt(block_size=96)
    want = generate(
        model,
        torch.tensor([[1, 2, 3], [4, 5, 6]]),
        SamplingConfig(temperature=0, max_new_tokens=40),
        DecodeOptions(lookahead=0),
    )
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = generate(
            model,
            torch.tensor([[1, 2, 3], [4, 5, 6]]),
            SamplingConfig(temperature=0, max_new_tokens=40),
            DecodeOptions(compile=True),
        )
    assert torch.equal(got, want)


@pytest.mark.slow
def test_cli_generate_compile_prints_the_uncompiled_text(cli, corpus, tmp_path):
    run = tmp_path / "run"
    argv = ["--preset", "tiny-test", "--text", str(corpus), "--out", str(run), "--max-iters", "3"]
    assert cli("train", *argv, "--no-progress").code == 0
    gen = ["--checkpoint", str(run), "--prompt", "First", "--max-new-tokens", "20"]
    for extra in (["--temperature", "0"], ["--seed", "3", "--top-k", "5"]):
        plain = cli("generate", *gen, *extra)
        compiled = cli("generate", *gen, *extra, "--compile")
        assert plain.code == compiled.code == 0 and compiled.out == plain.out


def test_cli_generate_compile_on_a_family_without_a_compiled_step(cli, corpus, tmp_path):
    run = tmp_path / "run"
    argv = ["--preset", "ffnn-char", "--text", str(corpus), "--out", str(run), "--max-iters", "2"]
    assert cli("train", *argv, "--no-progress", "--eval-interval", "2").code == 0
    res = cli("generate", "--checkpoint", str(run), "--max-new-tokens", "3", "--compile")
    assert res.code == 2 and "no compiled decode step" in res.err
    assert "Traceback" not in res.err and len(res.err.strip().splitlines()) == 1


def test_recompile_limit_falls_back_on_pytorch_without_the_keyword(monkeypatch):
    """PyTorch before 2.12 has no ``recompile_limit`` keyword on ``torch.compile`` (an H100
    image with 2.11 failed on it): the process-wide dynamo limit is raised instead."""
    import torch._dynamo.config as dynamo_config

    from attnlm.runtime import compiled

    assert compiled._recompile_options(40) == {"recompile_limit": 40, "isolate_recompiles": True}

    def old_compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor",
                    mode=None, options=None, disable=False):  # fmt: skip
        return model

    monkeypatch.setattr(torch, "compile", old_compile)
    with dynamo_config.patch(recompile_limit=8):  # restored afterwards, whatever happens
        assert compiled._recompile_options(40) == {}
        assert dynamo_config.recompile_limit == 40
