"""Model families as plug-ins: the registry, the objective seam and the trainer, evaluation
from summed losses, the decoding-state protocol (reorder, cross-attention cache, beam search),
score modules, the inspection record and `attnlm attention`, and compiling without graph
breaks."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.cli import main
from attnlm.generate.options import DecodeOptions
from attnlm.models import from_hf, registry
from attnlm.models.base import Family, ModelOutput, token_loss
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.hf import gpt2 as hf_gpt2
from support import FIXTURES

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


# -- a toy family, registered in a few lines ---------------------------------------------------


@dataclass(frozen=True)
class ToyConfig:
    vocab_size: int
    block_size: int = 16
    d: int = 8


class ToyLM(nn.Module):
    """Each token predicts the next from its own embedding (a bigram model)."""

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.d)
        self.out = nn.Linear(config.d, config.vocab_size)

    def forward(self, ids, targets=None, return_attention=False, return_hidden=False):
        h = self.emb(ids)
        out = ModelOutput(logits=self.out(h), hidden_states=[h] if return_hidden else None)
        if targets is not None:
            out.loss, out.loss_sum, out.n_targets = token_loss(out.logits, targets)
        return out


@pytest.fixture
def toy_family():
    family = registry.register(Family(type="toy", config=ToyConfig, model=ToyLM))
    yield family
    registry.unregister("toy")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_toy_family_trains_evaluates_saves_and_reloads_through_the_cli(
    toy_family, corpus, tmp_path, capsys
):
    from attnlm.loading.checkpoint import load_checkpoint

    preset = tmp_path / "toy.toml"
    preset.write_text(
        '[model]\ntype = "toy"\nd = 8\n\n[train]\ntokenizer = "char"\nbatch_size = 4\n'
        "max_iters = 20\neval_interval = 10\neval_iters = 2\nwarmup_iters = 2\nlr = 0.01\n",
        encoding="utf-8",
    )
    out = tmp_path / "run"
    common = ["--no-progress", "--threads", "1"]
    assert main(["train", "--preset", str(preset), "--text", str(corpus), "--out", str(out),
                 *common]) == 0  # fmt: skip
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["model"]["type"] == "toy" and config["step"] == 20
    capsys.readouterr()

    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    ck = load_checkpoint(out)
    assert isinstance(ck.model, ToyLM) and ck.family is toy_family
    # evaluation from summed losses equals the mean cross-entropy computed here by hand
    val = np.fromfile(out / "val.bin", dtype=np.uint16).astype(np.int64)
    x, y = torch.from_numpy(val[:-1]), torch.from_numpy(val[1:])
    with torch.no_grad():
        nats = F.cross_entropy(ck.model.out(ck.model.emb(x)), y).item()
    assert result["loss"] == pytest.approx(nats, rel=1e-5)
    assert result["bits_per_token"] == pytest.approx(nats / math.log(2), rel=1e-5)

    assert main(["generate", "--checkpoint", str(out), "--prompt", "the ", "--max-new-tokens",
                 "5", "--temperature", "0"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("the ")
    assert main(["train", "--resume", str(out), "--max-iters", "30", *common]) == 0
    assert load_checkpoint(out).step == 30
    capsys.readouterr()
    assert main(["models", "--json"]) == 0
    types = [f["type"] for f in json.loads(capsys.readouterr().out)["families"]]
    assert "toy" in types and "gpt" in types


def test_models_command_lists_families_and_presets(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "gpt:" in text and "shakespeare-char" in text
    assert main(["models", "--json"]) == 0
    gpt = next(f for f in json.loads(capsys.readouterr().out)["families"] if f["type"] == "gpt")
    assert gpt["objective"] == "causal" and "generate" in gpt["capabilities"]
    assert "tiny-test" in gpt["presets"] and gpt["hf_model_types"] == ["gpt2"]


def test_missing_type_means_gpt_and_unknown_type_is_a_one_line_error(tmp_path, capsys):
    family, cfg = registry.make_config(
        {"vocab_size": 5, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 4}
    )
    assert family.type == "gpt" and isinstance(cfg, GPTConfig)
    with pytest.raises(ConfigError, match="unknown model.type 'nope'"):
        registry.get("nope")
    preset = tmp_path / "bad.toml"
    preset.write_text('[model]\ntype = "nope"\n', encoding="utf-8")
    assert main(["train", "--preset", str(preset), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model.type 'nope'" in err[0]


def test_old_checkpoints_without_a_type_still_load(tmp_path):
    from dataclasses import asdict

    from attnlm.loading.checkpoint import load_checkpoint, save_checkpoint
    from attnlm.tokenizers import CharTokenizer

    cfg = GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=4)
    config = {"model_type": "gpt", "step": 3, "model": asdict(cfg), "train": {}}  # v1 layout
    save_checkpoint(tmp_path / "checkpoint", GPT(cfg), config, CharTokenizer.train("abcde"), {})
    ck = load_checkpoint(tmp_path)
    assert isinstance(ck.model, GPT) and ck.family.type == "gpt" and ck.step == 3


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path):
    from dataclasses import asdict

    from attnlm.loading.checkpoint import load_checkpoint, save_checkpoint
    from attnlm.tokenizers import CharTokenizer

    cfg = GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, n_embd=4)
    config = {"step": 0, "model": {"type": "gpt", **asdict(cfg)}, "train": {}}
    save_checkpoint(tmp_path / "checkpoint", GPT(cfg), config, CharTokenizer.train("abcde"), {})
    with pytest.raises(InputError, match="tokenizer has 5 ids but the model only 3"):
        load_checkpoint(tmp_path)


def test_from_hf_dispatches_on_model_type(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=20, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    )
    hf.save_pretrained(tmp_path / "gpt2")
    assert isinstance(from_hf(tmp_path / "gpt2"), GPT)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "mamba"}')
    with pytest.raises(InputError, match="model_type 'mamba' is not supported"):
        from_hf(tmp_path / "other")


# -- objectives and the trainer ---------------------------------------------------------------


def test_causal_objective_is_the_shifted_window():
    from attnlm.data.windows import Windows
    from attnlm.loading.objectives import CausalLM

    ids = np.arange(50, dtype=np.int64) % 7
    source = CausalLM(model_config=GPTConfig(7, 8, 1, 1, 4)).source(ids, 1.0)
    gen1, gen2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    batch = source.sample(3, gen1)
    x, y = Windows(ids, 8).batch(Windows(ids, 8).sample_starts(3, gen2))
    assert torch.equal(batch["ids"], x) and torch.equal(batch["targets"], y)
    assert sum(b["targets"].numel() for b in source.sequential(4)) == len(ids) - 1


def test_masked_lm_masking_follows_bert():
    from attnlm.loading.objectives import MaskingConfig, mask_tokens
    from attnlm.models.base import IGNORE_INDEX

    torch.manual_seed(0)
    V, mask_id, specials = 100, 3, (0, 1, 2, 3)
    ids = torch.randint(4, V, (64, 512))
    ids[:, 0], ids[:, -1] = 1, 2  # [CLS] ... [SEP]: never chosen
    cfg = MaskingConfig(mask_id=mask_id, vocab_size=V, special_ids=specials)
    out = mask_tokens(ids, torch.rand(3, *ids.shape), cfg)
    chosen = out["targets"] != IGNORE_INDEX
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert torch.equal(out["targets"][chosen], ids[chosen])
    assert torch.equal(out["ids"][~chosen], ids[~chosen])  # only chosen positions change
    n = chosen.sum().item()
    assert n / ids[:, 1:-1].numel() == pytest.approx(0.15, abs=0.01)
    masked = (out["ids"][chosen] == mask_id).sum().item() / n
    same = (out["ids"][chosen] == ids[chosen]).sum().item() / n
    assert masked == pytest.approx(0.8, abs=0.02)
    assert same == pytest.approx(0.1 + 0.1 / V, abs=0.02)  # kept, or drawn equal by chance


def test_whole_word_masking_chooses_words_as_a_whole():
    from attnlm.loading.objectives import MaskingConfig, mask_tokens
    from attnlm.models.base import IGNORE_INDEX

    torch.manual_seed(1)
    ids = torch.randint(5, 50, (16, 64))
    starts = torch.rand(ids.shape) < 0.4  # about 2.5 pieces a word
    starts[:, 0] = True
    cfg = MaskingConfig(mask_id=4, vocab_size=50, whole_word=True, rate=0.3)
    chosen = mask_tokens(ids, torch.rand(3, *ids.shape), cfg, starts)["targets"] != IGNORE_INDEX
    word = starts.long().cumsum(1)  # word index of every piece
    for r in range(ids.shape[0]):
        for w in word[r].unique():
            picks = chosen[r][word[r] == w]
            assert picks.all() or not picks.any()
    assert chosen.any()


def test_seq2seq_batches_are_teacher_forced_and_padded():
    from attnlm.loading.objectives import SpecialIds, collate_pairs

    b = collate_pairs([([5, 6, 7], [8]), ([9], [10, 11, 12])], SpecialIds(pad=0, bos=1, eos=2))
    assert b["src"].tolist() == [[5, 6, 7], [9, 0, 0]]
    assert b["src_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert b["tgt_in"].tolist() == [[1, 8, 0, 0], [1, 10, 11, 12]]
    assert b["targets"].tolist() == [[8, 2, -100, -100], [10, 11, 12, 2]]


class ToySeq(nn.Module):
    """A decoder that ignores the source: enough to check the trainer's normalisation."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(20, 6)
        self.out = nn.Linear(6, 20)

    def forward(self, src, src_mask, tgt_in, targets):
        keep = src_mask[..., None].float()
        source = (self.emb(src) * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True)
        logits = self.out(self.emb(tgt_in) + source)  # padding-independent
        loss, loss_sum, n = token_loss(logits, targets)
        return ModelOutput(logits=logits, loss=loss, loss_sum=loss_sum, n_targets=n)


