"""The compiled decode step of the encoder-decoder ``transformer`` (attnlm.runtime.compiled,
attnlm.models.transformer_state): the tokens of the eager static state and of the growing
cache, one graph per (batch size, buffer bucket, source bucket) reused across calls, no
recompilation over 64 steps, and the paths that use it (translate_ids, ``attnlm translate
--compile``, the explorer's ``serve --compile``).

Most tests compile with the "eager" backend (dynamo's capture and guards, no code
generation: seconds); one slow test runs inductor."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.generate.beam import beam_search
from attnlm.generate.loop import decode
from attnlm.generate.options import DecodeOptions
from attnlm.generate.sampling import SamplingConfig
from attnlm.generate.translate import translate_ids
from attnlm.models.transformer import Transformer, TransformerConfig
from attnlm.nn.static_cache import padded_length
from attnlm.runtime import compiled as C
from attnlm.runtime.compiled import CompiledStep
from support import tiny_translation_run

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12], [13, 14], [5, 6, 7, 8, 9]]


def _transformer(**kw) -> Transformer:
    torch.manual_seed(0)
    base = dict(vocab_size=23, d_model=16, n_head=2, n_encoder_layers=1, n_decoder_layers=2,
                d_ff=32, dropout=0.0, pad_id=0, bos_id=1, eos_id=2)  # fmt: skip
    model = Transformer(TransformerConfig(**(base | kw))).eval()
    with torch.no_grad():  # larger weights: varied tokens, not one repeated
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    return model


def _decode(model, sources, n, compile=False, static=True, temperature=0.0):
    """Ids after the start token of each source, as translate_ids decodes them (no end token:
    every row runs ``n`` steps)."""
    setup = model.prepare_decoding(sources)
    g = torch.Generator().manual_seed(5)
    return decode(
        model,
        setup.prompts,
        SamplingConfig(temperature=temperature, top_k=8, max_new_tokens=n),
        DecodeOptions(static=static, compile=compile),
        generator=g,
        state_batch=setup.state_batch,
        process=setup.process,
    )


@pytest.fixture
def no_recompile():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield


def test_padded_length_buckets():
    assert [padded_length(n) for n in (1, 16, 17, 33, 64, 65)] == [16, 16, 32, 64, 64, 128]
    with pytest.raises(InputError):
        padded_length(0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("batch", [1, 5])
def test_compiled_tokens_equal_eager_static_and_dynamic(temperature, batch, no_recompile):
    """64 steps after the start token under error_on_recompile, twice: the second call
    reuses the graph and the state; tokens equal the eager static state and the growing
    cache (the same seeded generator)."""
    model = _transformer(force_eos=False)
    sources = SOURCES[:batch]
    dynamic = _decode(model, sources, 64, static=False, temperature=temperature)
    static = _decode(model, sources, 64, temperature=temperature)
    assert static == dynamic and all(len(r) == 64 for r in dynamic)
    if temperature:
        assert len({t for row in dynamic for t in row}) > 3  # not one repeated token
    step = CompiledStep(model, backend="eager")
    for _ in range(2):
        assert _decode(model, sources, 64, compile=step, temperature=temperature) == dynamic
    assert len(step._graphs) == 1


def test_one_graph_per_source_bucket_reused_across_calls(no_recompile):
    """Sources of 1 to 16 tokens share the 16-slot graph (calls of different source lengths,
    no recompile); 17 tokens make a 32-slot graph; the state and its buffers are reused."""
    model = _transformer(force_eos=False)
    step = CompiledStep(model, backend="eager")
    short = [[[3, 4, 5]], [list(range(3, 14))], [[7]]]
    for sources in short:
        assert _decode(model, sources, 20, compile=step) == _decode(model, sources, 20)
    (state,) = step._states.values()
    assert state.context_mask.shape == (1, 1, 1, 16)
    assert [kv[0].shape for kv in state.cross] == [(1, 2, 16, 8)] * 2
    assert state.k_buf[0].shape == (1, 2, 32, 8)  # 21 positions -> a 32-slot buffer
    addresses = [t.data_ptr() for t in state.fixed_tensors()]
    assert _decode(model, [[9, 8, 7, 6]], 20, compile=step) == _decode(model, [[9, 8, 7, 6]], 20)
    assert [t.data_ptr() for t in state.fixed_tensors()] == addresses
    assert len(step._graphs) == 1
    torch._dynamo.reset()  # a new bucket compiles a new graph (a recompile of this function)
    longer = [list(range(3, 20)) + [3, 4]]  # 19 tokens
    assert _decode(model, longer, 20, compile=step) == _decode(model, longer, 20)
    assert state.context_mask.shape == (1, 1, 1, 32) and len(step._graphs) == 2


def test_padded_source_mask_and_keys():
    model = _transformer()
    setup = model.prepare_decoding([[3, 4, 5], [6]])
    state = model.new_state(setup.state_batch, max_len=8)
    model.step(torch.tensor(setup.prompts), state)
    held = [(k.clone(), v.clone()) for k, v in state.cross]
    state.fix()
    mask = state.context_mask[:, 0, 0]
    assert mask.shape == (2, 16)
    assert mask[0, :3].eq(0).all() and mask[0, 3:].eq(float("-inf")).all()
    assert mask[1, :1].eq(0).all() and mask[1, 1:].eq(float("-inf")).all()
    for (k, v), (k0, v0) in zip(state.cross, held):
        assert torch.equal(k[:, :, :3], k0) and torch.equal(v[:, :, :3], v0)
    fresh = model.new_state(setup.state_batch, max_len=8)
    with pytest.raises(InputError, match="first step"):
        fresh.fix()


def test_past_max_graphs_the_step_runs_uncompiled(monkeypatch, no_recompile):
    model = _transformer(force_eos=False)
    step = CompiledStep(model, backend="eager")
    monkeypatch.setattr(C, "MAX_GRAPHS", 1)
    assert _decode(model, [[3, 4]], 10, compile=step) == _decode(model, [[3, 4]], 10)
    two = [[3, 4], [5]]  # a second batch size: no compile (error_on_recompile would raise)
    assert _decode(model, two, 10, compile=step) == _decode(model, two, 10)
    assert len(step._graphs) == 1


def test_translate_ids_compile_greedy_sampling_and_beams(monkeypatch):
    """translate_ids(compile=...) gives the uncompiled ids: greedy and seeded sampling over
    batches of 2 (the last one smaller: another graph), end tokens and the forced end token
    included; beam search ignores it (uncompiled) and gives its own ids."""
    model = _transformer()
    step = CompiledStep(model, backend="eager")
    torch._dynamo.reset()
    sampling = SamplingConfig(temperature=1.0, top_k=6, seed=4)
    for cfg in (None, sampling):
        want = translate_ids(model, SOURCES, sampling=cfg, batch_size=2)
        assert translate_ids(model, SOURCES, sampling=cfg, batch_size=2, compile=step) == want
    want = beam_search(model, SOURCES[:2], 3, max_new_tokens=12)
    assert translate_ids(model, SOURCES[:2], num_beams=3, max_new_tokens=12, compile=step) == want


def _eager_steps(monkeypatch):
    """compile=True builds "eager"-backend steps (fast) instead of inductor ones."""
    real = C.compiled_step
    monkeypatch.setattr(C, "compiled_step", lambda model, backend=None, mode=None: real(
        model, backend="eager"))  # fmt: skip


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny translation checkpoint (character pair tokenizers, random weights)."""
    pairs = [("one two three", "eins zwei drei"), ("four five", "vier fünf")]
    return tiny_translation_run(tmp_path, pairs)


