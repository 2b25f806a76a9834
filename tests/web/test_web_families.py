"""The explorer serves every model family: a tiny BERT (tokens with [CLS]/[SEP], attention,
fill-mask against :func:`attnlm.inspect.fill_mask.fill_mask` called directly), a tiny
transformer and a tiny RNN encoder-decoder (translation against ``attnlm translate`` /
:func:`attnlm.generate.translate.translate` called directly, cross-attention shapes), and the
one-line 400 answers for capabilities a model lacks and for bad input."""

from __future__ import annotations

import urllib.request

import pytest
import torch
from web_helpers import WORDS, post, request, serving, tiny_checkpoint

from attnlm.base.errors import InputError
from attnlm.cli import main
from attnlm.data.pairs import Pair, PairTokenizerConfig, train_pair_tokenizers
from attnlm.inspect.fill_mask import fill_mask
from attnlm.inspect.record import inspect
from attnlm.loading.checkpoint import load_checkpoint, save_checkpoint
from attnlm.models import registry
from attnlm.tokenizers import WordPieceTokenizer
from attnlm.web.service import load_service

PAIRS = [
    Pair("one two three", "eins zwei drei"),
    Pair("four five six", "vier fünf sechs"),
    Pair("the bank is closed", "die bank ist zu"),
]
SOURCE = "one two"
MASKED = "the central [MASK] raised interest rates"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _save(path, table, tokenizer, seed):
    """Build a model of ``table`` (random weights, scaled up for clear orders), save it."""
    torch.manual_seed(seed)
    model, cfg, family = registry.build(table)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    config = {"step": 0, "model": registry.config_table(family, cfg), "train": {}}
    save_checkpoint(path / "checkpoint", model, config, tokenizer, {"step": 0})
    return path


def tiny_bert(path):
    tok = WordPieceTokenizer.train(WORDS, vocab_size=80)
    table = dict(type="bert", vocab_size=tok.vocab_size, block_size=24, n_layer=2, n_head=2,
                 n_embd=16, dropout=0.0)  # fmt: skip
    return _save(path, table, tok, seed=0)


def _pair_ids(pairs):
    ids = pairs.target_ids
    return dict(vocab_size=ids.vocab_size, pad_id=ids.pad, bos_id=ids.bos, eos_id=ids.eos)


def tiny_transformer(path):
    pairs = train_pair_tokenizers(PAIRS, PairTokenizerConfig(kind="char"))
    table = dict(type="transformer", d_model=16, n_head=2, n_encoder_layers=1,
                 n_decoder_layers=2, d_ff=32, dropout=0.0, **_pair_ids(pairs))  # fmt: skip
    return _save(path, table, pairs, seed=1)