def _one_step(tmp_path, batch_size, grad_accum):
    from attnlm.loading.objectives import PairBatches, SpecialIds
    from attnlm.train.config import TrainConfig
    from attnlm.train.optim import make_optimizer
    from attnlm.train.trainer import Trainer, TrainJob

    rng = np.random.default_rng(0)
    pairs = [(rng.integers(3, 20, rng.integers(1, 6)).tolist(),
              rng.integers(3, 20, rng.integers(1, 9)).tolist()) for _ in range(40)]  # fmt: skip
    src = PairBatches(pairs, SpecialIds(0, 1, 2))
    model = ToySeq()
    cfg = TrainConfig(batch_size=batch_size, grad_accum=grad_accum, warmup_iters=0, lr=0.05)
    job = TrainJob(model, make_optimizer(model, cfg, "cpu"), cfg, src, src, tmp_path, {},
                   None, torch.device("cpu"), log=lambda *a: None)  # fmt: skip
    trainer = Trainer(job)
    loss = trainer._step(cfg.lr)
    return loss, [p.detach().clone() for p in model.parameters()]


def test_accumulating_variable_length_pairs_equals_one_big_batch(tmp_path):
    """Every target of a step weighs the same: 2 micro-batches of 4 pairs with different
    numbers of targets give the loss and update of one batch of the same 8 pairs."""
    big_loss, big = _one_step(tmp_path, 8, 1)
    acc_loss, acc = _one_step(tmp_path, 4, 2)
    assert acc_loss == pytest.approx(big_loss, rel=1e-6)
    for a, b in zip(acc, big):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_evaluation_reports_bits_per_token_and_no_bpc_for_masked_lm():
    from attnlm.loading.evaluation import evaluate
    from attnlm.loading.objectives import MaskedWindows, MaskingConfig

    class Uniform(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))

        def forward(self, ids, targets):
            logits = torch.zeros(*ids.shape, 10) + self.w
            loss, loss_sum, n = token_loss(logits, targets)
            return ModelOutput(logits=logits, loss=loss, loss_sum=loss_sum, n_targets=n)

    ids = np.random.default_rng(0).integers(1, 10, 400)
    source = MaskedWindows(ids, 16, MaskingConfig(mask_id=0, vocab_size=10))
    r = evaluate(Uniform(), source, batch_size=4)
    assert r.loss == pytest.approx(math.log(10)) and r.bits_per_token == pytest.approx(
        math.log2(10)
    )
    assert r.bpc is None and r.tokens > 0