def test_cli_translate_compile_prints_the_uncompiled_translations(checkpoint, capsys, monkeypatch):
    from attnlm.cli import main

    _eager_steps(monkeypatch)
    base = ["translate", "--checkpoint", str(checkpoint), "--threads", "1", "one two", "five"]
    for extra in ([], ["--temperature", "0.9", "--seed", "2"], ["--beam", "2"]):
        capsys.readouterr()
        assert main([*base, *extra]) == 0
        plain = capsys.readouterr().out
        assert main([*base, *extra, "--compile"]) == 0
        assert capsys.readouterr().out == plain and len(plain.splitlines()) == 2


def test_cli_serve_compile_sets_the_services(checkpoint, capsys, monkeypatch):
    from attnlm.cli import main
    from attnlm.web import server

    seen = []

    def no_server(services, host, port):
        seen.extend(services)
        raise OSError("stop here")

    monkeypatch.setattr(server, "make_server", no_server)
    argv = ["serve", "--checkpoint", str(checkpoint), "--port", "0"]
    assert main(argv) == 2 and not seen[-1].compile
    assert main([*argv, "--compile"]) == 2 and seen[-1].compile
    assert "cannot listen" in capsys.readouterr().err


def test_explorer_compile_translates_like_the_uncompiled_service(monkeypatch):
    from attnlm.data.pairs import Pair, PairTokenizerConfig, train_pair_tokenizers
    from attnlm.web.service.model import ModelService

    pairs = train_pair_tokenizers(
        [Pair("one two three", "eins zwei drei vier fünf")], PairTokenizerConfig(kind="char")
    )
    ids = pairs.target_ids
    model = _transformer(vocab_size=ids.vocab_size, pad_id=ids.pad, bos_id=ids.bos,
                         eos_id=ids.eos)  # fmt: skip
    _eager_steps(monkeypatch)
    plain = ModelService("mt", model, pairs, family="transformer", capabilities={"translate"})
    compiled = ModelService("mt", model, pairs, family="transformer",
                            capabilities={"translate"}, compile=True)  # fmt: skip
    assert compiled._compiled() and not plain._compiled()
    for text in ("one two", "two"):
        answer = compiled.translate(text)
        assert answer == plain.translate(text) and answer["translation"]
    assert C._STEPS[model][("eager", None, None)]._graphs  # the step was used


def test_compile_on_a_family_without_a_compiled_step_is_an_input_error():
    from attnlm.models.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig

    model = RNNSeq2Seq(RNNSeq2SeqConfig(vocab_size=12, d_emb=4, d_hidden=8)).eval()
    with pytest.raises(InputError, match="no compiled decode step"):
        translate_ids(model, [[3, 4]], compile=True)


@pytest.mark.slow
def test_inductor_compiled_translation_gives_the_eager_ids(no_recompile):
    """The default step (inductor, C++ wrapper on CPU) over a batch of 3 and 40 steps."""
    model = _transformer(force_eos=False)
    want = _decode(model, SOURCES[:3], 40)
    assert _decode(model, SOURCES[:3], 40, compile=True) == want
    assert _decode(model, SOURCES[1:4], 40, compile=True) == _decode(model, SOURCES[1:4], 40)
