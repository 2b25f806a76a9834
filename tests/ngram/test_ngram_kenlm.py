"""Parity with KenLM ``lmplz`` / ``query`` on the reference fixture in ``tests/fixtures/ngram``
(see its README): perplexities, discounts and ARPA files entry for entry."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from attnlm.cli import main
from attnlm.ngram import count_ngrams, modified_kneser_ney, read_arpa, split_sentences, write_arpa
from support import FIXTURES

NGRAM = FIXTURES / "ngram"

# from the fixture README (KenLM query figures)
TOKENS, OOV = 24801, 2414
PPL = {2: (317.970799, 165.956564), 3: (309.016391, 160.638476), 4: (307.868678, 160.099138)}
DISCOUNTS_O3 = [(0.64363, 1.08177, 1.46168), (0.79455, 1.14743, 1.37899),
                (0.883733, 1.1906, 1.46678)]  # fmt: skip


@pytest.fixture(scope="module")
def data():
    train = split_sentences((NGRAM / "train.txt").read_text(encoding="utf-8"))
    test = split_sentences((NGRAM / "test.txt").read_text(encoding="utf-8"))
    return train, test


@pytest.fixture(scope="module")
def models(data):
    train, _ = data
    return {n: modified_kneser_ney(count_ngrams(train, n)) for n in (2, 3, 4)}


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_mkn_perplexity_matches_kenlm(models, data, order):
    r = models[order][0].score_sentences(data[1])
    assert (r.tokens, r.oov) == (TOKENS, OOV)
    assert rel(r.ppl, PPL[order][0]) < 1e-6
    assert rel(r.ppl_excl_oov, PPL[order][1]) < 1e-6


def test_discounts_match_lmplz(models):
    got = models[3][1]
    for d, ref in zip(got, DISCOUNTS_O3):
        for x, y in zip(d.as_tuple(), ref):
            assert float(f"{x:.6g}") == pytest.approx(y, abs=1e-5)


def arpa_entries(path: Path) -> tuple[list[str], dict[str, tuple[float, ...]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    header, entries = [], {}
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("ngram "):
                header.append(line)
            parts = line.split("\t")
            if len(parts) >= 2:
                entries[parts[1]] = tuple(float(x) for x in [parts[0], *parts[2:]])
    return header, entries


@pytest.mark.parametrize("order", [2, 3])
def test_arpa_matches_kenlm_entry_for_entry(models, tmp_path, order):
    ours = tmp_path / f"o{order}.arpa"
    write_arpa(models[order][0], ours)
    first = ours.read_text(encoding="utf-8").splitlines()[0]
    assert first == "\\data\\"
    h1, a = arpa_entries(NGRAM / f"kenlm_o{order}.arpa.gz")
    h2, b = arpa_entries(ours)
    assert h1 == h2
    assert a.keys() == b.keys()
    worst = 0.0
    for k, x in a.items():
        y = b[k]
        assert len(x) == len(y), k  # back-off weight present in both or in neither
        for u, v in zip(x, y):
            # printed as 32-bit floats: ~8 significant digits
            worst = max(worst, abs(u - v) / max(1.0, abs(u)))
    assert worst < 2e-6


@pytest.mark.parametrize("order", [2, 3])
def test_reading_kenlm_arpa_gives_kenlm_perplexity(data, order):
    m = read_arpa(NGRAM / f"kenlm_o{order}.arpa.gz")
    r = m.score_sentences(data[1])
    assert (r.tokens, r.oov) == (TOKENS, OOV)
    assert rel(r.ppl, PPL[order][0]) < 1e-6
    assert rel(r.ppl_excl_oov, PPL[order][1]) < 1e-6


def test_cli_interface_matches_kenlm(tmp_path, capsys):
    """The interface outside checks call: train --arpa, then score --arpa --json."""
    arpa = tmp_path / "o3.arpa"
    rc = main(["ngram", "train", "--order", "3", "--text", str(NGRAM / "train.txt"),
               "--arpa", str(arpa)])  # fmt: skip
    assert rc == 0
    capsys.readouterr()
    assert main(["ngram", "score", "--arpa", str(arpa), "--text", str(NGRAM / "test.txt"),
                 "--json"]) == 0  # fmt: skip
    d = json.loads(capsys.readouterr().out)
    assert (d["tokens"], d["oov"]) == (TOKENS, OOV)
    assert rel(d["ppl"], PPL[3][0]) < 1e-6 and rel(d["ppl_excl_oov"], PPL[3][1]) < 1e-6


@pytest.mark.parametrize("order", [2, 3, 4])
def test_mkn_normalised_on_real_contexts(models, data, order):
    import numpy as np

    m = models[order][0]
    rng = np.random.default_rng(order)
    test = data[1]
    for _ in range(25):
        s = test[rng.integers(len(test))]
        i = int(rng.integers(0, len(s) + 1))
        ctx = (["<s>"] + s)[: i + 1]  # test contexts include unknown words
        assert abs(m.distribution(ctx).sum() - 1.0) < 1e-9, ctx
