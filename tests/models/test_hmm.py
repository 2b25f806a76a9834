"""The hidden Markov model family: the forward algorithm against brute-force enumeration of
every state path, likelihood, Viterbi and one Baum-Welch iteration against hmmlearn's
CategoricalHMM, EM's monotone likelihood, the gradient against EM's expected counts, decoding
with the filtered state against recomputation, ancestral sampling against the model's
probabilities, and the command line (fit, train, eval, generate, viterbi, errors)."""

import itertools
import json
import math

import numpy as np
import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.models import hmm as hmm_module
from attnlm.models import registry
from attnlm.models.hmm import HMMLM, HMMConfig, split_sequences
from support import greedy_with_and_without_cache

hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(vocab=3, states=2, seed=0, **kw):
    torch.manual_seed(seed)
    return HMMLM(HMMConfig(vocab_size=vocab, n_states=states, **kw)).double()


def numpy_probs(model):
    return tuple(p.detach().numpy() for p in model.probs())


def peer(model, n_iter=1, prior=1.0):
    """hmmlearn's CategoricalHMM with our model's parameters, not re-initialised by fit."""
    pi, A, E = numpy_probs(model)
    h = hmmlearn_hmm.CategoricalHMM(
        n_components=len(pi), n_features=E.shape[1], init_params="", params="ste",
        n_iter=n_iter, startprob_prior=prior, transmat_prior=prior, emissionprob_prior=prior,
    )  # fmt: skip
    h.startprob_, h.transmat_, h.emissionprob_ = pi, A, E
    return h


def as_hmmlearn(sequences):
    """Our list of (N, T) batches as hmmlearn's (X, lengths)."""
    X = np.concatenate([s.reshape(-1).numpy() for s in sequences]).reshape(-1, 1)
    lengths = [s.shape[1] for s in sequences for _ in range(s.shape[0])]
    return X, lengths


def brute_force_log_prob(model, ids):
    """log p(x_1..x_T) summed over all K^T state paths."""
    pi, A, E = numpy_probs(model)
    total = 0.0
    for z in itertools.product(range(len(pi)), repeat=len(ids)):
        p = pi[z[0]] * E[z[0], ids[0]]
        for t in range(1, len(ids)):
            p *= A[z[t - 1], z[t]] * E[z[t], ids[t]]
        total += p
    return math.log(total)


def random_text(n, vocab, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, vocab, n))


# -- the forward algorithm -------------------------------------------------------------------


def test_forward_algorithm_equals_enumerating_every_state_path():
    model = tiny(vocab=3, states=3, seed=1)
    ids = [2, 0, 1, 1, 2]
    assert model.score(torch.tensor([ids])) == pytest.approx(
        brute_force_log_prob(model, ids), rel=1e-12
    )
    # the LM's logits at t are log p(x_{t+1} = v | x_1..x_t) = log p(x_1..x_t v) - log p(x_1..x_t)
    logits = model(torch.tensor([ids])).logits[0].detach()
    for t in range(len(ids)):
        prefix = brute_force_log_prob(model, ids[: t + 1])
        for v in range(3):
            expected = brute_force_log_prob(model, ids[: t + 1] + [v]) - prefix
            assert float(logits[t, v]) == pytest.approx(expected, abs=1e-12)


def test_window_loss_is_the_likelihood_after_the_first_token():
    """A causal window predicts x_2..x_T from x_1: its summed loss is
    -(log p(x_1..x_T) - log p(x_1)), with hmmlearn's score for the likelihoods."""
    model = tiny(vocab=5, states=4, seed=2)
    ids = random_text(12, 5, seed=3)
    with torch.no_grad():
        out = model(ids[None, :-1], targets=ids[None, 1:])
    h = peer(model)
    whole = h.score(ids.numpy().reshape(-1, 1))
    first = h.score(ids[:1].numpy().reshape(-1, 1))
    assert float(out.loss_sum) == pytest.approx(-(whole - first), rel=1e-6)
    assert int(out.n_targets) == 11


def no_repeats(n, vocab, seed=0):
    """Random text where no token follows itself: a repeated token lets two state paths
    share every factor in another order (a a b vs a b a), an exact tie that each side breaks
    by its own rounding."""
    rng, out = np.random.default_rng(seed), [0]
    while len(out) < n:
        v = int(rng.integers(0, vocab))
        if v != out[-1]:
            out.append(v)
    return torch.tensor(out)


