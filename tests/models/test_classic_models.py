"""Feed-forward (Bengio 2003) and recurrent (RNN/LSTM/GRU) LM families: forward values
against hand-computed ones, stateful truncated BPTT against one pass over the whole stream,
decoding with the carried state against recomputation."""

import math

import numpy as np
import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.generate import SamplingConfig, beam_search, decode
from attnlm.generate.options import DecodeOptions
from attnlm.loading.evaluation import evaluate
from attnlm.loading.objectives import StreamBatches, make_objective
from attnlm.models import registry
from attnlm.models.ffnn import FFNNLM, FFNNConfig
from attnlm.models.rnn import RNNLM, RNNConfig
from support import greedy_with_and_without_cache

CELLS = ["rnn", "lstm", "gru"]


def log_softmax(y):
    y = np.asarray(y, dtype=np.float64)
    m = y.max()
    return y - m - math.log(np.exp(y - m).sum())


# -- feed-forward ------------------------------------------------------------------------------


def test_ffnn_forward_matches_hand_computed_values():
    torch.manual_seed(0)
    cfg = FFNNConfig(vocab_size=3, order=3, n_embd=2, n_hidden=2, direct=True, block_size=4)
    model = FFNNLM(cfg).double()
    C = model.embed.weight.detach().numpy()  # (V+1, m), row 3 = padding
    Hw, d = model.hidden.weight.detach().numpy(), model.hidden.bias.detach().numpy()
    U, b = model.out.weight.detach().numpy(), model.out.bias.detach().numpy()
    W = model.direct.weight.detach().numpy()
    ids = [2, 0, 1, 1]
    targets = [0, 1, 1, 2]
    out = model(torch.tensor([ids]), torch.tensor([targets]))
    assert out.logits.shape == (1, 4, 3)
    nll = 0.0
    for t in range(4):
        ctx = [ids[t - 1] if t >= 1 else 3, ids[t]]  # n-1 = 2 previous tokens, pad id 3
        x = np.concatenate([C[ctx[0]], C[ctx[1]]])
        y = b + W @ x + U @ np.tanh(d + Hw @ x)  # Bengio et al. (2003), eq. 1
        np.testing.assert_allclose(out.logits[0, t].detach().numpy(), y, rtol=1e-10)
        nll -= log_softmax(y)[targets[t]]
    assert out.n_targets == 4
    assert abs(float(out.loss_sum) - nll) < 1e-5  # the loss is summed in float32
    assert abs(float(out.loss) - nll / 4) < 1e-5


def test_ffnn_without_direct_connections_and_config_errors():
    model = FFNNLM(FFNNConfig(vocab_size=5, order=2, direct=False))
    assert model.direct is None
    with pytest.raises(ConfigError, match="model.order"):
        FFNNConfig(vocab_size=5, order=1)
    with pytest.raises(ConfigError, match="model.n_hidden"):
        FFNNConfig(vocab_size=5, n_hidden=0)
    with pytest.raises(InputError, match="out of range"):
        model(torch.tensor([[5]]))


def test_ffnn_step_equals_forward_and_decoding_with_state_equals_recomputation():
    torch.manual_seed(1)
    model = FFNNLM(FFNNConfig(vocab_size=7, order=4, n_embd=5, n_hidden=9, direct=True)).eval()
    ids = torch.randint(0, 7, (2, 11))
    full = model(ids).logits
    state = model.new_state()
    parts = [model.step(ids[:, a:b], state) for a, b in ((0, 1), (1, 5), (5, 6), (6, 11))]
    torch.testing.assert_close(torch.cat(parts, 1), full)
    prompts = [[1, 2, 3], [4]]
    a, b = greedy_with_and_without_cache(model, prompts, 20)
    assert a == b and all(len(r) == 20 for r in a)


# -- recurrent ---------------------------------------------------------------------------------


