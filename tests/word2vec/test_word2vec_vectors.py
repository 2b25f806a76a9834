"""Word vectors against gensim's KeyedVectors: the word2vec text and binary files both ways,
and most_similar / analogies on the same vectors."""

import numpy as np
import pytest

from attnlm.base.errors import InputError
from attnlm.word2vec.vectors import WordVectors

gensim_kv = pytest.importorskip("gensim.models.keyedvectors")

WORDS = ["king", "queen", "man", "woman", "prince", "café", "naïve", "x", "o'er", "the"]


def random_vectors(n_extra=40, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    words = WORDS + [f"w{k}" for k in range(n_extra)]
    return WordVectors(words, rng.standard_normal((len(words), dim)).astype(np.float32))


def as_gensim(v: WordVectors):
    kv = gensim_kv.KeyedVectors(v.dim)
    kv.add_vectors(v.words, v.vectors)
    return kv


@pytest.mark.parametrize("name,binary", [("v.txt", False), ("v.bin", True)])
def test_our_files_load_in_gensim(tmp_path, name, binary):
    v = random_vectors()
    path = v.save(tmp_path / name)
    kv = gensim_kv.KeyedVectors.load_word2vec_format(str(path), binary=binary)
    assert kv.index_to_key == v.words
    np.testing.assert_array_equal(kv.vectors, v.vectors)  # exact: %.9g round-trips float32


@pytest.mark.parametrize("name,binary", [("g.txt", False), ("g.bin", True)])
def test_gensims_files_load_in_ours(tmp_path, name, binary):
    v = random_vectors(seed=1)
    as_gensim(v).save_word2vec_format(str(tmp_path / name), binary=binary)
    back = WordVectors.load(tmp_path / name)
    assert back.words == v.words
    np.testing.assert_array_equal(back.vectors, v.vectors)


def test_format_flag_overrides_the_extension(tmp_path):
    v = random_vectors()
    v.save(tmp_path / "v.vec", binary=True)
    assert WordVectors.load(tmp_path / "v.vec", binary=True).words == v.words
    with pytest.raises(InputError, match="line 2 is not a word and 12 numbers"):
        WordVectors.load(tmp_path / "v.vec")


@pytest.mark.parametrize(
    "content,error",
    [
        (b"", "not a word2vec file"),
        (b"hello world\n", "not a word2vec file"),
        (b"3 2\na 1 2\nb 3 4\n", "has fewer lines"),
        (b"1 2\na 1 x\n", "line 2 is not a word and 2 numbers"),
    ],
)
def test_bad_text_files_are_one_line_errors(tmp_path, content, error):
    (tmp_path / "bad.txt").write_bytes(content)
    with pytest.raises(InputError, match=error):
        WordVectors.load(tmp_path / "bad.txt")


def test_truncated_binary_file_is_an_error(tmp_path):
    path = random_vectors().save(tmp_path / "v.bin")
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(InputError, match="the file ends after 49"):
        WordVectors.load(path)


@pytest.mark.parametrize("word", ["king", "café", "w3", "the"])
def test_most_similar_equals_gensim(word):
    v = random_vectors()
    ours = v.most_similar([word], top=10)
    theirs = as_gensim(v).most_similar(word, topn=10)
    assert [w for w, _ in ours] == [w for w, _ in theirs]
    np.testing.assert_allclose([c for _, c in ours], [c for _, c in theirs], atol=1e-6)


def test_analogy_equals_gensim_most_similar_positive_negative():
    v = random_vectors()
    ours = v.analogy("king", "man", "woman", top=8)
    theirs = as_gensim(v).most_similar(positive=["king", "woman"], negative=["man"], topn=8)
    assert [w for w, _ in ours] == [w for w, _ in theirs]
    np.testing.assert_allclose([c for _, c in ours], [c for _, c in theirs], atol=1e-6)
    assert v.similarity("king", "queen") == pytest.approx(
        float(as_gensim(v).similarity("king", "queen")), abs=1e-6
    )


def test_unknown_words_are_input_errors():
    with pytest.raises(InputError, match="'nope' is not in the vocabulary"):
        random_vectors().most_similar(["nope"])
