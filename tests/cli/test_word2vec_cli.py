"""``attnlm word2vec train / similar / analogy / evaluate`` against the library and gensim."""

import json

import numpy as np
import pytest

from attnlm.word2vec.evaluate import evaluate_all
from attnlm.word2vec.vectors import WordVectors
from support import FIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def topic_text(tmp_path):
    rng = np.random.default_rng(0)
    groups = ["king queen prince lord duke".split(), "river water bank stream shore".split()]
    paragraphs = []
    for k in range(600):
        words = list(rng.choice(groups[k % 2], 7)) + ["the", "and"]
        rng.shuffle(words)
        paragraphs.append(" ".join(words))
    path = tmp_path / "topics.txt"
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["v.txt", "v.bin"])
def test_train_writes_vectors_gensim_reads(cli, topic_text, tmp_path, name):
    kv_mod = pytest.importorskip("gensim.models.keyedvectors")
    out = tmp_path / name
    r = cli("word2vec", "train", "--text", str(topic_text), "--out", str(out), "--dim", "16",
            "--epochs", "2", "--min-count", "1", "--cbow", "--noise-share", "4",
            "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "CBOW: 12 words x 16" in r.out and "loss per epoch:" in r.out
    kv = kv_mod.KeyedVectors.load_word2vec_format(str(out), binary=name.endswith(".bin"))
    ours = WordVectors.load(out)
    assert kv.index_to_key == ours.words
    np.testing.assert_array_equal(kv.vectors, ours.vectors)


def test_progress_bar_shows_words_per_second_and_eta(cli, topic_text, tmp_path):
    r = cli("word2vec", "train", "--text", str(topic_text), "--out", str(tmp_path / "v.txt"),
            "--dim", "8", "--epochs", "1", "--min-count", "1", "--batch", "256")  # fmt: skip
    assert r.code == 0, r.err
    assert "words/s" in r.err and "ETA" in r.err and "epoch 1" in r.err


@pytest.fixture()
def vectors_file(tmp_path):
    rng = np.random.default_rng(3)
    words = ["king", "man", "woman", "queen", "bank", "river", "money", "love", "sex", "old",
             "new", "smart", "intelligent", "hard", "difficult", "tiger", "cat", "paris",
             "france", "london", "england"] + [f"w{k}" for k in range(30)]  # fmt: skip
    path = tmp_path / "v.bin"
    WordVectors(words, rng.standard_normal((len(words), 10))).save(path)
    return path


def test_similar_and_analogy_print_gensims_most_similar(cli, vectors_file):
    kv_mod = pytest.importorskip("gensim.models.keyedvectors")
    kv = kv_mod.KeyedVectors.load_word2vec_format(str(vectors_file), binary=True)
    r = cli("word2vec", "similar", "--vectors", str(vectors_file), "bank", "--top-k", "4", "--json")
    assert r.code == 0, r.err
    got = [(x["word"], x["cosine"]) for x in json.loads(r.out)["results"]]
    want = kv.most_similar("bank", topn=4)
    assert [w for w, _ in got] == [w for w, _ in want]
    np.testing.assert_allclose([c for _, c in got], [c for _, c in want], atol=1e-6)
    r = cli("word2vec", "analogy", "--vectors", str(vectors_file), "king", "man", "woman",
            "--top-k", "3", "--json")  # fmt: skip
    got = [x["word"] for x in json.loads(r.out)["results"]]
    want = kv.most_similar(positive=["king", "woman"], negative=["man"], topn=3)
    assert got == [w for w, _ in want]
    r = cli("word2vec", "analogy", "--vectors", str(vectors_file), "king", "man", "woman")
    assert r.out.startswith("king - man + woman") and len(r.out.splitlines()) == 11


def test_evaluate_prints_the_library_numbers(cli, vectors_file):
    data = FIXTURES / "word2vec"
    r = cli("word2vec", "evaluate", "--vectors", str(vectors_file), "--json",
            "--wordsim", str(data / "wordsim353.tsv"), "--simlex", str(data / "simlex999.txt"),
            "--analogies", str(data / "questions-words.txt"))  # fmt: skip
    assert r.code == 0, r.err
    assert json.loads(r.out) == json.loads(json.dumps(evaluate_all(WordVectors.load(vectors_file))))
    r = cli("word2vec", "evaluate", "--vectors", str(vectors_file))
    assert "wordsim353: Spearman" in r.out and "google-analogies: accuracy" in r.out


@pytest.mark.parametrize(
    "argv,error",
    [
        (["similar", "--vectors", "{v}", "nope"], "'nope' is not in the vocabulary"),
        (["similar", "--vectors", "{v}", "bank", "--format", "text"], "line 2 is not a word"),
        (["similar", "--vectors", "{missing}", "bank"], "no such file"),
        (["train", "--out", "{out}", "--dim", "0"], "--dim: must be an integer >= 1"),
        (["train", "--text", "{tiny}", "--out", "{out}"], "no word occurs --min-count 5"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, vectors_file, tmp_path, argv, error):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a few words only\n", encoding="utf-8")
    paths = {"v": vectors_file, "missing": tmp_path / "none.bin", "out": tmp_path / "o.txt",
             "tiny": tiny}  # fmt: skip
    r = cli("word2vec", *[a.format(**paths) for a in argv])
    assert r.code == 2
    assert error in r.err and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
