"""Sequence-to-sequence through the ordinary commands: ``attnlm train --pairs`` (pair data
prepared in the run folder, pair tokenizers in the checkpoint, resume), ``attnlm translate``,
``attnlm eval`` (BLEU/chrF checked against sacrebleu called directly) and ``attnlm attention``
(cross-attention heatmaps), on a tiny transformer and a small synthetic pairs file."""

from __future__ import annotations

import io
import json
import random

import pytest

from attnlm.cli import main

TINY = [
    "--preset", "dates-transformer",
    "--set", "model.d_model=16", "--set", "model.n_head=2", "--set", "model.d_ff=32",
    "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
    "--batch-size", "8", "--eval-interval", "3", "--eval-iters", "2", "--threads", "1",
    "--no-progress",
]  # fmt: skip

WORDS = ["one", "two", "three", "four", "five", "six"]
GERMAN = {"one": "eins", "two": "zwei", "three": "drei", "four": "vier", "five": "fünf",
          "six": "sechs"}  # fmt: skip


def _pairs_file(path, n=120):
    rng = random.Random(0)
    lines = ["english\tgerman"]  # a header line, as Tatoeba exports have
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
        lines.append(" ".join(words) + "\t" + " ".join(GERMAN[w] for w in reversed(words)))
    path.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s2s")
    pairs = _pairs_file(tmp / "pairs.tsv")
    out = tmp / "run"
    assert main(["train", *TINY, "--pairs", str(pairs), "--out", str(out), "--max-iters", "6"]) == 0
    return out, pairs


def test_train_stores_pairs_and_tokenizers(run):
    from attnlm.loading.checkpoint import load_checkpoint

    out, _ = run
    for name in ("train.tsv", "valid.tsv", "test.tsv", "tokenizer.json", "pair_tokenizers.json"):
        assert (out / "pairs" / name).is_file(), name
    ck = load_checkpoint(out)
    assert ck.family.type == "transformer" and ck.step == 6
    assert ck.pair_tokenizers is not None and ck.pair_tokenizers.shared
    assert (ck.path / "pair_tokenizers.json").is_file()
    ids = ck.pair_tokenizers.target_ids
    c = ck.model_config
    assert (c.pad_id, c.bos_id, c.eos_id, c.vocab_size) == (ids.pad, ids.bos, ids.eos,
                                                            ids.vocab_size)  # fmt: skip


def test_resume_continues_the_run(run, capsys):
    out, pairs = run
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--max-iters", "9", "--no-progress"]) == 0
    log = capsys.readouterr().out
    assert "resuming" in log and "from step 6" in log and "9 steps" in log
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        steps = [json.loads(line).get("step") for line in f]
    assert max(s for s in steps if s is not None) == 9


def test_translate_command(run, capsys, monkeypatch):
    out, _ = run
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), "one two", "three"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("one two\n\nfour\r\n"))
    assert main(["translate", "--checkpoint", str(out), "--beam", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # the blank line is skipped
    assert main(["translate", "--checkpoint", str(out), "--temperature", "0.8", "--seed",
                 "1", "five"]) == 0  # fmt: skip
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--beam", "0", "x"], "--beam"),
        (["--beam", "2", "--temperature", "1", "x"], "sample"),
        ([], "nothing to translate"),
    ],  # fmt: skip
)
def test_translate_bad_input_is_one_line(run, capsys, monkeypatch, extra, message):
    out, _ = run
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_eval_scores_match_sacrebleu(run, capsys):
    import sacrebleu

    from attnlm.data.pairs import group_references, read_pairs
    from attnlm.generate.translate import translate
    from attnlm.loading.checkpoint import load_checkpoint

    out, _ = run
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    test, _ = read_pairs(out / "pairs" / "test.tsv", header=False)
    sources, refs = group_references(test)
    ck = load_checkpoint(out)
    hyps = translate(ck.model, ck.pair_tokenizers, sources)
    width = max(map(len, refs))
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, streams).score)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, streams).score)
    assert got["sentences"] == len(sources) and got["loss"] > 0
    assert main(["eval", "--checkpoint", str(out), "--beam", "2"]) == 0
    text = capsys.readouterr().out
    assert "BLEU:" in text and "chrF:" in text


def test_eval_other_pairs_file_and_errors(run, tmp_path, capsys):
    out, pairs = run
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out), "--pairs", str(pairs), "--json"]) == 0
    assert "every pair of" in json.loads(capsys.readouterr().out)["data"]
    assert main(["eval", "--checkpoint", str(out), "--pairs", str(pairs), "--split", "test",
                 "--json"]) == 0  # fmt: skip
    assert "test split of" in json.loads(capsys.readouterr().out)["data"]
    assert main(["eval", "--checkpoint", str(out), "--pairs", str(tmp_path / "nope.tsv")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(out), "--text", str(pairs)]) == 2
    assert "--pairs" in capsys.readouterr().err