# -- decoding state --------------------------------------------------------------------------


def tiny_gpt(**kw):
    torch.manual_seed(0)
    base = dict(vocab_size=13, block_size=32, n_layer=2, n_head=2, n_embd=16, positions="rope")
    return GPT(GPTConfig(**{**base, **kw})).eval()


def test_sampling_config_validates_and_is_used_by_decode():
    from attnlm.generate import SamplingConfig, decode

    for bad in [dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=0),
                dict(top_p=1.5), dict(max_new_tokens=-1), dict(max_new_tokens=10**12),
                dict(seed=-1)]:  # fmt: skip
        with pytest.raises(ConfigError):
            SamplingConfig(**bad)
    model = tiny_gpt()
    s = SamplingConfig(temperature=0.9, top_k=5, max_new_tokens=6, seed=3)
    a = decode(model, [[1, 2, 3]], sampling=s)
    assert a == decode(model, [[1, 2, 3]], sampling=s) and len(a[0]) == 6  # seeded
    assert decode(model, [[1, 2, 3]], sampling=s.with_(max_new_tokens=2))[0] == a[0][:2]


def test_reordered_cache_equals_recomputing_the_reordered_rows():
    model = tiny_gpt()
    prompts = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    state = model.new_state()
    model.step(prompts, state)
    order = torch.tensor([2, 0, 0, 1])
    state.reorder(order)
    nxt = torch.tensor([[3], [4], [5], [6]])
    stepped = model.step(nxt, state)[:, -1]
    full = model(torch.cat([prompts[order], nxt], dim=1)).logits[:, -1]
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)


