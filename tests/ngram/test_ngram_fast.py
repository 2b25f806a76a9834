"""The fast n-gram paths against their slow references: bulk float formatting against
``str(np.float32(x))``, the block ARPA writer against the original per-value writer (byte for
byte, plain and gzip)."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from attnlm.ngram import count_ngrams, modified_kneser_ney, split_sentences, train, write_arpa
from attnlm.ngram.floatfmt import PAD, format_float32
from support import FIXTURES

NGRAM = FIXTURES / "ngram"


def _texts(mat: np.ndarray) -> list[str]:
    return [bytes(r[r != PAD]).decode("ascii") for r in mat]


def test_format_float32_is_numpy_str_on_random_bits():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate(
        [
            bits.view(np.float32),
            (-rng.exponential(2.0, 100_000)).astype(np.float32),  # log probabilities
            rng.uniform(-3, 3, 50_000).astype(np.float32),  # back-off weights
            np.float32([0, -0.0, 1e-3, -1e-3, 99.5, -99.49999, 0.5, -2.0, 0.1, 12.0, -1e-4]),
            np.float32([np.inf, -np.inf, np.nan, 1e30, -1.5e-40]),
        ]
    )
    with np.errstate(invalid="ignore"):
        got = _texts(format_float32(x))
    assert got == [str(v) for v in x]


def reference_write_arpa(model, path: Path) -> None:
    """The original writer: one Python call per number (kept here as the reference)."""

    def fmt(x: float) -> str:
        if x == 0:
            return "0"
        if x == -math.inf or x <= -99:
            return "-99"
        return str(np.float32(x))

    words, N = model.vocab.words, model.order
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\\data\\\n")
        for k in range(1, N + 1):
            f.write(f"ngram {k}={len(model.keys[k - 1])}\n")
        texts = list(words)
        for k in range(1, N + 1):
            f.write(f"\n\\{k}-grams:\n")
            keys = model.keys[k - 1]
            if k > 1:
                pref, last = (keys // model.V).tolist(), (keys % model.V).tolist()
                texts = [texts[a] + " " + words[b] for a, b in zip(pref, last)]
            lp = [fmt(x) for x in model.logp[k - 1].astype(np.float32).tolist()]
            if k < N:
                bo = [fmt(x) for x in model.bo[k - 1].astype(np.float32).tolist()]
                f.writelines(f"{a}\t{t}\t{b}\n" for a, t, b in zip(lp, texts, bo))
            else:
                f.writelines(f"{a}\t{t}\n" for a, t in zip(lp, texts))
        f.write("\n\\end\\\n")


@pytest.fixture(scope="module")
def fixture_sentences():
    return split_sentences((NGRAM / "train.txt").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("smoothing", "order"), [("mkn", 4), ("mle", 3), ("stupid", 2)])
def test_block_writer_is_byte_identical(tmp_path, fixture_sentences, smoothing, order):
    model = train(fixture_sentences, order, smoothing=smoothing)
    reference_write_arpa(model, tmp_path / "ref.arpa")
    write_arpa(model, tmp_path / "new.arpa")
    write_arpa(model, tmp_path / "new.arpa.gz")
    ref = (tmp_path / "ref.arpa").read_bytes()
    assert (tmp_path / "new.arpa").read_bytes() == ref
    assert gzip.decompress((tmp_path / "new.arpa.gz").read_bytes()) == ref


@pytest.mark.filterwarnings("ignore::attnlm.ngram.DiscountWarning")
def test_block_writer_long_words_unicode_and_many_chunks(tmp_path, monkeypatch):
    import attnlm.ngram.arpa_write as aw

    monkeypatch.setattr(aw, "CHUNK", 7)  # many blocks per order
    rng = np.random.default_rng(1)
    vocab = ["a", "é", "日本語", "x" * 41, "naïve", "--", "b"]
    sents = [[vocab[i] for i in rng.integers(0, len(vocab), 9)] for _ in range(60)]
    model, _ = modified_kneser_ney(count_ngrams(sents, 3))
    reference_write_arpa(model, tmp_path / "ref.arpa")
    write_arpa(model, tmp_path / "new.arpa")
    assert (tmp_path / "new.arpa").read_bytes() == (tmp_path / "ref.arpa").read_bytes()


def test_memory_mapped_binary_scores_as_its_arpa(tmp_path, fixture_sentences):
    from attnlm.ngram import load_model, read_arpa

    model = train(fixture_sentences, 4)
    model.save(tmp_path / "lm.npz")
    write_arpa(model, tmp_path / "lm.arpa")
    test = split_sentences((NGRAM / "test.txt").read_text(encoding="utf-8"))
    mapped = load_model(tmp_path / "lm.npz")
    assert not mapped.keys[3].flags.writeable  # mapped, not copied
    copied = load_model(tmp_path / "lm.npz", mmap=False)
    arpa = read_arpa(tmp_path / "lm.arpa")
    ppl = model.score_sentences(test).ppl
    assert mapped.score_sentences(test).ppl == ppl == copied.score_sentences(test).ppl
    assert arpa.score_sentences(test).ppl == pytest.approx(ppl, rel=1e-6)  # float32 in ARPA
    for k in range(4):
        assert np.array_equal(mapped.keys[k], arpa.keys[k])
    arpa.save(tmp_path / "from_arpa.npz")  # the binary of an ARPA file scores exactly as it
    assert load_model(tmp_path / "from_arpa.npz").score_sentences(test) == arpa.score_sentences(
        test
    )


@pytest.mark.parametrize("name", ["kenlm_o3.arpa.gz", "ours.arpa"])
def test_fast_arpa_reader_equals_line_parser(tmp_path, fixture_sentences, monkeypatch, name):
    import attnlm.ngram.arpa as arpa

    path = NGRAM / name
    if name == "ours.arpa":
        path = tmp_path / name
        write_arpa(train(fixture_sentences, 4), path)
    assert arpa._parse_fast(path) is not None  # the regular layout takes the fast path
    fast = arpa.read_arpa(path)
    monkeypatch.setattr(arpa, "_parse_fast", lambda p: None)
    slow = arpa.read_arpa(path)
    assert fast.vocab.words == slow.vocab.words
    for k in range(fast.order):
        for a, b in ((fast.keys, slow.keys), (fast.logp, slow.logp), (fast.bo, slow.bo)):
            assert np.array_equal(a[k], b[k])


@pytest.mark.filterwarnings("ignore::attnlm.ngram.DiscountWarning")
def test_block_writer_threaded_and_plain_paths_agree(tmp_path, monkeypatch):
    """The look-ahead path (worker threads, per-chunk word column widths) and the plain path
    write the same bytes as the per-value reference; an order without blocks keeps its header."""
    import attnlm.ngram.arpa_write as aw

    monkeypatch.setattr(aw, "CHUNK", 5)  # chunks with and without the long word
    rng = np.random.default_rng(2)
    vocab = ["a", "b", "c", "d", "y" * 30, "e", "f", "g"]
    weights = np.array([8, 8, 8, 8, 1, 8, 8, 8]) / 57
    sents = [[vocab[i] for i in rng.choice(len(vocab), 7, p=weights)] for _ in range(40)]
    model, _ = modified_kneser_ney(count_ngrams(sents, 3))
    reference_write_arpa(model, tmp_path / "ref.arpa")
    ref = (tmp_path / "ref.arpa").read_bytes()

    def sections():
        for k in range(1, 4):
            ids = aw.ngram_word_ids(model, k) if k > 1 else model.keys[0][:, None]
            bo = model.bo[k - 1] if k < 3 else None
            yield [(ids, model.logp[k - 1], bo)]

    sizes = [len(k) for k in model.keys]
    for ahead in (False, True):
        out = tmp_path / f"ahead{ahead}.arpa"
        aw.write_sections(out, model.vocab.words, sizes, sections(), ahead=ahead)
        assert out.read_bytes() == ref
    aw.write_sections(tmp_path / "empty.arpa", ["<s>", "a"], [2, 0], iter([]), ahead=True)
    text = (tmp_path / "empty.arpa").read_text()
    assert text == "\\data\\\nngram 1=2\nngram 2=0\n\n\\1-grams:\n\n\\2-grams:\n\n\\end\\\n"