def tiny_rnn(path):
    pairs = train_pair_tokenizers(PAIRS, PairTokenizerConfig(kind="char"))
    table = dict(type="rnn-seq2seq", d_emb=8, d_hidden=16, max_target_len=20, **_pair_ids(pairs))
    return _save(path, table, pairs, seed=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("families")
    return {
        "bert": tiny_bert(base / "bert"),
        "mt": tiny_transformer(base / "mt"),
        "rnn": tiny_rnn(base / "rnn"),
        "gpt": tiny_checkpoint(base / "gpt", words=True),
    }


@pytest.fixture(scope="module")
def server(runs):
    services = [load_service(path, name=name) for name, path in runs.items()]
    yield from serving(services)


def assert_one_line_400(status, data, *words):
    assert status == 400 and set(data) == {"error"}, data
    msg = data["error"]
    assert "\n" not in msg and "Traceback" not in msg, msg
    for w in words:
        assert w in msg, msg


def assert_rows_sum_to_one(maps, queries, keys):
    for layer in maps:
        for head in layer:
            assert len(head) == queries and all(len(row) == keys for row in head)
            for row in head:
                assert abs(sum(row) - 1.0) < 1e-5 and min(row) >= 0.0


# -- info ------------------------------------------------------------------------------------


def test_info_capabilities_and_shapes(server):
    status, data = request(server.url + "api/models")
    assert status == 200
    info = {m["name"]: m for m in data["models"]}
    assert info["bert"]["family"] == "bert"
    assert info["bert"]["capabilities"] == ["embed", "fill-mask"]
    assert (info["bert"]["n_layer"], info["bert"]["n_head"]) == (2, 2)
    assert info["mt"]["family"] == "transformer" and info["mt"]["capabilities"] == ["translate"]
    assert (info["mt"]["n_layer"], info["mt"]["n_head"]) == (2, 2)
    assert info["rnn"]["family"] == "rnn-seq2seq" and info["rnn"]["capabilities"] == ["translate"]
    assert (info["rnn"]["n_layer"], info["rnn"]["n_head"]) == (1, 1)
    assert info["gpt"]["capabilities"] == ["generate"]
    assert all(isinstance(m["vocab_size"], int) for m in data["models"])


# -- BERT --------------------------------------------------------------------------------------


def test_bert_tokens_and_attention(server, runs):
    ck = load_checkpoint(runs["bert"])
    rec = inspect(ck.model.eval(), ck.tokenizer, MASKED)
    status, tokens = post(server, "tokens", {"text": MASKED, "model": "bert"})
    assert status == 200
    assert tokens["ids"] == rec.ids and tokens["tokens"] == rec.tokens
    assert tokens["tokens"][0] == "[CLS]" and tokens["tokens"][-1] == "[SEP]"
    assert "[MASK]" in tokens["tokens"]
    status, data = post(server, "attention", {"text": MASKED, "model": "bert"})
    assert status == 200 and set(data) == {"tokens", "attention"}
    T = len(rec.ids)
    assert data["tokens"] == rec.tokens and len(data["attention"]) == 2
    assert_rows_sum_to_one(data["attention"], T, T)
    got = torch.tensor(data["attention"])  # (L, H, T, T)
    assert torch.allclose(got, torch.stack(rec.attentions), atol=2e-6)
    # bidirectional: a query attends to later keys too
    assert float(got[:, :, 0, 1:].sum()) > 0.01


def test_bert_fill_mask_matches_the_shared_helper(server, runs):
    ck = load_checkpoint(runs["bert"])
    text = "the [MASK] bank closed . she sat on the [MASK]"
    ref = fill_mask(ck.model.eval(), ck.tokenizer, text, 4)
    status, data = post(server, "fill_mask", {"text": text, "model": "bert", "k": 4})
    assert status == 200 and data["k"] == 4 and data["text"] == text
    assert len(data["masks"]) == 2 == len(ref)
    for got, want in zip(data["masks"], ref):
        assert got["index"] == want.index
        assert [p["id"] for p in got["predictions"]] == want.ids
        assert [p["token"] for p in got["predictions"]] == want.tokens
        probs = [p["prob"] for p in got["predictions"]]
        assert probs == pytest.approx(want.probs, abs=1e-6)
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
    top = [m["predictions"][0]["token"].removeprefix("##") for m in data["masks"]]
    assert data["filled"] == f"the {top[0]} bank closed . she sat on the {top[1]}"
    status, default = post(server, "fill_mask", {"text": text, "model": "bert"})
    assert status == 200 and len(default["masks"][0]["predictions"]) == 5


def test_bert_fill_mask_bad_input(server):
    assert_one_line_400(*post(server, "fill_mask", {"text": "no mask", "model": "bert"}), "[MASK]")
    assert_one_line_400(*post(server, "fill_mask", {"text": "a [MASK]", "model": "bert", "k": 0}))
    assert_one_line_400(*post(server, "fill_mask", {"text": "", "model": "bert"}), "non-empty")
    status, data = post(server, "fill_mask", {"text": "bank " * 30 + "[MASK]", "model": "bert"})
    assert status == 413 and "window" in data["error"]
    assert_one_line_400(*post(server, "next_tokens", {"text": "a", "model": "bert"}), "generate")
    assert_one_line_400(*post(server, "translate", {"text": "a", "model": "bert"}), "translate")


# -- translation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mt", "rnn"])
def test_translate_matches_the_translate_command(server, runs, capsys, name):
    for text in (SOURCE, "four five"):  # one sentence per run: the length limit is per batch
        capsys.readouterr()
        assert main(["translate", "--checkpoint", str(runs[name]), text]) == 0
        (want,) = capsys.readouterr().out.splitlines()
        status, data = post(server, "translate", {"text": text, "model": name})
        assert status == 200 and data["source"] == text
        assert data["translation"] == want


@pytest.mark.parametrize("name", ["mt", "rnn"])
def test_translate_record_and_cross_attention(server, runs, name):
    from attnlm.generate.translate import translate_ids

    ck = load_checkpoint(runs[name])
    model, pairs = ck.model.eval(), ck.pair_tokenizers
    (ids,) = translate_ids(model, [pairs.encode_source(SOURCE)])
    status, data = post(server, "translate", {"text": SOURCE, "model": name})
    assert status == 200 and data["translation"] == pairs.decode_target(ids)
    assert set(data) == {"source", "translation", "tokens", "attention", "source_tokens",
                         "cross_attention"}  # fmt: skip
    rec = inspect(model, pairs, SOURCE, target=ids[1:])  # the model reading its output ids
    assert rec.ids == ids[1:] + ([] if ids[-1] == model.config.eos_id else [model.config.eos_id])
    assert data["tokens"] == rec.tokens and data["source_tokens"] == rec.source_tokens
    T, S_ = len(rec.tokens), len(rec.source_tokens)
    assert rec.source_ids == pairs.encode_source(SOURCE) and rec.source_tokens[-1] == "</s>"
    layers, heads = (2, 2) if name == "mt" else (1, 1)
    cross = torch.tensor(data["cross_attention"])
    assert tuple(cross.shape) == (layers, heads, T, S_)
    assert_rows_sum_to_one(data["cross_attention"], T, S_)
    assert torch.allclose(cross, torch.stack(rec.cross_attentions), atol=2e-6)
    if name == "mt":
        assert_rows_sum_to_one(data["attention"], T, T)
        assert torch.tensor(data["attention"]).shape == (layers, heads, T, T)
    else:
        assert data["attention"] == []  # the RNN decoder has no self-attention
    # /api/attention answers the same greedy record
    status, att = post(server, "attention", {"text": SOURCE, "model": name})
    assert status == 200 and att == data
    status, tokens = post(server, "tokens", {"text": SOURCE, "model": name})
    assert status == 200 and tokens == {"tokens": rec.source_tokens, "ids": rec.source_ids}


def test_translate_greedy_record_is_the_decoding_attention(server, runs):
    """Teacher-forcing the greedy translation gives the weights of greedy decoding itself
    (the model's own greedy inspection, where it stops at the same end token)."""
    ck = load_checkpoint(runs["mt"])
    own = inspect(ck.model.eval(), ck.pair_tokenizers, SOURCE)
    status, data = post(server, "translate", {"text": SOURCE, "model": "mt"})
    assert status == 200
    n = min(len(own.tokens), len(data["tokens"]))
    assert data["tokens"][: n - 1] == own.tokens[: n - 1]
    got = torch.tensor(data["cross_attention"])[:, :, : n - 1]
    assert torch.allclose(got, torch.stack(own.cross_attentions)[:, :, : n - 1], atol=2e-6)


@pytest.mark.parametrize("name", ["mt", "rnn"])
def test_translate_beams_match_the_translate_command(server, runs, capsys, name):
    from attnlm.generate import beam_search

    ck = load_checkpoint(runs[name])
    model, pairs = ck.model.eval(), ck.pair_tokenizers
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(runs[name]), "--beam", "3", SOURCE]) == 0
    (want,) = capsys.readouterr().out.splitlines()
    status, data = post(server, "translate", {"text": SOURCE, "model": name, "num_beams": 3})
    assert status == 200 and data["translation"] == want
    source = pairs.encode_source(SOURCE)
    (ids,) = beam_search(model, [source], 3, max_new_tokens=2 * len(source) + 10)
    assert data["translation"] == pairs.decode_target(ids)
    rec = inspect(model, pairs, SOURCE, target=ids[1:])  # the record of the beam's output
    assert data["tokens"] == rec.tokens
    body = {"text": SOURCE, "model": name}
    assert_one_line_400(*post(server, "translate", {**body, "num_beams": 0}), "num_beams")
    assert_one_line_400(*post(server, "translate", {**body, "num_beams": 17}), "num_beams")
    assert_one_line_400(*post(server, "translate", {**body, "num_beams": "3"}), "num_beams")
    bad = {**body, "num_beams": 2, "temperature": 1.0}
    assert_one_line_400(*post(server, "translate", bad), "beam search does not sample")


