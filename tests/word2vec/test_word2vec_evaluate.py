"""Evaluations against gensim's evaluate_word_pairs / evaluate_word_analogies on the same
vectors and the same files (copied into tests/fixtures/word2vec from gensim's test data)."""

import numpy as np
import pytest

from attnlm.word2vec.evaluate import (
    dataset_path,
    evaluate_all,
    evaluate_word_analogies,
    evaluate_word_pairs,
)
from attnlm.word2vec.vectors import WordVectors
from support import FIXTURES

gensim_kv = pytest.importorskip("gensim.models.keyedvectors")

DATA = FIXTURES / "word2vec"
FILES = {
    "wordsim353": DATA / "wordsim353.tsv",
    "simlex999": DATA / "simlex999.txt",
    "google-analogies": DATA / "questions-words.txt",
}


def dataset_vectors(dim=16, seed=0, keep=0.8):
    """Vectors for most words of the three files (some left out, so some questions are
    skipped), plus case variants and filler words; rows with some structure so analogies
    are sometimes right: each word is a random vector plus a shared part for its section."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    rows = []
    seen: set[str] = set()

    def new(w: str) -> bool:  # each word is kept or left out once and for all
        fresh = w not in seen
        seen.add(w)
        return fresh and rng.random() < keep

    section = np.zeros(dim)
    for line in FILES["google-analogies"].read_text().splitlines():
        if line.startswith(":"):
            section = rng.standard_normal(dim)
            continue
        for w in line.split():
            if new(w.lower()):
                words.append(w.lower())
                rows.append(section + 0.5 * rng.standard_normal(dim))
    for name in ("wordsim353", "simlex999"):
        for line in FILES[name].read_text().splitlines():
            if line.startswith("#"):
                continue
            for w in line.split("\t")[:2]:
                if new(w.lower()):
                    words.append(w.lower())
                    rows.append(rng.standard_normal(dim))
    words += ["King", "PARIS", "filler"]  # case variants come after the lower-case words
    rows += [rng.standard_normal(dim) for _ in range(3)]
    return WordVectors(words, np.array(rows, dtype=np.float32))


def as_gensim(v):
    kv = gensim_kv.KeyedVectors(v.dim)
    kv.add_vectors(v.words, v.vectors)
    return kv


@pytest.mark.parametrize("name", ["wordsim353", "simlex999"])
@pytest.mark.parametrize("restrict", [300_000, 1000])
def test_word_pairs_equal_gensim(name, restrict):
    v = dataset_vectors()
    ours = evaluate_word_pairs(v, FILES[name], restrict)
    pearson, spearman, oov = as_gensim(v).evaluate_word_pairs(
        str(FILES[name]), restrict_vocab=restrict
    )
    assert ours.spearman == pytest.approx(spearman[0], abs=1e-6)
    assert ours.pearson == pytest.approx(pearson[0], abs=1e-6)
    assert ours.oov_ratio == pytest.approx(oov)
    assert ours.oov > 0 and ours.pairs > 50


@pytest.mark.parametrize("restrict", [300_000, 600])
def test_analogies_equal_gensim(restrict):
    v = dataset_vectors()
    ours = evaluate_word_analogies(v, FILES["google-analogies"], restrict)
    score, sections = as_gensim(v).evaluate_word_analogies(
        str(FILES["google-analogies"]), restrict_vocab=restrict
    )
    theirs = [(s["section"], len(s["correct"]), len(s["correct"]) + len(s["incorrect"]))
              for s in sections[:-1]]  # fmt: skip
    assert ours.sections == theirs
    assert ours.accuracy == pytest.approx(score)
    assert 0 < ours.correct < ours.answered and ours.oov > 0


def test_evaluate_all_reads_the_files_from_the_installed_gensim():
    for name, path in FILES.items():
        assert dataset_path(name).read_bytes() == path.read_bytes()
    out = evaluate_all(dataset_vectors())
    assert set(out) == {"wordsim353", "simlex999", "google-analogies"}
    assert out["wordsim353"]["pairs"] + out["wordsim353"]["oov_pairs"] == 353
    assert out["simlex999"]["pairs"] + out["simlex999"]["oov_pairs"] == 999
    g = out["google-analogies"]
    assert g["answered"] + g["oov_questions"] == 19544


def test_rank_correlations_equal_scipy_with_ties():
    """Our Spearman (Pearson on average ranks) and Pearson equal scipy's, ties included."""
    import numpy as np

    stats = pytest.importorskip("scipy.stats")
    from attnlm.word2vec.evaluate import pearson, spearman

    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(3, 40))
        x = rng.integers(0, 5, n).astype(float).tolist()  # many ties
        y = rng.normal(size=n).tolist()
        if len(set(x)) > 1:
            assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
            assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
