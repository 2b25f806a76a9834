"""BERT tasks: masking statistics, masked-LM training/eval/resume through the shared trainer,
``load_model_ref``, ``fill-mask`` against ``transformers``, ``embed`` against the
sentence-transformers recipe (computed here with ``transformers.BertModel``), ``contextual``
(BERT and GPT) and ``attention`` for a sentence pair."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.cli import main
from attnlm.loading.objectives import MaskedLM, MaskingConfig, mask_tokens, word_start_table
from attnlm.tokenizers import WordPieceTokenizer
from support import FIXTURES, torchrun, train

transformers = pytest.importorskip("transformers")

VOCAB = FIXTURES / "bert-base-uncased-vocab.txt"

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 12


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# -- masking ---------------------------------------------------------------------------------


def test_masking_statistics_and_specials():
    g = torch.Generator().manual_seed(0)
    V, specials = 1000, (0, 1, 2, 3)
    ids = torch.randint(0, V, (64, 512), generator=g)
    cfg = MaskingConfig(mask_id=3, vocab_size=V, special_ids=specials)
    out = mask_tokens(ids, torch.rand(3, *ids.shape, generator=g), cfg)
    is_special = torch.isin(ids, torch.tensor(specials))
    chosen = out["targets"] != -100
    assert not (chosen & is_special).any()  # specials are never chosen
    assert torch.equal(out["ids"][is_special], ids[is_special])  # nor changed
    assert torch.equal(out["ids"][~chosen], ids[~chosen])  # unchosen tokens stay
    assert torch.equal(out["targets"][chosen], ids[chosen])
    n_maskable = int((~is_special).sum())
    rate = int(chosen.sum()) / n_maskable
    assert abs(rate - 0.15) < 0.005  # 32,512 maskable tokens: sd of the rate ~0.002
    new = out["ids"][chosen]
    orig = ids[chosen]
    masked = (new == 3).float().mean().item()
    kept = (new == orig).float().mean().item()  # includes random picks that hit the same id
    assert abs(masked - 0.8) < 0.02
    assert abs(kept - 0.1) < 0.015
    assert abs((1 - masked - kept) - 0.1) < 0.015


def test_whole_word_masking_chooses_whole_words():
    tok = WordPieceTokenizer.from_vocab_file(VOCAB)
    ids = torch.tensor([tok.encode("unaffable tokenization embeddings " * 40)])
    start = torch.from_numpy(word_start_table(tok))[ids]
    assert not bool(start.all())  # there are continuation pieces
    cfg = MaskingConfig(tok.mask_id, tok.vocab_size, (tok.pad_id,), whole_word=True)
    g = torch.Generator().manual_seed(1)
    out = mask_tokens(ids, torch.rand(3, *ids.shape, generator=g), cfg, start)
    chosen = (out["targets"] != -100)[0]
    word = torch.cumsum(start[0].long(), 0)  # word index of each piece
    for w in word.unique():
        picks = chosen[word == w]
        assert bool(picks.all()) or not bool(picks.any())  # all pieces of a word or none
    assert 0 < int(chosen.sum()) < ids.shape[1]
    with pytest.raises(ConfigError, match="whole-word"):
        word_start_table(object())


def test_masked_objective_needs_a_mask_token():
    with pytest.raises(ConfigError, match=r"\[MASK\]"):
        MaskedLM(tokenizer=object())


# -- training through the shared trainer -----------------------------------------------------

SMALL = [
    *("--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.n_head=2"),
    *("--set", "model.d_ff=64", "--set", "model.block_size=32", "--set", "bpe_vocab_size=120"),
    *("--set", "log_interval=5", "--set", "warmup_iters=2", "--lr", "3e-3"),
    *("--batch-size", "8", "--eval-interval", "10", "--eval-iters", "2"),
]


@pytest.mark.slow
def test_bert_mini_trains_evaluates_and_resumes(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--preset", "bert-mini", "--text", str(corpus), "--out", str(out)]
    assert main(argv + SMALL + ["--max-iters", "20", "--no-progress"]) == 0
    cfg = json.loads((out / "checkpoint" / "config.json").read_text())
    assert cfg["model"]["type"] == "bert" and cfg["train"]["tokenizer"] == "wordpiece"
    assert json.loads((out / "tokenizer.json").read_text())["kind"] == "wordpiece"
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0]
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bpc"] is None and 0 <= res["accuracy"] <= 1 and res["loss"] > 0
    # resume continues the same run
    assert main(["train", "--resume", str(out), "--max-iters", "30", "--no-progress"]) == 0
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == 30
    # fill-mask on the trained checkpoint
    capsys.readouterr()
    assert main(["fill-mask", "--checkpoint", str(out), "speak, [MASK].", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got["masks"]) == 1 and len(got["masks"][0]["predictions"]) == 5


# -- Hugging Face folders as models ----------------------------------------------------------


def hf_config(**kw):
    base = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, attn_implementation="eager")  # fmt: skip
    base.update(kw)
    return transformers.BertConfig(**base)


def spread(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory):
    """A random ``BertForMaskedLM`` folder with the bert-base-uncased vocabulary."""
    path = tmp_path_factory.mktemp("mlm")
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(hf_config()).eval()
    spread(model)  # weights far from the N(0, 0.02) init: clear top-k orders
    model.save_pretrained(path)
    (path / "vocab.txt").write_bytes(VOCAB.read_bytes())
    return path


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("enc")
    torch.manual_seed(1)
    model = transformers.BertModel(hf_config()).eval()
    spread(model)
    model.save_pretrained(path)
    (path / "vocab.txt").write_bytes(VOCAB.read_bytes())
    return path


def test_load_model_ref(mlm_folder):
    from attnlm.loading.sources import load_model_ref

    ck = load_model_ref(model=str(mlm_folder))
    assert ck.family.type == "bert" and ck.tokenizer.kind == "wordpiece"
    assert load_model_ref(checkpoint=mlm_folder).family.type == "bert"  # a HF folder there too
    with pytest.raises(InputError, match="exactly one"):
        load_model_ref()
    with pytest.raises(InputError, match="exactly one"):
        load_model_ref(checkpoint="a", model="b")
    with pytest.raises(InputError, match="unknown model 'nosuch'"):
        load_model_ref(model="nosuch")


def test_fill_mask_matches_transformers(mlm_folder, capsys):
    text = "the capital of france is [MASK]. it is a [MASK] city."
    assert main(["fill-mask", "--model", str(mlm_folder), text, "--top-k", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    hf = transformers.BertForMaskedLM.from_pretrained(mlm_folder).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(str(mlm_folder))
    enc = hf_tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = hf(**enc).logits[0]
    where = (enc["input_ids"][0] == hf_tok.mask_token_id).nonzero().flatten().tolist()
    assert [m["index"] for m in got["masks"]] == where
    for m, pos in zip(got["masks"], where):
        probs = torch.softmax(logits[pos], -1)
        top = probs.topk(3)
        assert [p["id"] for p in m["predictions"]] == top.indices.tolist()
        assert [p["token"] for p in m["predictions"]] == hf_tok.convert_ids_to_tokens(top.indices)
        for p, ref in zip(m["predictions"], top.values.tolist()):
            assert p["prob"] == pytest.approx(ref, abs=1e-5)
    assert main(["fill-mask", "--model", str(mlm_folder), "no mask here"]) == 2
    assert "no [MASK]" in capsys.readouterr().err


def test_fill_mask_refuses_an_encoder_without_head(encoder_folder, capsys):
    assert main(["fill-mask", "--model", str(encoder_folder), "a [MASK] b"]) == 2
    err = capsys.readouterr().err
    assert "no masked-LM head" in err and err.count("\n") == 1


def st_reference(folder: Path, sentences: list[str], max_length: int = 256) -> torch.Tensor:
    """sentence-transformers' documented pipeline for all-MiniLM-L6-v2, written out: the
    tokenizer with truncation at max_seq_length and padding, BertModel, mean pooling over
    the attention mask, L2 normalisation; returns the cosine matrix."""
    tok = transformers.BertTokenizerFast.from_pretrained(folder)
    model = transformers.BertModel.from_pretrained(folder).eval()
    enc = tok(sentences, padding=True, truncation=True, max_length=max_length,
              return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        last = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    emb = (last * m).sum(1) / m.sum(1).clamp(min=1e-9)
    emb = torch.nn.functional.normalize(emb, p=2, dim=1)
    return emb @ emb.T


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse, and " + "very long " * 150 + "text.",  # > 256 tokens: truncated
]


def test_embed_matches_sentence_transformers_recipe(encoder_folder, capsys):
    folder = encoder_folder
    assert main(["embed", "--model", str(folder), *SENTENCES[:3], "--json"]) == 0
    got = torch.tensor(json.loads(capsys.readouterr().out)["cosine"])
    ref = st_reference(folder, SENTENCES[:3], max_length=64)  # the model has 64 positions
    assert (got - ref).abs().max() < 1e-4
    assert main(["embed", "--model", str(folder), *SENTENCES[:2]]) == 0
    assert "cosine" in capsys.readouterr().out


def st_package_cosine(folder: Path, sentences: list[str], monkeypatch) -> torch.Tensor:
    """The cosine matrix from the sentence-transformers package itself (offline: the folder
    is local and the hub is switched off)."""
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = st.SentenceTransformer(str(folder), device="cpu")
    emb = model.encode(sentences, convert_to_tensor=True, normalize_embeddings=True)
    return (emb @ emb.T).float()


def test_embed_matches_the_sentence_transformers_package(encoder_folder, capsys, monkeypatch):
    """A folder without sentence-transformers configs: the package builds mean pooling over
    the encoder (its default) and truncates at the model window, as `attnlm embed` does."""
    assert main(["embed", "--model", str(encoder_folder), *SENTENCES[:3], "--json"]) == 0
    got = torch.tensor(json.loads(capsys.readouterr().out)["cosine"])
    ref = st_package_cosine(encoder_folder, SENTENCES[:3], monkeypatch)
    assert (got - ref).abs().max() < 1e-4


@pytest.mark.slow
def test_embed_minilm_matches_the_sentence_transformers_package(capsys, monkeypatch):
    folder = _minilm()
    assert main(["embed", "--model", "minilm", *SENTENCES, "--json"]) == 0
    got = torch.tensor(json.loads(capsys.readouterr().out)["cosine"])
    ref = st_package_cosine(folder, SENTENCES, monkeypatch)
    assert (got - ref).abs().max() < 1e-4


def _minilm():
    from attnlm.data.pretrained import pretrained_path

    try:
        return pretrained_path("minilm")
    except InputError as e:
        pytest.skip(f"MiniLM wheel not available offline: {e}")


@pytest.mark.slow
def test_embed_minilm_matches_sentence_transformers_recipe(capsys):
    folder = _minilm()
    assert main(["embed", "--model", "minilm", *SENTENCES, "--json"]) == 0
    got = torch.tensor(json.loads(capsys.readouterr().out)["cosine"])
    ref = st_reference(folder, SENTENCES, max_length=256)
    assert (got - ref).abs().max() < 1e-4
    assert got[0, 1] > got[0, 2]  # related sentences are closer


def test_contextual_bert_against_transformers_hidden_states(encoder_folder, tmp_path, capsys):
    sents = ["we sat on the bank of the river.", "the bank raised interest rates."]
    png = tmp_path / "bank.png"
    argv = ["contextual", "--model", str(encoder_folder), "--word", "bank", *sents]
    assert main(argv + ["--out", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert png.is_file() and png.stat().st_size > 0
    assert got["word"] == "bank" and got["left_context_only"] is False
    hf = transformers.BertModel.from_pretrained(encoder_folder).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(str(encoder_folder))
    vecs = []
    for s in sents:
        enc = tok(s, return_tensors="pt")
        pos = tok.convert_ids_to_tokens(enc["input_ids"][0]).index("bank")
        with torch.no_grad():
            hs = hf(**enc, output_hidden_states=True).hidden_states
        vecs.append([h[0, pos] for h in hs])
    assert len(got["layers"]) == len(vecs[0]) == 3
    for layer, row in enumerate(got["layers"]):
        a, b = vecs[0][layer], vecs[1][layer]
        ref = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        assert row["cosine"][0][1] == pytest.approx(ref, abs=1e-5)
    assert main(argv[:-1] + ["no such word here"]) == 2
    assert "does not contain the word 'bank'" in capsys.readouterr().err
    # a word split into pieces is pooled as the mean of its pieces
    assert main(["contextual", "--model", str(encoder_folder), "--word", "unaffable",
                 "an unaffable man.", "the unaffable clerk."]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "una ##ffa ##ble" in out and "mean of its pieces" in out


def test_contextual_gpt_checkpoint_left_context(tmp_path, capsys):
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry
    from attnlm.tokenizers import CharTokenizer

    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .")
    table = {"type": "gpt", "vocab_size": tok.vocab_size, "block_size": 32, "n_layer": 2,
             "n_head": 2, "n_embd": 16}  # fmt: skip
    torch.manual_seed(0)
    model, cfg, fam = registry.build(table)
    save_checkpoint(tmp_path / "ck", model, {"model": registry.config_table(fam, cfg),
                                             "train": {}}, tok, {})  # fmt: skip
    # config.json needs the format marker written by save_checkpoint; load through the CLI
    argv = ["contextual", "--checkpoint", str(tmp_path / "ck"), "--word", "bank",
            "the bank.", "a river bank."]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "left context only" in out
    assert main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["left_context_only"] is True and len(got["layers"]) == 3
    # each of the word's characters is a piece: the vector is the mean of 4
    assert got["pieces"][0] == ["b", "a", "n", "k"]


def test_attention_on_a_bert_sentence_pair(encoder_folder, tmp_path, capsys):
    from attnlm.inspect.record import inspect
    from attnlm.loading.sources import load_model_ref

    ck = load_model_ref(model=str(encoder_folder))
    text = "the animal didn't cross the street [SEP] because it was too tired."
    rec = inspect(ck.model, ck.tokenizer, text)
    assert rec.tokens[0] == "[CLS]" and rec.tokens.count("[SEP]") == 2
    assert rec.n_layers == 2 and rec.attentions[0].shape[0] == 4
    hf = transformers.BertModel.from_pretrained(encoder_folder).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(str(encoder_folder))
    enc = tok("the animal didn't cross the street", "because it was too tired.",
              return_tensors="pt")  # fmt: skip
    assert rec.ids == enc["input_ids"][0].tolist()
    with torch.no_grad():
        ref = hf(**enc, output_attentions=True).attentions
    for a, b in zip(rec.attentions, ref):
        assert (a - b[0]).abs().max() < 1e-5
    png = tmp_path / "att.png"
    argv = ["attention", "--model", str(encoder_folder), text, "--out", str(png)]
    assert main(argv + ["--layer", "1", "--head", "0"]) == 0
    assert png.is_file()
    assert main(["attention", "--model", "nosuch", "x", "--out", str(png)]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_masked_eval_counts_only_masked_positions():
    """evaluate() on a masked source: loss and accuracy over the chosen positions only."""
    from attnlm.loading.evaluation import evaluate
    from attnlm.loading.objectives import MaskedWindows
    from attnlm.models.bert import Bert, BertConfig

    torch.manual_seed(0)
    model = Bert(BertConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16,
                            dropout=0.0)).eval()  # fmt: skip
    ids = np.random.default_rng(0).integers(4, 50, 400)
    src = MaskedWindows(ids, 16, MaskingConfig(3, 50, (0, 1, 2)))
    res = evaluate(model, src, batch_size=8)
    nats = correct = n = 0
    for b in src.sequential(8):
        with torch.no_grad():
            logits = model(b["ids"]).logits  # full (B, T, V) logits
        keep = b["targets"] != -100
        lp = torch.log_softmax(logits[keep], -1)
        nats -= float(lp.gather(1, b["targets"][keep][:, None]).sum())
        correct += int((logits[keep].argmax(-1) == b["targets"][keep]).sum())
        n += int(keep.sum())
    assert res.tokens == n and res.bpc is None
    assert res.loss == pytest.approx(nats / n, rel=1e-5)
    assert res.accuracy == pytest.approx(correct / n)


def test_eval_with_model_ref(mlm_folder, encoder_folder, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    argv = ["eval", "--model", str(mlm_folder), "--text", str(corpus), "--json"]
    assert main(argv + ["--max-tokens", "300", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bpc"] is None and res["accuracy"] is not None and res["tokens"] > 0
    argv = ["eval", "--model", str(encoder_folder), "--text", str(corpus), "--device", "cpu"]
    assert main(argv) == 2
    assert "no masked-LM head" in capsys.readouterr().err


@pytest.mark.slow
def test_masked_lm_ddp_two_processes_match_one(tmp_path):
    """torchrun, 2 CPU processes: the masked-LM losses equal 1 process with twice the batch
    (the masking noise is drawn once for all ranks; steps are normalised by all targets)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    common = ["--preset", "bert-mini", "--text", str(corpus), "--max-iters", "8"]
    common += [*SMALL, "--set", "model.dropout=0.0", "--set", "log_interval=1"]
    one, two = tmp_path / "one", tmp_path / "two"
    proc = train([*common, "--batch-size", "8", "--out", str(one)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = torchrun([*common, "--batch-size", "4", "--out", str(two)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes" in proc.stdout

    def curve(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    a, b = curve(one), curve(two)
    assert sorted(a) == sorted(b) and len(a) == 8
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