def test_translate_sampling_is_honoured(server, runs):
    from attnlm.generate.sampling import SamplingConfig
    from attnlm.generate.translate import translate

    ck = load_checkpoint(runs["mt"])
    body = {"text": SOURCE, "model": "mt", "temperature": 1.5, "seed": 3, "max_new_tokens": 6}
    status, data = post(server, "translate", body)
    assert status == 200
    cfg = SamplingConfig(temperature=1.5, seed=3)
    (want,) = translate(ck.model.eval(), ck.pair_tokenizers, [SOURCE], sampling=cfg,
                        max_new_tokens=6)  # fmt: skip
    assert data["translation"] == want
    assert post(server, "translate", body)[1] == data  # seeded: the same answer again
    assert len(data["tokens"]) <= 7
    assert_one_line_400(*post(server, "translate", {**body, "max_new_tokens": 0}))
    assert_one_line_400(*post(server, "translate", {**body, "temperature": -1}), "temperature")


def test_translation_bad_input_and_unsupported(server):
    status, data = post(server, "translate", {"text": "x" * 2001, "model": "mt"})
    assert status == 413 and "limit" in data["error"]
    assert_one_line_400(*post(server, "translate", {"text": "", "model": "rnn"}), "non-empty")
    assert_one_line_400(*post(server, "fill_mask", {"text": "[MASK]", "model": "mt"}), "fill-mask")
    assert_one_line_400(*post(server, "generate", {"text": "one", "model": "rnn"}), "generate")
    body = {"word": "one", "sentences": ["one two", "two one"], "model": "mt"}
    assert_one_line_400(*post(server, "embeddings", body), "translation")
    assert_one_line_400(*post(server, "translate", {"text": "one", "model": "gpt"}), "translate")
    assert_one_line_400(*post(server, "translate", {"text": "one", "model": "mt", "k": 3}), "k")