def path_log_prob(model, ids, states):
    pi, A, E = numpy_probs(model)
    total = math.log(pi[states[0]]) + math.log(E[states[0], ids[0]])
    for t in range(1, len(ids)):
        total += math.log(A[states[t - 1], states[t]]) + math.log(E[states[t], ids[t]])
    return total


def test_likelihood_and_viterbi_equal_hmmlearn():
    model = tiny(vocab=7, states=5, seed=3)
    sequences = split_sequences(no_repeats(203, 7, seed=4), 20)  # 10 x 20 and a tail of 3
    assert [tuple(s.shape) for s in sequences] == [(10, 20), (1, 3)]
    X, lengths = as_hmmlearn(sequences)
    h = peer(model)
    assert model.score(sequences) == pytest.approx(h.score(X, lengths), rel=1e-6)
    log_prob, states = h.decode(X, lengths, algorithm="viterbi")
    ours = [model.viterbi(s) for s in sequences]
    assert sum(float(lp.sum()) for lp, _ in ours) == pytest.approx(log_prob, rel=1e-6)
    np.testing.assert_array_equal(np.concatenate([p.reshape(-1) for _, p in ours]), states)


def test_viterbi_paths_differ_from_hmmlearn_only_at_exact_ties():
    model = tiny(vocab=7, states=5, seed=3)
    sequences = split_sequences(random_text(400, 7, seed=4), 20)
    X, lengths = as_hmmlearn(sequences)
    theirs = peer(model).decode(X, lengths)[1].reshape(-1, 20)
    log_prob, ours = model.viterbi(sequences[0])
    for x, a, b, lp in zip(sequences[0].tolist(), ours.tolist(), theirs.tolist(), log_prob):
        assert path_log_prob(model, x, a) == pytest.approx(float(lp), rel=1e-12)
        assert path_log_prob(model, x, b) == pytest.approx(float(lp), rel=1e-12)
    assert (ours.numpy() == theirs).all(1).mean() >= 0.8


