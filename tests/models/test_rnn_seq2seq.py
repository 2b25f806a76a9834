"""The RNN encoder-decoder (``type = "rnn-seq2seq"``): attention weights checked by hand,
teacher forcing against step-by-step decoding, the decoders, training through the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.loading.objectives import SpecialIds, collate_pairs
from attnlm.models import registry
from attnlm.models.base import token_loss
from attnlm.models.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig

IDS = SpecialIds(pad=0, bos=1, eos=2)

# every cell x attention x score x input feeding combination worth telling apart
VARIANTS = [
    dict(cell="gru", attention="bahdanau", score="additive"),
    dict(cell="lstm", attention="bahdanau", score="general"),
    dict(cell="gru", attention="luong", score="dot"),
    dict(cell="lstm", attention="luong", score="general"),
    dict(cell="gru", attention="luong", score="concat", input_feeding=True),
    dict(cell="lstm", attention="luong", score="dot", input_feeding=True),
]


def small(seed: int = 0, **kw) -> RNNSeq2Seq:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=23, src_vocab_size=17, d_emb=8, d_hidden=12, n_layer=2, **kw)
    return RNNSeq2Seq(RNNSeq2SeqConfig(**cfg)).eval()


PAIRS = [
    ([3, 4, 5, 6, 7, 2], [8, 9, 10]),
    ([5, 6, 2], [11, 12, 13, 14, 15]),
    ([9, 10, 11, 12, 2], [16, 2 + 15, 18, 19]),
]


# ---------------------------------------------------------------------------------------------
# registry and config


def test_registry_entry_and_preset():
    from attnlm.base.config import load_preset

    family = registry.get("rnn-seq2seq")
    assert family.model is RNNSeq2Seq and family.objective == "seq2seq"
    assert family.capabilities == frozenset({"translate"})
    table = load_preset("dates-rnn")["model"]
    assert table["type"] == "rnn-seq2seq" and table["attention"] == "bahdanau"
    full = registry.complete_table(
        table, vocab_size=40, src_vocab_size=30, pad_id=37, bos_id=38, eos_id=39
    )
    model, config, fam = registry.build(full)
    assert fam is family and config.src_vocab_size == 30 and config.eos_id == 39
    assert model.src_emb.num_embeddings == 30 and model.lm_head.out_features == 40
    assert "bahdanau" in family.describe(config)
    assert registry.family_of(model) is family
    # what a checkpoint stores rebuilds the same model
    again, config2, _ = registry.build(registry.config_table(family, config))
    assert config2 == config
    again.load_state_dict(model.state_dict())


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(cell="rnn"), "model.cell"),
        (dict(attention="soft"), "model.attention"),
        (dict(score="cosine"), "model.score"),
        (dict(attention="luong", score="dot", d_enc=4, d_hidden=12), "model.score"),
        (dict(input_feeding=True), "model.input_feeding"),
        (dict(eos_id=23), "model.eos_id"),
        (dict(d_hidden=13), "model.d_hidden"),
        (dict(dropout=1.0), "model.dropout"),
        (dict(n_layer=0), "model.n_layer"),
    ],
)
def test_config_errors_name_the_field(fields, field):
    with pytest.raises(ConfigError, match=field):
        RNNSeq2SeqConfig(**{"vocab_size": 23, "d_hidden": 12, **fields})


def test_default_scores_follow_the_papers():
    assert RNNSeq2SeqConfig(vocab_size=5).score == "additive"
    assert RNNSeq2SeqConfig(vocab_size=5, attention="luong").score == "general"


# ---------------------------------------------------------------------------------------------
# attention weights computed by hand

# A tiny model whose GRUs are "memoryless": update gate z ~ 0 (bias -50) and no recurrent
# weights, so a GRU's output is tanh(W_in x). Then every encoder annotation and every decoder
# state is a chosen 2-vector (embedding rows are atanh of the vector wanted) and the
# attention weights follow from the score formulas alone.
KEYS = {3: (0.5, -0.2), 4: (-0.3, 0.6), 5: (0.1, 0.1), 6: (0.8, 0.4)}  # source token -> h_j
QUERIES = {1: (0.6, 0.2), 7: (-0.4, 0.9), 8: (0.2, -0.5)}  # target token -> decoder state
S0 = (0.3, -0.7)  # Bahdanau's initial decoder state (the bridge's output)
W_GENERAL = ((1.5, -1.0), (0.5, 2.0))
W1_ADDITIVE, W2_ADDITIVE = (1.0, -0.5, 2.0, 1.5), 3.0  # score = 3 tanh(q·(1,-.5) + k·(2,1.5))
SRC = [[3, 4, 5, 6], [6, 3]]
TGT_IN = [[1, 7, 8], [1, 8, 7]]


def hand_score(name: str, q, k) -> float:
    if name == "dot":
        return q[0] * k[0] + q[1] * k[1]
    if name == "general":  # qᵀ W k
        wk = [W_GENERAL[i][0] * k[0] + W_GENERAL[i][1] * k[1] for i in range(2)]
        return q[0] * wk[0] + q[1] * wk[1]
    a = W1_ADDITIVE  # additive / concat: w2 tanh(W1 [q; k])
    return W2_ADDITIVE * math.tanh(a[0] * q[0] + a[1] * q[1] + a[2] * k[0] + a[3] * k[1])


def hand_weights(name: str, q, source: list[int], width: int) -> list[float]:
    e = [math.exp(hand_score(name, q, KEYS[t])) for t in source]
    return [x / sum(e) for x in e] + [0.0] * (width - len(source))


def memoryless(gru: torch.nn.GRUCell, picks: list[list[float]]) -> None:
    """GRU cell whose output is tanh(picks @ x): z gate closed, no recurrent weights."""
    H = gru.hidden_size
    for p in gru.parameters():
        p.zero_()
    gru.weight_ih[2 * H :, : len(picks[0])] = torch.tensor(picks)  # the candidate n reads x
    gru.bias_hh[H : 2 * H] = -50.0  # z = sigmoid(-50): the new state is the candidate


def hand_model(attention: str, score: str, input_feeding: bool = False) -> RNNSeq2Seq:
    cfg = RNNSeq2SeqConfig(
        vocab_size=9, attention=attention, score=score, input_feeding=input_feeding,
        d_emb=2, d_hidden=2, d_enc=1, d_attn=1,
    )  # fmt: skip
    m = RNNSeq2Seq(cfg).eval()
    with torch.no_grad():
        for tok, k in KEYS.items():
            m.src_emb.weight[tok] = torch.atanh(torch.tensor(k))
        for tok, q in QUERIES.items():
            m.tgt_emb.weight[tok] = torch.atanh(torch.tensor(q))
        memoryless(m.enc_fwd[0].cells[0], [[1.0, 0.0]])  # forward: h_j[0] = tanh(e_j[0])
        memoryless(m.enc_bwd[0].cells[0], [[0.0, 1.0]])  # backward: h_j[1] = tanh(e_j[1])
        memoryless(m.decoder.cells[0], [[1.0, 0.0], [0.0, 1.0]])  # s_i = tanh(E y_{i-1})
        m.bridge.weight.zero_()
        m.bridge.bias.copy_(torch.atanh(torch.tensor(S0)))
        if score == "general":
            m.score.weight.copy_(torch.tensor(W_GENERAL))
        elif score in ("additive", "concat"):
            m.score.w1.weight.copy_(torch.tensor([W1_ADDITIVE]))
            m.score.w2.weight.fill_(W2_ADDITIVE)
    return m


@pytest.mark.parametrize(
    "attention, score, feeding",
    [
        ("bahdanau", "additive", False),
        ("luong", "dot", False),
        ("luong", "general", False),
        ("luong", "concat", False),
        ("luong", "general", True),
    ],
)
def test_attention_weights_by_hand(attention, score, feeding):
    m = hand_model(attention, score, feeding)
    batch = m.source_batch(SRC)
    out = m(**batch, tgt_in=torch.tensor(TGT_IN), return_attention=True)
    (weights,) = out.cross_attentions
    assert weights.shape == (2, 1, 3, 4)
    for b in range(2):
        for t in range(3):
            if attention == "bahdanau":  # e_ij = a(s_{i-1}, h_j): the state before step i
                q = S0 if t == 0 else QUERIES[TGT_IN[b][t - 1]]
            else:  # Luong: score(h_t, h_s) with the state after reading y_{t-1}
                q = QUERIES[TGT_IN[b][t]]
            want = torch.tensor(hand_weights(score, q, SRC[b], 4))
            torch.testing.assert_close(weights[b, 0, t], want, atol=1e-6, rtol=0)
    if attention == "luong" and score == "dot":
        # one by hand on paper: q = (0.6, 0.2) over keys (0.8, 0.4), (0.5, -0.2):
        # scores 0.56 and 0.26, weights 1 / (1 + e^-0.3) = 0.574443 and 0.425557
        torch.testing.assert_close(
            weights[1, 0, 0], torch.tensor([0.574443, 0.425557, 0.0, 0.0]), atol=1e-6, rtol=0
        )


def test_contexts_and_luong_attentional_state_by_hand():
    """h̃_t = tanh(W_c [c_t; h_t]) with c_t = Σ α_tj h_j (Luong et al. 2015, eq. 5)."""
    m = hand_model("luong", "dot")
    with torch.no_grad():
        m.combine.weight.copy_(torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, -1.0, 0.0, 2.0]]))
    out = m(**m.source_batch(SRC[:1]), tgt_in=torch.tensor([[7]]), return_hidden=True)
    q = QUERIES[7]
    a = hand_weights("dot", q, SRC[0], 4)
    c = [sum(a[j] * KEYS[t][i] for j, t in enumerate(SRC[0])) for i in range(2)]
    want = [math.tanh(c[0] + 0.5 * q[0]), math.tanh(-c[1] + 2.0 * q[1])]
    torch.testing.assert_close(out.hidden_states[0][0, 0], torch.tensor(want), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# teacher forcing = step-by-step decoding; padding does not leak


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
@torch.no_grad()
def test_teacher_forcing_equals_step_by_step(variant):
    m = small(**variant)
    batch = collate_pairs(PAIRS, IDS)
    out = m(**batch, return_attention=True)
    T = batch["tgt_in"].shape[1]
    state = m.new_state({"src": batch["src"], "src_mask": batch["src_mask"]})
    stepped = torch.cat([m.step(batch["tgt_in"][:, t : t + 1], state) for t in range(T)], 1)
    torch.testing.assert_close(stepped, out.logits, atol=1e-5, rtol=1e-5)
    assert state.length == T
    loss, loss_sum, n = token_loss(stepped, batch["targets"])
    torch.testing.assert_close(out.loss_sum, loss_sum, atol=1e-4, rtol=1e-5)
    assert int(out.n_targets) == int(n) == sum(len(t) + 1 for _, t in PAIRS)
    # every row alone gives the same logits as inside the padded batch
    for r, pair in enumerate(PAIRS):
        alone = m(**collate_pairs([pair], IDS), return_attention=True)
        L = len(pair[1]) + 1
        torch.testing.assert_close(alone.logits[0], out.logits[r, :L], atol=1e-5, rtol=1e-5)
        w = out.cross_attentions[0][r, 0, :L]
        torch.testing.assert_close(w[:, : len(pair[0])], alone.cross_attentions[0][0, 0])
        assert float(w[:, len(pair[0]) :].abs().sum()) == 0.0  # padding gets no weight
        torch.testing.assert_close(w.sum(-1), torch.ones(L))


def test_bad_inputs_are_input_errors():
    m = small()
    batch = collate_pairs(PAIRS, IDS)
    with pytest.raises(InputError, match="right-padded"):
        m(**{**batch, "src_mask": batch["src_mask"].flip(1)})
    with pytest.raises(InputError, match="at least one token"):
        m(**{**batch, "src_mask": torch.zeros_like(batch["src_mask"])})
    with pytest.raises(InputError, match="out of range"):
        m(**{**batch, "tgt_in": batch["tgt_in"] + 100})
    with pytest.raises(InputError, match="source batch"):
        m.new_state(None)
    # source padding may hold any id (collate_pairs pads with the target's pad id, which a
    # separate source vocabulary may not have); only real source tokens are checked
    wide = {**batch, "src": batch["src"].masked_fill(~batch["src_mask"], 22)}
    torch.testing.assert_close(m(**wide).logits, m(**batch).logits)
    with pytest.raises(InputError, match="out of range"):
        m(**{**batch, "src": batch["src"].masked_fill(batch["src_mask"], 22)})


# ---------------------------------------------------------------------------------------------
# decoders


@pytest.mark.parametrize("variant", VARIANTS[:1] + VARIANTS[4:5], ids=["bahdanau", "luong-feed"])
def test_greedy_and_beam_decoding_batched(variant):
    from attnlm.generate import SamplingConfig, beam_search, decode
    from attnlm.generate.translate import translate_ids

    m = small(seed=3, **variant)
    sources = [s for s, _ in PAIRS]
    setup = m.prepare_decoding(sources)
    assert setup.prompts == [[1]] * 3 and setup.eos_id == 2 and setup.keep_prompt

    def greedy(srcs):
        s = m.prepare_decoding(srcs)
        return decode(
            m,
            s.prompts,
            SamplingConfig(temperature=0, max_new_tokens=12),
            eos_id=s.eos_id,
            state_batch=s.state_batch,
        )

    batched = greedy(sources)
    assert batched == [greedy([s])[0] for s in sources]  # batch = one at a time
    assert [[1, *g] for g in batched] == translate_ids(m, sources, max_new_tokens=12)
    beam1 = beam_search(m, sources, num_beams=1, early_stopping=True, max_new_tokens=12)
    assert beam1 == [[1, *g] for g in batched]  # k = 1 is greedy
    beam4 = beam_search(m, sources, num_beams=4, max_new_tokens=12)
    assert beam4 == [beam_search(m, [s], num_beams=4, max_new_tokens=12)[0] for s in sources]
    # the beam's hypothesis scores at least as well as greedy under the model
    for src, g, b in zip(sources, beam1, beam4):
        assert sequence_logprob(m, src, b) >= sequence_logprob(m, src, g) - 1e-5


@torch.no_grad()
def sequence_logprob(m: RNNSeq2Seq, src: list[int], hyp: list[int]) -> float:
    """Sum of log-probabilities of ``hyp[1:]`` (``hyp[0]`` is bos), normalised by length
    as beam search ranks finished hypotheses (length_penalty 1)."""
    batch = m.source_batch([src])
    logits = m(**batch, tgt_in=torch.tensor([hyp[:-1]])).logits[0]
    logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(hyp[1:])[:, None]).sum()
    return float(logp) / (len(hyp) - 1)


@pytest.mark.parametrize("variant", [VARIANTS[1], VARIANTS[5]], ids=["lstm-bahdanau", "lstm-feed"])
def test_reordered_state_equals_recomputation(variant):
    m = small(seed=5, **variant)
    batch = m.source_batch([s for s, _ in PAIRS])
    prefix = torch.tensor([[1, 8, 9], [1, 11, 12], [1, 16, 17]])
    state = m.new_state(batch)
    m.step(prefix, state)
    order = torch.tensor([2, 0, 2, 1])
    state.reorder(order)
    nxt = torch.tensor([[4], [5], [6], [7]])
    got = m.step(nxt, state)  # (4, 1, V)
    fresh = m.new_state({k: v[order] for k, v in batch.items()})
    want = m.step(torch.cat([prefix[order], nxt], 1), fresh)[:, -1:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# inspection


def test_inspect_record_with_pair_and_plain_tokenizers(tmp_path):
    from attnlm.data.pairs import Pair, PairTokenizerConfig, train_pair_tokenizers
    from attnlm.inspect.heatmap import plot_attention_panels
    from attnlm.inspect.record import inspect
    from attnlm.tokenizers import CharTokenizer

    pairs = [Pair("March 3", "3. März"), Pair("May 21", "21. Mai")]
    toks = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="char", shared=False))
    tid = toks.target_ids
    torch.manual_seed(0)
    m = RNNSeq2Seq(RNNSeq2SeqConfig(
        vocab_size=tid.vocab_size, src_vocab_size=toks.source_ids.vocab_size,
        pad_id=tid.pad, bos_id=tid.bos, eos_id=tid.eos, d_emb=8, d_hidden=8, max_target_len=6,
    ))  # fmt: skip
    rec = inspect(m, toks, "May 3", target="3. Mai")
    assert rec.family == "rnn-seq2seq"
    assert rec.source_tokens == ["M", "a", "y", " ", "3", "</s>"]
    assert rec.tokens == ["3", ".", " ", "M", "a", "i", "</s>"]
    (cross,) = rec.cross_attentions
    assert cross.shape == (1, 7, 6)
    torch.testing.assert_close(cross.sum(-1), torch.ones(1, 7))
    queries, keys = rec.maps("cross")[1:]
    png = plot_attention_panels([[("cross", cross[0])]], queries, keys, tmp_path / "a.png")
    assert png.stat().st_size > 0
    translated = inspect(m, toks, "May 3")  # no target: greedy translation, at most 6 tokens
    assert 1 <= len(translated.tokens) <= 6
    assert translated.cross_attentions[0].shape == (1, len(translated.tokens), 6)
    # one plain tokenizer for both sides: the source gets the model's eos appended
    plain = CharTokenizer.train("May 3. Mai", unk=True)
    V = plain.vocab_size
    m2 = RNNSeq2Seq(RNNSeq2SeqConfig(vocab_size=V + 3, pad_id=V, bos_id=V + 1, eos_id=V + 2))
    rec2 = inspect(m2, plain, "May", target="Mai")
    assert rec2.source_tokens == ["M", "a", "y", "</s>"] and rec2.tokens[-1] == "</s>"


# ---------------------------------------------------------------------------------------------
# training through the trainer


def _trainer(tmp_path, model, train, val, tokenizer, optimizer=None, **cfg):
    from attnlm.train.config import TrainConfig
    from attnlm.train.optim import make_optimizer
    from attnlm.train.trainer import Trainer, TrainJob

    tc = TrainConfig(**{"eval_iters": 2, "warmup_iters": 0, "progress": False, **cfg})
    job = TrainJob(
        model=model,
        optimizer=optimizer or make_optimizer(model, tc, "cpu"),
        config=tc,
        train=train,
        val=val,
        run_dir=tmp_path,
        checkpoint_config={"model": registry.config_table(registry.family_of(model), model.config)},
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        log=lambda *a: None,
    )
    return Trainer(job)


class _Capture(torch.optim.SGD):
    """SGD that records the gradients it is asked to apply (and applies nothing)."""

    def __init__(self, params):
        self.params_list = list(params)
        super().__init__(self.params_list, lr=0.0)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for p in self.params_list])


def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    from attnlm.loading.objectives import make_objective
    from attnlm.train.trainer import MetricsLog

    # pairs of very different lengths: micro-batches pad differently from the full batch
    g = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(40):
        s, t = (
            int(torch.randint(1, 12, (1,), generator=g)),
            int(torch.randint(0, 9, (1,), generator=g)),
        )
        pairs.append((torch.randint(3, 17, (s,), generator=g).tolist() + [2],
                      torch.randint(3, 23, (t,), generator=g).tolist()))  # fmt: skip
    grads = []
    for accum, bs in ((1, 8), (2, 4), (4, 2)):
        m = small(seed=7, **VARIANTS[0]).train()
        source = make_objective("seq2seq", None, m.config).source(pairs)
        opt = _Capture(m.parameters())
        tr = _trainer(tmp_path / f"a{accum}", m, source, source, _Tok(), opt,
                      batch_size=bs, grad_accum=accum, max_iters=1, grad_clip=0.0)  # fmt: skip
        tr.fit(MetricsLog(tmp_path / f"m{accum}.jsonl", True, None))
        grads.append(opt.grads[0])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


class _Tok:
    vocab_size = 23

    def save(self, path):
        from pathlib import Path

        Path(path).write_text("{}")


@pytest.mark.slow
def test_training_on_the_builtin_task_learns(tmp_path, monkeypatch):
    from attnlm.data.pairs import (
        PairTokenizerConfig,
        encode_pairs,
        split_pairs,
        train_pair_tokenizers,
    )
    from attnlm.data.tasks import builtin_pairs
    from attnlm.loading.evaluation import estimate
    from attnlm.loading.objectives import make_objective
    from attnlm.train.trainer import MetricsLog

    torch.set_num_threads(1)
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path / "cache"))
    splits = split_pairs(builtin_pairs(n=1000), valid=0.1, test=0.1, seed=0)
    # the objective adds bos / eos to targets itself
    tok_config = PairTokenizerConfig(kind="char", target_bos=False, target_eos=False)
    toks = train_pair_tokenizers(splits.train, tok_config)
    tid = toks.target_ids
    table = registry.complete_table(
        {"type": "rnn-seq2seq", "d_emb": 32, "d_hidden": 64},
        vocab_size=tid.vocab_size, src_vocab_size=toks.source_ids.vocab_size,
        pad_id=tid.pad, bos_id=tid.bos, eos_id=tid.eos,
    )  # fmt: skip
    torch.manual_seed(0)
    model, config, family = registry.build(table)
    obj = make_objective(family.objective, toks, config)
    train, val = (
        obj.source(list(zip(e.source, e.target)))
        for e in (encode_pairs(splits.train, toks), encode_pairs(splits.valid, toks))
    )
    start = estimate(model, val, 4, 32).loss
    tr = _trainer(tmp_path / "run", model, train, val, toks, batch_size=32, max_iters=80,
                  lr=1e-2, min_lr=1e-3, weight_decay=0.0, eval_interval=1000)  # fmt: skip
    result = tr.fit(MetricsLog(tmp_path / "m.jsonl", True, None))
    end = estimate(model, val, 4, 32).loss
    print(f"validation loss {start:.3f} -> {end:.3f}")
    assert result.step == 80
    assert end < 0.5 * start, (start, end)


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "general", "additive"])
def test_prepared_keys_give_the_same_scores(name):
    from attnlm.nn.attention import make_score

    torch.manual_seed(0)
    d_k = 6 if name in ("general", "additive") else 4
    score = make_score(name, 4, d_k, 5)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 7, d_k)
    direct = {
        "dot": lambda: q @ k.transpose(1, 2),
        "scaled_dot": lambda: q @ k.transpose(1, 2) / 2.0,
        "general": lambda: torch.einsum("btq,qk,bsk->bts", q, score.weight, k),
        "additive": lambda: score.w2(
            torch.tanh(
                score.w1(
                    torch.cat(
                        [q[:, :, None].expand(2, 3, 7, 4), k[:, None].expand(2, 3, 7, d_k)], -1
                    )
                )
            )
        )[..., 0],  # w2ᵀ tanh(W1 [q; k]) with the concatenation built
    }[name]()
    torch.testing.assert_close(score.prepared(q, score.prepare_keys(k)), direct)
    torch.testing.assert_close(score(q, k), direct)


@pytest.mark.slow  # 10-20 s of tracing on the shared CPUs
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[5]], ids=["gru-bahdanau", "lstm-feed"])
def test_training_forward_compiles_without_graph_breaks(variant):
    m = small(**variant).train()
    explained = torch._dynamo.explain(m)(**collate_pairs(PAIRS[:2], IDS))
    assert explained.graph_break_count == 0, explained.break_reasons