def test_page_offers_the_panels(server):
    """The page's script calls the fill-mask and translate endpoints and reads their answers'
    keys; the page has the panels' controls."""
    status, js = _get(server.url + "static/app.js")
    assert status == 200
    for needed in ('"fill_mask"', '"translate"', "r.masks", "m.predictions", "r.filled",
                   "r.translation", "r.cross_attention", "r.source_tokens"):  # fmt: skip
        assert needed in js, needed
    status, html = _get(server.url)
    assert status == 200
    for needed in ('id="fillmask"', 'id="fm-k"', 'id="translate"', 'id="t-temperature"'):
        assert needed in html, needed


def _get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def test_standalone_html_of_a_cross_attention_only_record(server, tmp_path):
    """The RNN encoder-decoder's record (no self-attention) exports as standalone HTML."""
    from attnlm.web.html import check_record, write_standalone

    status, data = post(server, "translate", {"text": SOURCE, "model": "rnn"})
    assert status == 200
    rec = {k: data[k] for k in ("tokens", "attention", "source_tokens", "cross_attention")}
    assert check_record(rec)["attention"] == []
    path = write_standalone(rec, tmp_path / "rnn.html", title="rnn")
    assert "cross_attention" in path.read_text(encoding="utf-8")
    with pytest.raises(InputError, match="non-empty"):
        check_record({"tokens": rec["tokens"], "attention": []})  # no attention at all