def _cell_step(cell, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """One step of PyTorch's RNN/LSTM/GRU equations, written out (gate order i,f,g,o / r,z,n)."""
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    if cell == "rnn":
        return np.tanh(w_ih @ x + b_ih + w_hh @ h + b_hh), None
    if cell == "lstm":
        g = w_ih @ x + b_ih + w_hh @ h + b_hh
        i, f, gg, o = np.split(g, 4)
        c = sig(f) * c + sig(i) * np.tanh(gg)
        return sig(o) * np.tanh(c), c
    gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
    r = sig(gi[: len(h)] + gh[: len(h)])
    z = sig(gi[len(h) : 2 * len(h)] + gh[len(h) : 2 * len(h)])
    n = np.tanh(gi[2 * len(h) :] + r * gh[2 * len(h) :])
    return (1 - z) * n + z * h, None


@pytest.mark.parametrize("cell", CELLS)
def test_rnn_forward_matches_hand_computed_values(cell):
    torch.manual_seed(2)
    cfg = RNNConfig(vocab_size=4, cell=cell, n_layer=2, n_embd=3, block_size=8)
    model = RNNLM(cfg).double()
    for p in model.parameters():  # larger weights than the default init: a sharper test
        torch.nn.init.uniform_(p, -0.8, 0.8)
    ids, targets = [3, 0, 2, 2, 1], [0, 2, 2, 1, 3]
    out = model(torch.tensor([ids]), torch.tensor([targets]), return_hidden=True)
    assert out.logits.shape == (1, 5, 4) and len(out.hidden_states) == 3
    E = model.embed.weight.detach().numpy()
    layers = [
        {k: getattr(layer, f"{k}_l0").detach().numpy() for k in ("weight_ih", "weight_hh",
         "bias_ih", "bias_hh")} for layer in model.layers
    ]  # fmt: skip
    h = [np.zeros(3), np.zeros(3)]
    c = [np.zeros(3), np.zeros(3)]
    nll = 0.0
    for t, tok in enumerate(ids):
        x = E[tok]
        for i, w in enumerate(layers):
            h[i], c[i] = _cell_step(cell, x, h[i], c[i], w["weight_ih"], w["weight_hh"],
                                    w["bias_ih"], w["bias_hh"])  # fmt: skip
            x = h[i]
        y = E @ x + model.head.bias.detach().numpy()  # tied head: logits = E h + b
        np.testing.assert_allclose(out.logits[0, t].detach().numpy(), y, rtol=1e-9, atol=1e-12)
        nll -= log_softmax(y)[targets[t]]
    assert abs(float(out.loss_sum) - nll) < 1e-5  # the loss is summed in float32


def test_rnn_config_errors():
    with pytest.raises(ConfigError, match="model.cell"):
        RNNConfig(vocab_size=5, cell="transformer")
    with pytest.raises(ConfigError, match="tie_embeddings"):
        RNNConfig(vocab_size=5, n_embd=8, n_hidden=16)
    RNNConfig(vocab_size=5, n_embd=8, n_hidden=16, tie_embeddings=False)
    with pytest.raises(ConfigError, match="model.cell"):
        registry.build({"type": "rnn", "vocab_size": 5, "cell": "x"})


@pytest.mark.parametrize("cell", CELLS)
def test_stateful_bptt_equals_the_whole_stream_at_once(cell):
    torch.manual_seed(3)
    model = RNNLM(RNNConfig(vocab_size=6, cell=cell, n_layer=2, n_embd=8, block_size=5)).eval()
    ids = np.random.default_rng(0).integers(0, 6, size=2 * 23).astype(np.int64)
    src = make_objective("causal-stream", None, model.config).source(ids, 1.0)
    assert isinstance(src, StreamBatches)
    gen = torch.Generator().manual_seed(0)
    chunks = []
    with torch.no_grad():
        for _ in range(5):  # 22 targets per stream in windows of 5: 5, 5, 5, 5, 2
            batch = src.collate(src.draw(2, gen))
            chunks.append(model(**batch).logits)
        # the streams restart: state reset, same logits as the first window
        again = model(**src.collate(src.draw(2, gen))).logits
        whole = model(torch.from_numpy(ids.reshape(2, 23)[:, :-1])).logits
    torch.testing.assert_close(torch.cat(chunks, 1), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, whole[:, :5], rtol=1e-5, atol=1e-5)
    assert [c.shape[1] for c in chunks] == [5, 5, 5, 5, 2]


@pytest.mark.parametrize("cell", CELLS)
def test_stateful_gradients_are_truncated_at_window_boundaries(cell):
    torch.manual_seed(4)
    cfg = RNNConfig(vocab_size=6, cell=cell, n_layer=1, n_embd=4, tie_embeddings=False)
    model = RNNLM(cfg)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 3]])  # tokens 0-2 only in the first window
    stream = torch.tensor([0])
    model(ids[:, :3], ids[:, 1:4], stream=stream, reset=torch.tensor([True]))
    out = model(ids[:, 3:6], ids[:, 4:7], stream=stream, reset=torch.tensor([False]))
    out.loss_sum.backward()  # the carried state is detached: only this window's graph
    grad = model.embed.weight.grad
    assert torch.count_nonzero(grad[:3]) == 0 and torch.count_nonzero(grad[3:]) > 0
    # without carrying (stream absent) the second window's loss differs: the state matters
    with torch.no_grad():
        fresh = model(ids[:, 3:6], ids[:, 4:7]).loss_sum
    assert abs(float(fresh) - float(out.loss_sum)) > 1e-6