@pytest.mark.slow  # matplotlib
def test_attention_plots_cross_attention_per_layer_and_head(run, tmp_path, capsys):
    from attnlm.inspect.record import inspect
    from attnlm.loading.checkpoint import load_checkpoint

    out, _ = run
    png = tmp_path / "align.png"
    capsys.readouterr()
    assert main(["attention", "--checkpoint", str(out), "one two three",
                 "--out", str(png)]) == 0  # fmt: skip
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "1 layer(s) x 2 head(s), cross" in capsys.readouterr().out
    one = tmp_path / "one.png"
    assert main(["attention", "--checkpoint", str(out), "one two",
                 "zwei eins", "--layer", "0", "--head", "1", "--out", str(one)]) == 0  # fmt: skip
    ck = load_checkpoint(out)
    rec = inspect(ck.model, ck.pair_tokenizers, "one two", target="zwei eins")
    assert rec.source_tokens[-1] == "</s>" and len(rec.source_tokens) == len("one two") + 1
    assert rec.tokens[-1] == "</s>" and len(rec.tokens) == len("zwei eins") + 1
    for m in rec.cross_attentions:  # (H, T, S), rows are distributions over the source
        assert m.shape == (2, len(rec.tokens), len(rec.source_tokens))
        assert m.sum(-1).sub(1).abs().max() < 1e-5


def test_separate_vocabularies(tmp_path, capsys):
    from attnlm.loading.checkpoint import load_checkpoint

    pairs = _pairs_file(tmp_path / "p.tsv", 60)
    out = tmp_path / "sep"
    args = ["train", *TINY, "--pairs", str(pairs), "--out", str(out), "--max-iters", "2"]
    args += ["--set", "train.shared_vocab=false", "--set", "model.share_embeddings=false"]
    assert main(args) == 0
    ck = load_checkpoint(out)
    assert not ck.pair_tokenizers.shared
    assert (ck.path / "source_tokenizer.json").is_file()
    assert ck.model_config.src_vocab_size is not None
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), "--beam", "2", "six five"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_other_tokenizer_kinds_through_the_commands(tmp_path, capsys, kind):
    from attnlm.loading.checkpoint import load_checkpoint

    pairs = _pairs_file(tmp_path / "p.tsv", 60)
    out = tmp_path / kind
    args = ["train", *TINY, "--pairs", str(pairs), "--out", str(out), "--max-iters", "2"]
    args += ["--set", f"train.tokenizer={kind}", "--set", "train.bpe_vocab_size=280"]
    assert main(args) == 0
    tok = load_checkpoint(out).pair_tokenizers
    assert tok.config.kind == kind and tok.source.kind == kind
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), "--beam", "2", "six five"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    assert '"bleu"' in capsys.readouterr().out


def test_pairs_and_text_do_not_mix(tmp_path, capsys):
    pairs = _pairs_file(tmp_path / "p.tsv", 20)
    args = ["train", "--preset", "tiny-test", "--pairs", str(pairs), "--out", str(tmp_path / "a")]
    assert main(args) == 2
    assert "--pairs applies to translation models" in capsys.readouterr().err
    args = ["train", *TINY, "--text", str(pairs), "--out", str(tmp_path / "b")]
    assert main(args) == 2
    assert "give --pairs, not --text" in capsys.readouterr().err


@pytest.mark.parametrize("shared", ["true", "false"])
def test_rnn_encoder_decoder_through_the_commands(tmp_path, capsys, shared):
    """The dates-rnn preset (Bahdanau GRU) trains, resumes, translates, evaluates and
    plots its alignment through the same commands as the transformer."""
    from attnlm.loading.checkpoint import load_checkpoint

    pairs = _pairs_file(tmp_path / "p.tsv", 60)
    out = tmp_path / "rnn"
    args = ["train", "--preset", "dates-rnn", "--set", "model.d_emb=8",
            "--set", "model.d_hidden=16", "--set", f"train.shared_vocab={shared}",
            "--batch-size", "8", "--eval-interval", "2", "--eval-iters", "1",
            "--threads", "1", "--no-progress", "--pairs", str(pairs),
            "--out", str(out)]  # fmt: skip
    assert main([*args, "--max-iters", "2"]) == 0
    assert main(["train", "--resume", str(out), "--max-iters", "3", "--no-progress"]) == 0
    ck = load_checkpoint(out)
    assert ck.family.type == "rnn-seq2seq" and ck.pair_tokenizers.shared == (shared == "true")
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(out), "--beam", "2", "six five", "one"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 0 <= report["bleu"] <= 100
    png = tmp_path / "align.png"
    assert main(["attention", "--checkpoint", str(out), "one two", "--kind", "cross",
                 "--out", str(png)]) == 0  # fmt: skip
    assert png.stat().st_size > 0