def test_decode_stops_rows_at_the_end_token():
    from attnlm.generate import SamplingConfig, decode

    model = tiny_gpt()
    free = decode(model, [[1, 2], [3, 4, 5]], SamplingConfig(temperature=0, max_new_tokens=12))
    eos = free[0][3]  # a token row 0 produces
    stopped = decode(
        model, [[1, 2], [3, 4, 5]], SamplingConfig(temperature=0, max_new_tokens=12), eos_id=eos
    )
    assert stopped[0] == free[0][: free[0].index(eos) + 1]
    row1 = free[1][: free[1].index(eos) + 1] if eos in free[1] else free[1]
    assert stopped[1] == row1


def test_beam_search_equals_transformers_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    from attnlm.generate import beam_search

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=3, pad_token_id=3)  # fmt: skip
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        hf.transformer.wte.weight.mul_(8)  # peaked distributions: hypotheses end early
    hf.save_pretrained(tmp_path)
    ours = hf_gpt2.load(tmp_path).double()
    hf = hf.double()
    prompts = [[5, 6, 7], [9, 1, 2]]
    from attnlm.generate import SamplingConfig, decode

    eos = decode(
        ours,
        prompts[:1],
        SamplingConfig(temperature=0, max_new_tokens=3),
        DecodeOptions(lookahead=0),
    )[0][2]
    ended_early = 0
    for k, lp, es in itertools.product([1, 2, 4], [1.0, 0.0, 2.0], [False, True, "never"]):
        with torch.no_grad():
            ref = hf.generate(torch.tensor(prompts), num_beams=k, length_penalty=lp,
                              early_stopping=es, max_new_tokens=12, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)  # fmt: skip
        mine = beam_search(ours, prompts, k, lp, es, 12, eos_id=eos)
        for r, p in enumerate(prompts):
            expected = ref[r, len(p) :].tolist()
            if eos in expected:
                expected = expected[: expected.index(eos) + 1]
                ended_early += len(expected) < 12
            assert mine[r] == expected, (k, lp, es, r)
    assert ended_early > 5  # the end-token paths were exercised


def test_one_beam_is_greedy_decoding():
    from attnlm.generate import SamplingConfig, beam_search, decode

    model = tiny_gpt()
    greedy = decode(
        model,
        [[1, 2, 3]],
        SamplingConfig(temperature=0, max_new_tokens=8),
        DecodeOptions(lookahead=0),
        eos_id=4,
    )
    assert beam_search(model, [[1, 2, 3]], 1, max_new_tokens=8, eos_id=4) == greedy


def test_cross_attention_keys_are_computed_once_per_source():
    from attnlm.nn.attention import KVCache, MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, cross=True, d_context=6).eval()
    calls = []
    attn.kv_proj.register_forward_hook(lambda *a: calls.append(1))
    context = torch.randn(2, 5, 6)
    cache = KVCache(1)
    xs = [torch.randn(2, 1, 8) for _ in range(3)]
    stepped = [attn(x, context if i == 0 else None, cache=cache)[0] for i, x in enumerate(xs)]
    assert len(calls) == 1
    for x, y in zip(xs, stepped):
        torch.testing.assert_close(y, attn(x, context)[0])
    cache.reorder(torch.tensor([1, 1]))
    torch.testing.assert_close(
        attn(xs[0], cache=cache)[0], attn(xs[0], context[[1, 1]])[0]
    )  # the reordered cache follows the rows