@pytest.mark.parametrize("cell", CELLS)
def test_exact_stream_evaluation_predicts_every_target_once(cell):
    torch.manual_seed(5)
    model = RNNLM(RNNConfig(vocab_size=6, cell=cell, n_layer=1, n_embd=8, block_size=4))
    ids = np.random.default_rng(1).integers(0, 6, size=31).astype(np.int64)
    src = StreamBatches(ids, 4, 1.0)
    res = evaluate(model, src, batch_size=3)
    assert res.tokens == 30
    # reference: each evaluation stream run at once from a zero state
    per, nats = 30 // 3, 0.0
    with torch.no_grad():
        for s in (0, 10, 20):
            x = torch.from_numpy(ids[s : s + per + 1])[None]
            nats += float(model(x[:, :-1], x[:, 1:]).loss_sum)
    assert abs(res.loss * 30 - nats) < 1e-4


@pytest.mark.parametrize("cell", CELLS)
def test_decoding_with_carried_state_equals_recomputation(cell):
    torch.manual_seed(6)
    model = RNNLM(RNNConfig(vocab_size=9, cell=cell, n_layer=2, n_embd=12, block_size=4)).eval()
    ids = torch.randint(0, 9, (3, 13))
    state = model.new_state()
    with torch.no_grad():
        parts = [model.step(ids[:, a:b], state) for a, b in ((0, 2), (2, 3), (3, 13))]
        full = model(ids).logits
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)
    assert state.length == 13
    prompts = [[1, 2, 3, 4, 5, 6], [7]]  # longer than block_size: never cropped
    a, b = greedy_with_and_without_cache(model, prompts, 15)
    assert a == b
    sampling = SamplingConfig(temperature=0.9, top_k=4, top_p=0.9, max_new_tokens=10)
    sampled = [
        decode(
            model,
            prompts,
            sampling,
            DecodeOptions(use_cache=c),
            generator=torch.Generator().manual_seed(7),
        )
        for c in (True, False)
    ]
    assert sampled[0] == sampled[1]
    beams = beam_search(model, [[1, 2, 3]], num_beams=1, max_new_tokens=8)
    assert (
        beams[0] == decode(model, [[1, 2, 3]], SamplingConfig(temperature=0, max_new_tokens=8))[0]
    )
    assert len(beam_search(model, [[1, 2]], num_beams=3, max_new_tokens=5)[0]) == 5


def test_stream_source_state_and_errors():
    ids = np.arange(40) % 7
    src = StreamBatches(ids, 4, 1.0)
    gen = torch.Generator()
    first = src.draw(4, gen)
    assert first["reset"].all() and first["starts"].tolist() == [0, 10, 20, 30]
    sd = src.state_dict()
    second = src.draw(4, gen)
    assert not second["reset"].any() and second["starts"].tolist() == [4, 14, 24, 34]
    other = StreamBatches(ids, 4, 1.0)
    other.load_state_dict(sd)
    assert torch.equal(other.draw(4, gen)["starts"], second["starts"])
    with pytest.raises(ConfigError, match="streams"):
        src.draw(2, gen)
    with pytest.raises(InputError, match="too short"):
        StreamBatches(ids, 4, 1.0).draw(30, gen)
    assert "stream" not in src.sample(3, gen)  # estimates: random windows, fresh state


def test_carry_state_round_trip_and_pools():
    torch.manual_seed(8)
    model = RNNLM(RNNConfig(vocab_size=5, cell="lstm", n_layer=1, n_embd=4))
    ids = torch.randint(0, 5, (2, 3))
    model(ids, stream=torch.tensor([0, 1]), reset=torch.tensor([True, True]))
    model(ids, stream=torch.tensor([-1, -2]), reset=torch.tensor([True, True]))
    saved = model.carry_state()
    assert set(saved) == {"h", "c"} and saved["h"].shape == (1, 2, 4)
    twin = RNNLM(model.config)
    twin.load_state_dict(model.state_dict())
    twin.load_carry_state(saved)
    kw = {"stream": torch.tensor([1, 0]), "reset": torch.tensor([False, False])}
    torch.testing.assert_close(model(ids, **kw).logits, twin(ids, **kw).logits)
    with pytest.raises(InputError, match="mixes"):
        model(ids, stream=torch.tensor([0, -1]))


