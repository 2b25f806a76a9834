"""``attnlm contextual --vectors F``: the static word2vec vector beside the contextual ones
(one vector for the word in every sentence, cosine 1.0, its nearest words)."""

import json

import numpy as np
import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.inspect.contextual import static_word
from attnlm.word2vec.vectors import WordVectors

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = ["We sat on the bank.", "The Bank raised rates.", "cash at the bank"]
LOWER = [s.lower() for s in SENTENCES]  # the test GPT's characters


@pytest.fixture()
def vectors():
    rng = np.random.default_rng(0)
    words = ["bank", "river", "money", "the", "shore"] + [f"w{k}" for k in range(20)]
    return WordVectors(words, rng.standard_normal((len(words), 6)))


@pytest.fixture()
def gpt_checkpoint(tmp_path):
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry
    from attnlm.tokenizers import CharTokenizer

    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyzBW .")
    table = {"type": "gpt", "vocab_size": tok.vocab_size, "block_size": 32, "n_layer": 1,
             "n_head": 2, "n_embd": 8}  # fmt: skip
    torch.manual_seed(0)
    model, cfg, fam = registry.build(table)
    save_checkpoint(tmp_path / "ck", model, {"model": registry.config_table(fam, cfg),
                                             "train": {}}, tok, {})  # fmt: skip
    return tmp_path / "ck"


def test_static_word_is_one_vector_with_cosine_one_and_gensims_neighbours(vectors):
    kv_mod = pytest.importorskip("gensim.models.keyedvectors")
    s = static_word(vectors, "bank", SENTENCES, top=4)
    assert s.vectors.shape == (3, 6)
    for row in s.vectors:
        np.testing.assert_array_equal(row.numpy(), vectors.vector("bank"))
    torch.testing.assert_close(s.cosine(), torch.ones(3, 3))
    kv = kv_mod.KeyedVectors(6)
    kv.add_vectors(vectors.words, vectors.vectors)
    assert [w for w, _ in s.neighbours] == [w for w, _ in kv.most_similar("bank", topn=4)]
    with pytest.raises(InputError, match="sentence 2 .* does not contain the word 'bank'"):
        static_word(vectors, "bank", ["the bank", "no such word"])
    with pytest.raises(InputError, match="'vault' has no word2vec vector"):
        static_word(vectors, "vault", SENTENCES)


def test_contextual_shows_the_static_vector_beside_the_contextual_ones(
    cli, vectors, gpt_checkpoint, tmp_path
):
    path = vectors.save(tmp_path / "v.bin")
    argv = ["contextual", "--checkpoint", str(gpt_checkpoint), "--word", "bank", *LOWER,
            "--vectors", str(path)]  # fmt: skip
    r = cli(*argv)
    assert r.code == 0, r.err
    assert "word2vec (static, dim 6): one vector for 'bank' in every sentence" in r.out
    assert "cos(S1,S2) 1.000 cos(S1,S3) 1.000 cos(S2,S3) 1.000" in r.out
    r = cli(*argv, "--json")
    got = json.loads(r.out)
    assert got["word2vec"]["cosine"] == [[1.0] * 3] * 3 and len(got["layers"]) == 2
    assert [n["word"] for n in got["word2vec"]["neighbours"]] == [
        w for w, _ in vectors.most_similar(["bank"], top=8)
    ]