@pytest.mark.parametrize("pseudocount", [0.0, 0.5])
def test_one_em_iteration_equals_hmmlearn(pseudocount):
    """hmmlearn's Dirichlet prior (concentration) is our em_pseudocount + 1."""
    model = tiny(vocab=6, states=4, seed=5, em_pseudocount=pseudocount)
    sequences = split_sequences(random_text(157, 6, seed=6), 16)
    X, lengths = as_hmmlearn(sequences)
    h = peer(model, n_iter=1, prior=1.0 + pseudocount)
    h.fit(X, lengths)
    stats = model.em_step(sequences)
    assert stats.n_tokens == 157 and stats.n_sequences == len(lengths)
    pi, A, E = numpy_probs(model)
    np.testing.assert_allclose(pi, h.startprob_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(A, h.transmat_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(E, h.emissionprob_, rtol=1e-9, atol=1e-12)


def test_em_never_lowers_the_likelihood():
    model = tiny(vocab=8, states=6, seed=7)
    sequences = split_sequences(random_text(400, 8, seed=8), 25)
    lls = [model.em_step(sequences).log_likelihood for _ in range(12)]
    lls.append(model.score(sequences))
    assert all(b >= a - 1e-9 for a, b in zip(lls, lls[1:])), lls
    assert lls[-1] > lls[0] + 1.0


def test_fit_step_is_one_em_step_over_the_windows():
    """What ``train.hmm_em`` runs (the trainer calls ``fit_step`` with the training split's
    window batches): the em_step of their ids, loss = nats per token before the update."""
    sequences = split_sequences(random_text(230, 6, seed=3), 20)
    by_hand, fitted = tiny(vocab=6, states=4, seed=5), tiny(vocab=6, states=4, seed=5)
    stats = by_hand.em_step(sequences)
    loss, tokens = fitted.fit_step({"ids": s, "targets": s} for s in sequences)
    assert tokens == stats.n_tokens == 230
    assert loss == pytest.approx(-stats.log_likelihood / 230, rel=1e-12)
    for a, b in zip(by_hand.parameters(), fitted.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_regrouped_em_chunks_equal_one_batch(monkeypatch):
    """The E-step regroups rows into chunks of EM_CHUNK values: the counts are those of one
    batch holding every row."""
    sequences = split_sequences(random_text(205, 5, seed=9), 20)  # 10 rows and a tail
    whole = tiny(vocab=5, states=3, seed=4).em_step(sequences)
    monkeypatch.setattr(hmm_module, "EM_CHUNK", 20 * 3 * 3)  # three rows per chunk
    pieces = [s[i : i + 1] for s in sequences for i in range(s.shape[0])]
    chunked = tiny(vocab=5, states=3, seed=4).em_step(pieces)
    assert chunked.log_likelihood == pytest.approx(whole.log_likelihood, rel=1e-12)
    for name in ("start", "trans", "emit"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name))


def test_gradient_of_the_likelihood_is_the_expected_counts():
    """Fisher's identity: d log p(x) / d logits of a softmax row = expected counts - row total x
    probabilities. The autograd gradient through the scaled forward pass equals what the
    E-step counts with forward-backward."""
    model = tiny(vocab=4, states=3, seed=11)
    ids = random_text(60, 4, seed=12).view(3, 20)
    stats = model.expected_counts(ids)
    model.filter(ids)[1].sum().backward()
    for part, counts in ((model.start, stats.start), (model.transition, stats.trans),
                         (model.emission, stats.emit)):  # fmt: skip
        probs = part.probs().detach()
        expected = counts - counts.sum(-1, keepdim=True) * probs
        torch.testing.assert_close(part.logits.grad, expected)


# -- decoding and sampling -------------------------------------------------------------------


def test_step_equals_forward_and_decoding_with_state_equals_recomputation():
    model = tiny(vocab=7, states=5, seed=13).float().eval()
    ids = random_text(22, 7, seed=14).view(2, 11)
    full = model(ids).logits
    state = model.new_state()
    parts = [model.step(ids[:, a:b], state) for a, b in ((0, 1), (1, 5), (5, 6), (6, 11))]
    torch.testing.assert_close(torch.cat(parts, 1), full)
    state.reorder(torch.tensor([1, 0]))
    torch.testing.assert_close(state.belief, model.filter(ids.flip(0))[0][:, -1])
    prompts = [[1, 2, 3], [4]]
    a, b = greedy_with_and_without_cache(model, prompts, 15)
    assert a == b and all(len(r) == 15 for r in a)


def test_sampling_states_follows_the_model():
    model = tiny(vocab=3, states=2, seed=15)
    gen = torch.Generator().manual_seed(0)
    n = 40_000
    states, tokens = model.sample(2, n=n, generator=gen)
    assert states.shape == tokens.shape == (n, 2)
    for pair in itertools.product(range(3), repeat=2):
        freq = float(((tokens[:, 0] == pair[0]) & (tokens[:, 1] == pair[1])).double().mean())
        p = math.exp(brute_force_log_prob(model, list(pair)))
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-3, (pair, freq, p)
    # after a prompt: the next token's frequencies are the LM's next-token distribution
    prompt = torch.tensor([[2, 0, 1]]).expand(n, -1)
    _, after = model.sample(1, n=n, prompt=prompt, generator=gen)
    expected = model(prompt[:1]).logits[0, -1].exp().detach()
    freq = torch.bincount(after[:, 0], minlength=3).double() / n
    assert (freq - expected).abs().max() < 0.012, (freq, expected)


# -- configuration ---------------------------------------------------------------------------


def test_config_errors_and_parameters():
    with pytest.raises(ConfigError, match="model.n_states"):
        HMMConfig(vocab_size=5, n_states=0)
    with pytest.raises(ConfigError, match="model.em_pseudocount"):
        HMMConfig(vocab_size=5, em_pseudocount=-1)
    model = HMMLM(HMMConfig(vocab_size=5, n_states=3))
    assert model.num_params() == 3 + 9 + 15 and model.num_params(non_embedding=True) == 12
    with pytest.raises(InputError, match="out of range"):
        model(torch.tensor([[5]]))
    with pytest.raises(InputError, match="transmat must have shape"):
        model.set_probs(torch.ones(3), torch.ones(2, 2), torch.ones(3, 5))
    assert registry.get("hmm").model is HMMLM


# -- command line ----------------------------------------------------------------------------


def test_fit_eval_generate_and_viterbi_from_the_command_line(cli, corpus, tmp_path):
    run = tmp_path / "hmm"
    r = cli("hmm", "fit", "--text", corpus, "--states", "6", "--iters", "4", "--block-size",
            "32", "--out", run, "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "done: 4 EM iterations" in r.out
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_losses = [x["loss"] for x in records if "loss" in x]
    assert len(train_losses) == 4  # EM: the likelihood never falls
    assert all(b <= a + 1e-6 for a, b in zip(train_losses, train_losses[1:]))

    r = cli("eval", "--checkpoint", run, "--json")
    assert r.code == 0 and json.loads(r.out)["bpc"] > 0
    r = cli("generate", "--checkpoint", run, "--prompt", "First", "--max-new-tokens", "20",
            "--seed", "1")  # fmt: skip
    assert r.code == 0 and r.out.startswith("First")

    r = cli("hmm", "viterbi", "--checkpoint", run, "Speak, speak.", "--json")
    assert r.code == 0, r.err
    got = json.loads(r.out)
    from attnlm.loading.checkpoint import load_checkpoint

    ck = load_checkpoint(run)
    log_prob, path = ck.model.viterbi(torch.tensor([got["ids"]]))
    assert got["states"] == path[0].tolist() and len(got["tokens"]) == 13
    assert got["log_prob"] == pytest.approx(float(log_prob[0]))
    r = cli("hmm", "viterbi", "--checkpoint", run, "Speak")
    assert r.code == 0 and "best path" in r.out

    # no attention: one line, no traceback
    r = cli("attention", "--checkpoint", run, "Speak", "--out", tmp_path / "a.png")
    assert r.code == 2 and r.err.strip().count("\n") == 0
    assert "hmm models return no attention weights" in r.err
    from attnlm.web.service import load_service
    from attnlm.web.service.limits import ServiceError, sampling_config

    service = load_service(run)
    with pytest.raises(ServiceError, match="hmm models return no attention weights"):
        service.attention("Speak")
    sampled = service.generate("Speak", sampling_config(max_new_tokens=5, seed=0))
    assert sampled["text"].startswith("Speak")


def test_gradient_training_and_em_through_attnlm_train(cli, corpus, tmp_path):
    common = ("--text", corpus, "--no-progress", "--set", "model.n_states=4",
              "--set", "model.block_size=16", "--eval-iters", "2")  # fmt: skip
    r = cli("train", "--preset", "hmm-char", "--out", tmp_path / "grad", "--max-iters", "3",
            *common)  # fmt: skip
    assert r.code == 0, r.err
    assert "bits/char" in r.out
    r = cli("train", "--preset", "hmm-char", "--out", tmp_path / "em", "--max-iters", "2",
            "--set", "hmm_em=true", *common)  # fmt: skip
    assert r.code == 0, r.err
    assert "done: 2 steps" in r.out


def test_command_line_errors_are_one_line(cli, corpus, tmp_path):
    r = cli("train", "--preset", "tiny-test", "--text", corpus, "--out", tmp_path / "g",
            "--max-iters", "1", "--set", "hmm_em=true", "--no-progress")  # fmt: skip
    assert r.code == 2 and "train.hmm_em needs a model fitted by EM" in r.err
    gpt = tmp_path / "g2"
    assert cli("train", "--preset", "tiny-test", "--text", corpus, "--out", gpt,
               "--max-iters", "1", "--no-progress").code == 0  # fmt: skip
    r = cli("hmm", "viterbi", "--checkpoint", gpt, "x")
    assert r.code == 2 and "has no hidden states" in r.err and r.err.count("\n") == 1
    r = cli("hmm", "fit", "--states", "0")
    assert r.code == 2 and "--states" in r.err


def test_models_and_params_list_the_family(cli):
    r = cli("models", "--json")
    family = next(f for f in json.loads(r.out)["families"] if f["type"] == "hmm")
    assert family["objective"] == "causal" and family["presets"] == ["hmm-char"]
    r = cli("params", "--preset", "hmm-char", "--vocab-size", "65")
    assert r.code == 0
    lines = {ln.split()[0]: ln.split()[-1] for ln in r.out.splitlines() if ln.strip()}
    assert lines["start"] == "128" and lines["transition"] == f"{128 * 128:,}"
    assert lines["emission"] == f"{128 * 65:,}"