def test_cross_attention_returns_its_weights():
    from attnlm.models.transformer import TransformerConfig, transformer_block
    from attnlm.nn.attention import padding_mask

    config = TransformerConfig(vocab_size=5, d_model=8, n_head=2, norm="pre")
    block = transformer_block(config, cross=True).eval()
    keep = torch.tensor([[True, True, True, False]])
    _, self_w, cross_w = block(
        torch.randn(1, 3, 8), is_causal=True, context=torch.randn(1, 4, 8),
        context_mask=padding_mask(keep), need_weights=True,
    )  # fmt: skip
    assert self_w.shape == (1, 2, 3, 3) and cross_w.shape == (1, 2, 3, 4)
    torch.testing.assert_close(cross_w.sum(-1), torch.ones(1, 2, 3))
    assert (cross_w[..., 3] == 0).all()  # the padded source position gets no attention


# -- scores ---------------------------------------------------------------------------------


def test_scores_with_queries_and_keys_of_different_widths():
    from attnlm.nn.attention import AdditiveScore, BilinearScore, attend, make_score

    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 6), torch.randn(2, 5, 10)  # decoder state 6, encoder states 10
    additive = make_score("bahdanau", 6, 10, d_hidden=4)
    assert isinstance(additive, AdditiveScore) and isinstance(make_score("concat", 6, 10),
                                                              AdditiveScore)  # fmt: skip
    assert isinstance(make_score("general", 6, 10), BilinearScore)
    s = additive(q, k)
    assert s.shape == (2, 3, 5)
    w1, w2 = additive.w1.weight, additive.w2.weight  # (4, 16), (1, 4)
    by_hand = (w2 @ torch.tanh(w1 @ torch.cat([q[1, 2], k[1, 4]])))[0]  # w2ᵀ tanh(W1 [q; k])
    torch.testing.assert_close(s[1, 2, 4], by_hand)
    bil = make_score("general", 6, 10)
    torch.testing.assert_close(bil(q, k)[0, 1, 2], q[0, 1] @ bil.weight @ k[0, 2])
    out, weights = attend(s, None, k)  # a recurrent decoder's context vectors
    assert out.shape == (2, 3, 10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    with pytest.raises(ConfigError, match="one width"):
        make_score("dot", 6, 10)


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "bilinear", "additive"])
def test_every_score_plugs_into_multi_head_attention(score):
    from attnlm.nn.attention import MultiHeadAttention

    attn = MultiHeadAttention(8, 2, score=score).eval()
    y, w = attn(torch.randn(2, 4, 8), is_causal=True, need_weights=True)
    assert y.shape == (2, 4, 8) and w.shape == (2, 2, 4, 4)
    assert torch.all(w.triu(1) == 0)


# -- inspection ------------------------------------------------------------------------------


def test_inspection_record_of_a_gpt():
    from attnlm.inspect import inspect
    from attnlm.tokenizers import CharTokenizer

    tok = CharTokenizer.train("abcdefgh ")
    model = tiny_gpt(vocab_size=tok.vocab_size)
    rec = inspect(model, tok, "bad cafe")
    assert rec.family == "gpt" and rec.tokens == list("bad cafe") and rec.n_layers == 2
    assert rec.attentions[0].shape == (2, 8, 8) and len(rec.hidden_states) == 3
    torch.testing.assert_close(rec.attentions[1].sum(-1), torch.ones(2, 8))
    data = rec.to_json()
    assert len(data["attention"]) == 2 and len(data["attention"][0][1][7]) == 8
    with pytest.raises(InputError, match="no cross attention"):
        rec.maps("cross")


