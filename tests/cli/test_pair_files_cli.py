"""Separate pair files for a translation run (issue 22): ``attnlm train --pairs TRAIN
--valid-pairs VALID --test-pairs TEST`` trains on every pair of TRAIN and uses the other files
as they are; ``train.valid_fraction`` / ``train.test_fraction`` (0 allowed for test) size the
splits held out of TRAIN otherwise; ``attnlm eval --pairs FILE`` scores every pair of FILE
(``--limit`` still limits), the run's own test split without ``--pairs``."""

from __future__ import annotations

import json

import pytest
import sacrebleu

from attnlm.cli import main
from attnlm.data.pairs import RUN_SPLIT_SEED, group_references, read_pairs, split_pairs
from support import FIXTURES

TATOEBA = FIXTURES / "pairs" / "tatoeba-eng-fra-500.tsv"
TINY = [
    "--preset", "translate-transformer",
    "--set", "model.d_model=16", "--set", "model.n_head=2", "--set", "model.d_ff=32",
    "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
    "--set", "train.bpe_vocab_size=300", "--max-iters", "2", "--time-budget", "60s",
    "--batch-size", "8", "--eval-interval", "2", "--eval-iters", "1", "--threads", "1",
    "--no-progress",
]  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The 500 Tatoeba pairs cut into train / valid / test files by source sentence."""
    tmp = tmp_path_factory.mktemp("pairfiles")
    pairs, _ = read_pairs(TATOEBA)
    parts = split_pairs(pairs, valid=0.1, test=0.1, seed=7)
    out = {}
    for name in ("train", "valid", "test"):
        rows = getattr(parts, name)
        out[name] = tmp / f"{name}.tsv"
        out[name].write_text("".join(f"{s}\t{t}\n" for s, t in rows), encoding="utf-8")
    out["tmp"] = tmp
    return out


@pytest.fixture(scope="module")
def run(files):
    out = files["tmp"] / "run"
    argv = ["train", *TINY, "--pairs", str(files["train"]), "--valid-pairs",
            str(files["valid"]), "--test-pairs", str(files["test"]), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    return out


def _rows(path):
    return [tuple(p) for p in read_pairs(path, header=False)[0]]


def test_explicit_valid_and_test_files_are_used_as_they_are(run, files):
    stored = run / "pairs"
    assert _rows(stored / "train.tsv") == _rows(files["train"])  # every training pair
    assert _rows(stored / "valid.tsv") == _rows(files["valid"])
    assert _rows(stored / "test.tsv") == _rows(files["test"])
    config = json.loads((run / "checkpoint" / "config.json").read_text(encoding="utf-8"))
    assert config["train"]["valid_pairs"] == str(files["valid"].resolve())
    assert config["train"]["test_pairs"] == str(files["test"].resolve())


def test_eval_pairs_scores_every_pair_of_the_file(run, files, capsys):
    from attnlm.generate.translate import translate
    from attnlm.loading.checkpoint import load_checkpoint

    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--pairs", str(files["train"]), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    every = read_pairs(files["train"])[0]
    sources, refs = group_references(every)
    lines = files["train"].read_text(encoding="utf-8").splitlines()
    assert got["pairs"] == len(every) == len(lines) and got["sentences"] == len(sources)
    ck = load_checkpoint(run)
    hyps = translate(ck.model, ck.pair_tokenizers, sources)
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(max(map(len, refs)))]
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, streams).score)
    # --limit still limits: the first N distinct sources and all their pairs
    assert main(["eval", "--checkpoint", str(run), "--pairs", str(files["train"]), "--limit",
                 "7", "--json"]) == 0  # fmt: skip
    got = json.loads(capsys.readouterr().out)
    keep = set(sources[:7])
    assert got["sentences"] == 7 and got["pairs"] == sum(p.source in keep for p in every)
    # without --pairs: the run's own test split (here the --test-pairs file); --split val
    assert main(["eval", "--checkpoint", str(run), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["pairs"] == len(_rows(files["test"])) and "test split of the run" in got["data"]
    assert main(["eval", "--checkpoint", str(run), "--split", "val", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["pairs"] == len(_rows(files["valid"])) and "validation split" in got["data"]


def test_fractions_and_no_test_split(files, cli):
    out = files["tmp"] / "fractions"
    r = cli("train", *TINY, "--pairs", str(files["train"]), "--set", "train.valid_fraction=0.2",
            "--set", "train.test_fraction=0", "--out", str(out))  # fmt: skip
    assert r.code == 0, r.err
    want = split_pairs(read_pairs(files["train"])[0], valid=0.2, test=0.0, seed=RUN_SPLIT_SEED)
    assert len(_rows(out / "pairs" / "valid.tsv")) == len(want.valid) >= 80
    assert (out / "pairs" / "test.tsv").stat().st_size == 0
    assert _rows(out / "pairs" / "train.tsv") == [tuple(p) for p in want.train]
    r = cli("eval", "--checkpoint", str(out))  # no test split: a one-line error
    assert r.code == 2 and "no pairs to evaluate" in r.err and "--pairs" in r.err
    r = cli("eval", "--checkpoint", str(out), "--pairs", str(files["test"]))
    assert r.code == 0 and "every pair of" in r.out


def test_bad_pair_file_options(files, cli, tmp_path):
    r = cli("train", *TINY, "--pairs", str(files["train"]), "--valid-pairs",
            str(tmp_path / "missing.tsv"), "--out", str(tmp_path / "r"))  # fmt: skip
    assert r.code == 2 and "missing.tsv" in r.err
    r = cli("train", *TINY, "--pairs", str(files["train"]), "--set", "train.valid_fraction=0.1",
            "--set", "train.val_fraction=0.1", "--out", str(tmp_path / "r"))  # fmt: skip
    assert r.code == 2 and "one setting" in r.err


def test_an_edited_valid_file_is_read_again(files, tmp_path):
    from attnlm.base.config import load_preset
    from attnlm.train.config import spec_from_tables
    from attnlm.train.data import prepare_pairs

    valid = tmp_path / "valid.tsv"
    valid.write_bytes(files["valid"].read_bytes())
    tables = load_preset("translate-transformer")
    tables["train"].update(pairs=str(files["train"]), valid_pairs=str(valid), bpe_vocab_size=300)
    cfg = spec_from_tables(tables).train
    first = prepare_pairs(tmp_path / "run", cfg)
    assert [tuple(p) for p in first.valid] == _rows(files["valid"])
    valid.write_text("one more\tencore un\n", encoding="utf-8")
    again = prepare_pairs(tmp_path / "run", cfg)
    assert [tuple(p) for p in again.valid] == [("one more", "encore un")]