@pytest.mark.parametrize("cell", CELLS)
def test_fused_multi_layer_call_equals_the_per_layer_path(cell):
    """Without return_hidden the layers run in one fused kernel call; with it, one call per
    layer. Same numbers (logits, carried state, gradients) without dropout, in train and
    eval mode; with dropout the fused call drops between layers in training only."""
    torch.manual_seed(9)
    model = RNNLM(RNNConfig(vocab_size=11, cell=cell, n_layer=3, n_embd=16, block_size=8))
    ids = torch.randint(0, 11, (4, 9))
    runs = []
    for return_hidden in (False, True):
        model.zero_grad(set_to_none=True)
        out = model(ids, ids, return_hidden=return_hidden)
        out.loss_sum.backward()
        runs.append([out.logits, *(p.grad for p in model.parameters())])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    h = torch.randn(3, 4, 16)
    hidden = (h, torch.randn(3, 4, 16)) if cell == "lstm" else h
    x = torch.randn(9, 4, 16)
    with torch.no_grad():
        fused, per_layer = model._run(x, hidden, False), model._run(x, hidden, True)
    leaves = torch.utils._pytree.tree_leaves
    for a, b in zip(leaves(fused[:2]), leaves(per_layer[:2]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    dropped = RNNLM(RNNConfig(vocab_size=11, cell=cell, n_layer=2, n_embd=16, dropout=0.5))
    dropped.load_state_dict({k: v for k, v in model.state_dict().items() if "layers.2" not in k})
    dropped.embed.weight.data.mul_(10)  # non-negligible layer outputs
    with torch.no_grad():
        dropped.eval()
        torch.testing.assert_close(dropped(ids).logits, dropped(ids, return_hidden=True).logits)
        dropped.train()
        assert not torch.allclose(dropped(ids).logits, dropped.eval()(ids).logits)


@pytest.mark.parametrize("cell", CELLS)
def test_carry_fast_path_equals_the_gather_scatter_path(cell):
    """Batches holding streams 0..N-1 in order (the trainer's) use the stored states as
    they are; any other order gathers and scatters rows. Both carry the same states; a
    graph built on the fast path survives a later general-path batch (stored states are
    replaced, never written in place)."""
    torch.manual_seed(10)
    cfg = RNNConfig(vocab_size=7, cell=cell, n_layer=2, n_embd=8, block_size=4)
    fast, slow = RNNLM(cfg), RNNLM(cfg)
    slow.load_state_dict(fast.state_dict())
    ids = torch.randint(0, 7, (3, 21))
    order, perm = torch.arange(3), torch.tensor([2, 0, 1])
    for w in range(5):
        x, y = ids[:, 4 * w : 4 * w + 4], ids[:, 4 * w + 1 : 4 * w + 5]
        reset = torch.tensor([w == 0, w == 3, False])
        a = fast(x, y, stream=order, reset=reset)
        b = slow(x[perm], y[perm], stream=order[perm], reset=reset[perm])
        torch.testing.assert_close(a.logits[perm], b.logits, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a.loss_sum, b.loss_sum, rtol=1e-6, atol=1e-6)
    for s, t in zip(fast.carry_state().values(), slow.carry_state().values(), strict=True):
        torch.testing.assert_close(s, t, rtol=1e-6, atol=1e-7)
    with torch.no_grad():  # evaluation streams (-1, -2, ...) in order: the same fast path
        e1 = fast(ids[:, :4], stream=-1 - order, reset=torch.ones(3, dtype=torch.bool))
        e2 = slow(ids[perm, :4], stream=-1 - order[perm], reset=torch.ones(3, dtype=torch.bool))
    torch.testing.assert_close(e1.logits[perm], e2.logits, rtol=1e-6, atol=1e-7)
    # the native kernel (not oneDNN's) saves its inputs for backward, as cuDNN does
    with torch.backends.mkldnn.flags(enabled=False):
        first = fast(ids[:, :4], ids[:, 1:5], stream=order)  # fast path, graph kept
        second = fast(ids[1:, :4], ids[1:, 1:5], stream=torch.tensor([2, 1]))  # gather/scatter
    (first.loss_sum + second.loss_sum).backward()