def test_attention_command_draws_the_grid_and_one_head(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny-test", "--text", str(corpus), "--out", str(out),
                 "--max-iters", "2", "--no-progress", "--threads", "1"]) == 0  # fmt: skip
    grid, one = tmp_path / "grid.png", tmp_path / "one.png"
    assert main(["attention", "--checkpoint", str(out), "the fox", "--out",
                 str(grid)]) == 0  # fmt: skip
    assert main(["attention", "--checkpoint", str(out), "the fox", "--out", str(one),
                 "--layer", "1", "--head", "0"]) == 0  # fmt: skip
    assert grid.read_bytes()[:4] == b"\x89PNG" and one.read_bytes()[:4] == b"\x89PNG"
    assert "2 layer(s) x 2 head(s)" in capsys.readouterr().out
    page = tmp_path / "views.html"
    assert main(["attention", "--checkpoint", str(out), "the fox", "--html",
                 str(page)]) == 0  # fmt: skip
    html = page.read_text(encoding="utf-8")
    assert '"attention"' in html and "<script src=" not in html  # one offline file
    assert main(["attention", "--checkpoint", str(out), "x", "--out", str(one),
                 "--layer", "7"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--layer 7 is out of range" in err[0]


# -- torch.compile ----------------------------------------------------------------------------

# A tiny [model] table per built-in family: a new family adds one, and the compile test covers it.
TINY = {
    "gpt": {"vocab_size": 11, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8},
    "transformer": {
        "vocab_size": 11,
        "d_model": 8,
        "n_head": 2,
        "n_encoder_layers": 1,
        "n_decoder_layers": 1,
        "dropout": 0.0,
    },  # fmt: skip
    "ffnn": {"vocab_size": 11, "order": 3, "n_embd": 4, "n_hidden": 8, "direct": True},
    "rnn": {"vocab_size": 11, "n_layer": 2, "n_embd": 8, "n_hidden": 8, "cell": "lstm"},
    "rnn-seq2seq": {"vocab_size": 11, "d_emb": 8, "d_hidden": 8},
    "bert": {"vocab_size": 11, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8},
    "llama": {
        "vocab_size": 11,
        "block_size": 16,
        "n_layer": 2,
        "n_head": 4,
        "n_kv_head": 2,
        "n_embd": 16,
        "d_ff": 24,
    },
    "hmm": {"vocab_size": 11, "n_states": 4, "block_size": 8},
}


def tiny_batch(family):
    from attnlm.loading.objectives import SpecialIds, collate_pairs

    g = torch.Generator().manual_seed(0)
    if family.objective == "seq2seq":
        pairs = [([4, 5, 6], [7, 8]), ([9], [4, 5, 6])]
        return collate_pairs(pairs, SpecialIds(0, 1, 2))
    ids = torch.randint(4, 11, (2, 8), generator=g)
    return {"ids": ids, "targets": ids}


@pytest.mark.parametrize("type_name", sorted(registry.BUILTIN))
def test_training_forward_compiles_without_graph_breaks(type_name):
    assert type_name in TINY, f"add a tiny [model] table for {type_name!r} to TINY"
    model, _, family = registry.build({"type": type_name, **TINY[type_name]})
    explained = torch._dynamo.explain(model)(**tiny_batch(family))
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_recurrent_layers_compile_and_equal_torch_rnn_modules(cell):
    """The rnn family's layer: no graph break under compile, and its fused (eager) and
    cell-loop (compiled) paths both equal nn.RNN/nn.LSTM/nn.GRU with the same weights."""
    model, _, _ = registry.build({"type": "rnn", **TINY["rnn"], "cell": cell})
    ids = torch.randint(0, 11, (3, 6))
    assert torch._dynamo.explain(model)(ids=ids, targets=ids).graph_break_count == 0
    layer = model.layers[0]
    ref = {"rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](8, 8)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(6, 3, 8)
    h = torch.randn(1, 3, 8)
    for h0 in (None, (h, torch.randn(1, 3, 8)) if cell == "lstm" else h):
        want, want_h = ref(x, h0)
        zeros = torch.zeros(1, 3, 8)
        start = h0 if h0 is not None else ((zeros, zeros) if cell == "lstm" else zeros)
        for got, got_h in (layer(x, h0), layer._cell_loop(x, start)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
            leaves = torch.utils._pytree.tree_leaves
            for a, b in zip(leaves(got_h), leaves(want_h), strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_compiled_masked_lm_loss_equals_eager():
    """BERT's compiled path (head at every position) gives the eager loss (head at the
    masked positions only)."""
    from attnlm.models import bert

    model, _, _ = registry.build({"type": "bert", **TINY["bert"], "dropout": 0.0})
    ids = torch.randint(5, 11, (2, 8))
    targets = torch.full_like(ids, -100)
    targets[0, 2], targets[1, 5], targets[1, 6] = 7, 8, 9
    eager = model(ids=ids, targets=targets)
    compiled = torch.compile(model, backend="eager")(ids=ids, targets=targets)
    assert int(compiled.n_targets) == int(eager.n_targets) == 3
    torch.testing.assert_close(compiled.loss_sum, eager.loss_sum, atol=1e-5, rtol=1e-5)
    assert isinstance(model, bert.Bert)


def test_learned_positions_compile_without_graph_breaks():
    model = tiny_gpt(positions="learned")
    ids = torch.randint(0, 13, (2, 8))
    assert torch._dynamo.explain(model)(ids=ids, targets=ids).graph_break_count == 0


def test_fixtures_live_in_the_repository():
    here = FIXTURES / "ngram"
    assert (here / "README.md").is_file() and (here / "kenlm_o3.arpa.gz").is_file()
