"""Tests for attnlm.ngram: hand-computed examples, normalisation, fast-path equivalence, formats,
CLI errors. KenLM parity lives in test_ngram_kenlm.py."""

from __future__ import annotations

import gzip
import json
import math
import warnings
from collections import Counter

import numpy as np
import pytest

from attnlm.base.errors import ConfigError, InputError
from attnlm.cli import main
from attnlm.ngram import (
    BackoffModel,
    DiscountWarning,
    count_ngrams,
    load_model,
    read_arpa,
    split_sentences,
    train,
    write_arpa,
)
from attnlm.ngram.counts import BOS, EOS

# Jurafsky & Martin, "Speech and Language Processing", ch. 3: the Sam corpus
SAM = "I am Sam\nSam I am\nI do not like green eggs and ham\n"
SAM_SENTS = split_sentences(SAM)


def corpus(seed: int = 0, n: int = 300, vocab: int = 40) -> list[list[str]]:
    """A random corpus with a Zipf-like word distribution."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    return [list(rng.choice(words, size=rng.integers(1, 12), p=p)) for _ in range(n)]


def quiet_train(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiscountWarning)
        return train(*args, **kw)


# -- counting ------------------------------------------------------------------------------


def naive_counts(sents, order, pad="kenlm"):
    out = Counter()
    for s in sents:
        n_pad = 1 if pad == "kenlm" else max(order - 1, 1)
        toks = [BOS] * n_pad + list(s) + [EOS] * n_pad
        for k in range(1, order + 1):
            for i in range(len(toks) - k + 1):
                out[tuple(toks[i : i + k])] += 1
    return out


@pytest.mark.parametrize("pad", ["kenlm", "nltk"])
@pytest.mark.parametrize("order", [1, 2, 4])
def test_counts_match_naive_counting(order, pad):
    sents = corpus(1, n=120)
    c = count_ngrams(sents, order, pad=pad)
    words = c.vocab.words
    got = Counter()
    tuples: list[tuple[str, ...]] = [(w,) for w in words]
    for k in range(1, order + 1):
        if k > 1:  # rebuild word tuples from the hierarchical keys
            tuples = [tuples[p] + (words[w],) for p, w in zip(c.prefix(k), c.word(k))]
        for t, n in zip(tuples, c.counts[k - 1]):
            if n:
                got[t] = int(n)
    assert got == naive_counts(sents, order, pad)


def test_vocabulary_order_is_kenlm_order():
    c = count_ngrams(SAM_SENTS, 2)
    assert c.vocab.words[:5] == ["<unk>", "<s>", "</s>", "I", "am"]
    assert c.counts[0][c.vocab.unk] == 0


# -- hand-computed examples ----------------------------------------------------------------


def test_mle_by_hand():
    m = train(SAM_SENTS, 2, smoothing="mle")
    p = lambda w, *ctx: 10 ** m.logprob(w, list(ctx))  # noqa: E731
    assert p("I", BOS) == pytest.approx(2 / 3)
    assert p("Sam", BOS) == pytest.approx(1 / 3)
    assert p("am", "I") == pytest.approx(2 / 3)
    assert p("do", "I") == pytest.approx(1 / 3)
    assert p(EOS, "Sam") == pytest.approx(1 / 2)
    assert p("Sam", "am") == pytest.approx(1 / 2)
    assert p("ham", "I") == 0.0  # unseen after a seen context
    # "<s> I am Sam </s>": 2/3 * 2/3 * 1/2 * 1/2 = 1/9 over 4 tokens
    r = m.score_sentences([["I", "am", "Sam"]])
    assert r.tokens == 4 and r.oov == 0
    assert r.ppl == pytest.approx(9 ** (1 / 4))
    assert math.isinf(m.score_sentences([["I", "ham"]]).ppl)


def test_mle_unigram_by_hand():
    m = train(SAM_SENTS, 1, smoothing="mle")
    # 14 words + 3 </s> = 17 predicted tokens; <s> is never predicted
    assert 10 ** m.logprob("I") == pytest.approx(3 / 17)
    assert 10 ** m.logprob(EOS) == pytest.approx(3 / 17)
    assert 10 ** m.logprob(BOS) == 1.0  # log10 p = 0, as KenLM writes <s>
    assert m.distribution().sum() == pytest.approx(1.0, abs=1e-12)


def test_laplace_by_hand():
    m = train(SAM_SENTS, 2, smoothing="addk", k=1.0)
    # |V| = 10 words + </s> + <unk> = 12; C(I .) = 3
    assert 10 ** m.logprob("am", ["I"]) == pytest.approx(3 / 15)
    assert 10 ** m.logprob("ham", ["I"]) == pytest.approx(1 / 15)
    assert 10 ** m.logprob("zebra", ["I"]) == pytest.approx(1 / 15)  # <unk>
    assert 10 ** m.logprob("am", ["zebra"]) == pytest.approx(1 / 12)  # unseen context: uniform
    m2 = train(SAM_SENTS, 2, smoothing="addk", k=0.5)
    assert 10 ** m2.logprob("am", ["I"]) == pytest.approx(2.5 / 9)


def test_stupid_backoff_by_hand_and_unnormalised():
    m = train(SAM_SENTS, 2, smoothing="stupid")
    assert 10 ** m.logprob("am", ["I"]) == pytest.approx(2 / 3)
    assert 10 ** m.logprob("Sam", ["do"]) == pytest.approx(0.4 * 2 / 17)
    assert not m.normalized
    assert m.distribution(["I"]).sum() > 1.0 + 1e-3


def test_mkn_tiny_corpus_falls_back_with_warning():
    with pytest.warns(DiscountWarning):
        m = train(SAM_SENTS, 3)
    assert m.meta["discounts"][-1] == (0.5, 1.0, 1.5)
    for ctx in ([BOS], [BOS, "I"], ["I", "am"], ["zebra"], ["ham", "zebra"]):
        assert m.distribution(ctx).sum() == pytest.approx(1.0, abs=1e-9)


def test_mkn_by_hand_bigram():
    """Interpolated modified Kneser-Ney on a bigram model of the Sam corpus, fixed discounts."""
    from attnlm.ngram.smoothing import Discount, modified_kneser_ney

    d = [Discount(0.5, 1.0, 1.5), Discount(0.5, 1.0, 1.5)]
    m, _ = modified_kneser_ney(count_ngrams(SAM_SENTS, 2), discounts=d)
    # unigram adjusted counts = distinct left words: I{<s>,Sam}=2, am{I}=1, Sam{am,<s>}=2,
    # </s>{Sam,am,ham}=3, do not like green eggs and ham: 1 each (7); total 15.
    # discounts: 2 (count 1: am + 7 words = 8 * 0.5 = 4) ... gamma() = (8*.5 + 2*1 + 1*1.5)/15
    gamma0 = (8 * 0.5 + 2 * 1.0 + 1 * 1.5) / 15
    uniform = 1 / 12  # 10 words + </s> + <unk>, without <s>
    p_i = (2 - 1.0) / 15 + gamma0 * uniform
    assert 10 ** m.logprob("I") == pytest.approx(p_i)
    assert 10 ** m.logprob("<unk>") == pytest.approx(gamma0 * uniform)
    # bigram after "I": am (2), do (1); sum 3; gamma(I) = (0.5 + 1.0) / 3
    p_am = (2 - 1.0) / 3 + (0.5 + 1.0) / 3 * (10 ** m.logprob("am"))
    assert 10 ** m.logprob("am", ["I"]) == pytest.approx(p_am)
    assert 10 ** m.bo[0][m.vocab.index["I"]] == pytest.approx(0.5)


# -- normalisation and fast-path equivalence ------------------------------------------------


@pytest.mark.parametrize("smoothing", ["mkn", "mle", "addk"])
@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_normalised_over_sampled_contexts(smoothing, order):
    sents = corpus(2, n=400)
    m = quiet_train(sents, order, smoothing=smoothing, k=0.3)
    rng = np.random.default_rng(0)
    words = m.vocab.words
    contexts = [[BOS], [BOS, "w0"], ["unseen", "w1"], ["w3", "unseen"], []]
    for _ in range(20):
        s = sents[rng.integers(len(sents))]
        i = rng.integers(0, len(s) + 1)
        contexts.append(([BOS] + s)[: i + 1])
        contexts.append([words[j] for j in rng.integers(3, len(words), size=3)])
    for ctx in contexts:
        total = m.distribution(ctx).sum()
        if smoothing == "mle" and total == 0:
            continue
        assert abs(total - 1.0) < 1e-9, (ctx, total)


@pytest.mark.parametrize("pad", ["kenlm", "nltk"])
@pytest.mark.parametrize("smoothing", ["mkn", "mle", "addk", "stupid"])
def test_vectorised_scoring_equals_word_by_word(smoothing, pad):
    sents = corpus(3, n=300)
    m = quiet_train(sents, 3, smoothing=smoothing, pad=pad, k=0.5)
    test = corpus(4, n=15, vocab=45)  # some unknown words
    lp, oov = m.sentence_logprobs(test)
    expect = []
    n_pad = 1 if pad == "kenlm" else 2
    for s in test:
        ctx = [BOS] * n_pad
        for w in s + [EOS] * n_pad:
            expect.append(m.logprob(w, ctx))
            ctx.append(w)
    np.testing.assert_allclose(lp, expect, rtol=1e-12, atol=1e-12)
    assert oov.sum() == sum(w not in m.vocab.index for s in test for w in s)


def test_mle_matches_nltk_with_nltk_padding():
    nltk_lm = pytest.importorskip("nltk.lm")
    from nltk.lm.preprocessing import padded_everygram_pipeline
    from nltk.util import ngrams, pad_sequence

    sents = corpus(5, n=80)
    train_data, vocab = padded_everygram_pipeline(3, sents)
    ref = nltk_lm.MLE(3)
    ref.fit(train_data, vocab)
    m = train(sents, 3, smoothing="mle", pad="nltk")
    for s in sents[:10]:
        padded = list(
            pad_sequence(
                s, 3, pad_left=True, pad_right=True, left_pad_symbol=BOS, right_pad_symbol=EOS
            )
        )
        expect = [ref.logscore(g[-1], g[:-1]) / math.log2(10) for g in ngrams(padded, 3)]
        got, _ = m.sentence_logprobs([s])
        np.testing.assert_allclose(got, expect, rtol=1e-12)


# -- scoring conventions ---------------------------------------------------------------------


def test_score_counts_tokens_and_oov():
    m = quiet_train(SAM_SENTS, 2)
    r = m.score_sentences([["I", "am", "zebra"], ["Sam"]])
    assert r.tokens == 3 + 1 + 1 + 1 and r.oov == 1
    lp, oov = m.sentence_logprobs([["I", "am", "zebra"], ["Sam"]])
    assert r.ppl == pytest.approx(10 ** (-lp.sum() / 6))
    assert r.ppl_excl_oov == pytest.approx(10 ** (-lp[~oov].sum() / 5))
    assert r.ppl_excl_oov < r.ppl


def test_empty_text_and_bad_order():
    with pytest.raises(InputError):
        train([], 2)
    with pytest.raises(ConfigError):
        train(SAM_SENTS, 0)
    with pytest.raises(ConfigError):
        train(SAM_SENTS, 2, smoothing="witten-bell")
    m = quiet_train(SAM_SENTS, 2)
    with pytest.raises(InputError):
        m.score_text("\n  \n")


# -- sampling --------------------------------------------------------------------------------


def test_sampling_is_seeded_and_bounded():
    m = quiet_train(corpus(6, n=300), 3)
    a = m.sample(5, seed=1, max_len=7)
    assert a == m.sample(5, seed=1, max_len=7)
    assert a != m.sample(5, seed=2, max_len=7)
    assert all(1 <= len(s) <= 7 or len(s) == 0 for s in a)
    vocab = set(m.vocab.words) - {BOS, EOS, "<unk>"}
    assert all(w in vocab for s in a for w in s)
    cold = m.sample(3, seed=0, temperature=0.01, max_len=5)
    assert cold == m.sample(3, seed=9, temperature=0.01, max_len=5)  # nearly greedy
    with pytest.raises(ConfigError):
        m.sample(1, temperature=0)


# -- formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize("smoothing", ["mkn", "addk", "stupid", "mle"])
def test_binary_round_trip(tmp_path, smoothing):
    sents = corpus(7, n=200)
    m = quiet_train(sents, 3, smoothing=smoothing)
    m.save(tmp_path / "m.bin")
    m2 = load_model(tmp_path / "m.bin")
    assert type(m2) is type(m) and m2.order == 3 and m2.vocab.words == m.vocab.words
    test = corpus(8, n=20, vocab=45)
    np.testing.assert_array_equal(m.sentence_logprobs(test)[0], m2.sentence_logprobs(test)[0])


@pytest.mark.parametrize("gz", [False, True])
def test_arpa_round_trip(tmp_path, gz):
    m = quiet_train(corpus(9, n=300), 3)
    path = tmp_path / ("m.arpa.gz" if gz else "m.arpa")
    write_arpa(m, path)
    opener = gzip.open if gz else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "\\data\\" and lines[-1] == "\\end\\"
    assert any(line.split("\t")[1:2] == ["<unk>"] for line in lines)
    assert all("\t" in line for line in lines if line and line[0] in "-0123456789")
    m2 = read_arpa(path)
    test = corpus(10, n=30, vocab=45)
    np.testing.assert_allclose(
        m.sentence_logprobs(test)[0], m2.sentence_logprobs(test)[0], atol=1e-6
    )


def test_arpa_rejects_addk(tmp_path):
    m = train(SAM_SENTS, 2, smoothing="addk")
    with pytest.raises(ConfigError):
        write_arpa(m, tmp_path / "x.arpa")


ARPA_PRUNED = """\\data\\
ngram 1=5
ngram 2=2
ngram 3=1

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.3
-0.5\t</s>\t0
-0.7\ta\t-0.2
-0.9\tb\t-0.1

\\2-grams:
-0.3\t<s> a\t-0.05
-0.4\ta b\t-0.15

\\3-grams:
-0.2\tb a b

\\end\\
"""


def test_arpa_adds_missing_prefixes_without_changing_scores(tmp_path):
    path = tmp_path / "pruned.arpa"
    path.write_text(ARPA_PRUNED)
    m = read_arpa(path)
    assert m.counts() == [5, 3, 1]  # "b a" was added as the prefix of "b a b"
    # p(a | <s> b)... score "<s> b a b </s>" by the ARPA rules, by hand:
    # b|<s>: no "<s> b" -> bo(<s>) + p(b) = -0.3 - 0.9
    # a|<s> b: no "b a" bigram in the file -> bo(b) + p(a) = -0.1 - 0.7 ("<s> b" absent)
    # b|b a: "b a b" exists -> -0.2
    # </s>|a b: no "a b </s>"; bo(a b) -0.15 + no "b </s>" -> bo(b) -0.1 + p(</s>) -0.5
    lp, _ = m.sentence_logprobs([["b", "a", "b"]])
    np.testing.assert_allclose(lp, [-1.2, -0.8, -0.2, -0.75])
    # the added entry "b a" carries exactly the back-off value and weight 0
    a_id, b_id = m.vocab.index["a"], m.vocab.index["b"]
    i = int(np.searchsorted(m.keys[1], b_id * m.V + a_id))
    assert m.logp[1][i] == pytest.approx(-0.8) and m.bo[1][i] == 0


def test_arpa_without_unk_gets_kenlm_default(tmp_path):
    text = ARPA_PRUNED.replace("ngram 1=5", "ngram 1=4").replace("-1.0\t<unk>\t0\n", "")
    (tmp_path / "x.arpa").write_text(text)
    with pytest.warns(UserWarning, match="<unk>"):
        m = read_arpa(tmp_path / "x.arpa")
    assert m.logprob("zebra") == -100.0


@pytest.mark.parametrize(
    "mutate, line",
    [
        (lambda t: t.replace("\\data\\", "data"), 1),
        (lambda t: t.replace("-0.4\ta b\t-0.15", "-0.4\ta b c d"), 15),
        (lambda t: t.replace("-0.7\ta\t-0.2", "x\ta\t-0.2"), 10),
        (lambda t: t.replace("ngram 2=2", "ngram 2=3"), 17),
        (lambda t: t.replace("\\end\\", ""), None),
        (lambda t: t.replace("-0.2\tb a b", "-0.2\tb a b\t-0.1"), 18),
    ],
)
def test_malformed_arpa_names_the_line(tmp_path, mutate, line):
    path = tmp_path / "bad.arpa"
    path.write_text(mutate(ARPA_PRUNED))
    with pytest.raises(InputError) as e:
        read_arpa(path)
    assert str(path) in str(e.value)
    if line is not None:
        assert f"line {line}:" in str(e.value)


def test_arpa_unknown_word_and_empty(tmp_path):
    bad = tmp_path / "bad.arpa"
    bad.write_text(ARPA_PRUNED.replace("-0.2\tb a b", "-0.2\tb a zzz"))
    with pytest.raises(InputError, match="not a unigram"):
        read_arpa(bad)
    empty = tmp_path / "empty.arpa"
    empty.write_text("")
    with pytest.raises(InputError):
        read_arpa(empty)


# -- CLI -------------------------------------------------------------------------------------


def test_cli_train_score_sample(tmp_path, capsys):
    text = tmp_path / "train.txt"
    text.write_text("\n".join(" ".join(s) for s in corpus(11, n=300)) + "\n")
    arpa, binary = tmp_path / "m.arpa", tmp_path / "m.npz"
    assert (
        main(
            [
                "ngram",
                "train",
                "--order",
                "3",
                "--text",
                str(text),
                "--arpa",
                str(arpa),
                "--out",
                str(binary),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["ngram", "score", "--arpa", str(arpa), "--text", str(text), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"ppl", "ppl_excl_oov", "oov", "tokens"} <= d.keys()
    assert d["oov"] == 0 and d["tokens"] == sum(len(s) + 1 for s in corpus(11, n=300))
    assert main(["ngram", "score", "--lm", str(binary), "--text", str(text), "--json"]) == 0
    d2 = json.loads(capsys.readouterr().out)
    assert d2["ppl"] == pytest.approx(d["ppl"], rel=1e-6)
    assert main(["ngram", "score", "--lm", str(binary), "--text", str(text)]) == 0
    assert "Perplexity including OOVs" in capsys.readouterr().out
    assert main(["ngram", "sample", "--lm", str(binary), "-n", "3", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 3


def test_cli_smoothings(tmp_path, capsys):
    text = tmp_path / "train.txt"
    text.write_text(SAM)
    for sm in ["mle", "stupid", "addk"]:
        args = ["ngram", "train", "--order", "2", "--text", str(text), "--smoothing", sm]
        assert main(args + ["--out", str(tmp_path / f"{sm}.npz")]) == 0
        assert (
            main(
                [
                    "ngram",
                    "score",
                    "--lm",
                    str(tmp_path / f"{sm}.npz"),
                    "--text",
                    str(text),
                    "--json",
                ]
            )
            == 0
        )
        d = json.loads(capsys.readouterr().out)
        assert d["tokens"] == 17
    assert (
        main(
            [
                "ngram",
                "train",
                "--order",
                "2",
                "--text",
                str(text),
                "--smoothing",
                "addk",
                "--arpa",
                str(tmp_path / "x.arpa"),
            ]
        )
        == 2
    )


def test_cli_errors_exit_2(tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text(SAM)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "bad.txt"
    binary.write_bytes(b"caf\xe9 au lait\n")
    bad_arpa = tmp_path / "bad.arpa"
    bad_arpa.write_text(ARPA_PRUNED.replace("-0.7\ta\t-0.2", "oops"))
    out = str(tmp_path / "o.arpa")
    cases = [
        ["ngram", "train", "--order", "2", "--text", str(empty), "--arpa", out],
        ["ngram", "train", "--order", "0", "--text", str(good), "--arpa", out],
        ["ngram", "train", "--order", "2", "--text", str(binary), "--arpa", out],
        ["ngram", "train", "--order", "2", "--text", str(good)],
        ["ngram", "score", "--arpa", str(bad_arpa), "--text", str(good)],
        ["ngram", "score", "--arpa", str(tmp_path / "missing.arpa"), "--text", str(good)],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("attnlm: error: "), err
    main(["ngram", "score", "--arpa", str(bad_arpa), "--text", str(good)])
    assert "line 10:" in capsys.readouterr().err


def test_tokenize_option(tmp_path):
    word = pytest.importorskip("attnlm.tokenizers.word", reason="word tokenizer not written yet")
    text = "Hello, world! Hello again.\nThe world, again.\n"
    sents = split_sentences(text, tokenize=True)
    assert sents == [w for w in (word.split_words(line) for line in text.splitlines()) if w]
    m = quiet_train(sents, 2)
    assert isinstance(m, BackoffModel)


def test_unique_inverse_equals_numpy():
    from attnlm.ngram.counts import unique_inverse

    rng = np.random.default_rng(0)
    for q in (
        rng.integers(0, 50, 1000),
        rng.integers(0, 2**40, 5000),  # packed sort
        rng.integers(2**50, 2**60, 3000),  # too wide to pack: numpy fallback
        np.array([7], dtype=np.int64),
        np.zeros(0, dtype=np.int64),
    ):
        u, inv = unique_inverse(q.astype(np.int64))
        u2, inv2 = np.unique(q.astype(np.int64), return_inverse=True)
        np.testing.assert_array_equal(u, u2)
        np.testing.assert_array_equal(inv, inv2.reshape(-1))


def test_markers_inside_sentences_are_rejected():
    with pytest.raises(InputError, match="inside a sentence"):
        train([["a", "</s>", "b"]], 2)


def test_cli_discount_fallback_is_a_warning(tmp_path, capsys):
    text = tmp_path / "tiny.txt"
    text.write_text(SAM)
    rc = main(
        ["ngram", "train", "--order", "3", "--text", str(text), "--arpa", str(tmp_path / "t.arpa")]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "attnlm: warning: order" in err and "fixed discounts" in err


def test_cli_json_is_strict_when_perplexity_is_infinite(tmp_path, capsys):
    """An unsmoothed model gives infinite perplexity on unseen words: JSON null, not Infinity."""
    train_txt, test_txt = tmp_path / "train.txt", tmp_path / "test.txt"
    train_txt.write_text("a b c\nb c a\n", encoding="utf-8")
    test_txt.write_text("a b zebra\n", encoding="utf-8")
    model = tmp_path / "mle.npz"
    args = ["--order", "2", "--text", str(train_txt), "--out", str(model)]
    assert main(["ngram", "train", *args, "--smoothing", "mle"]) == 0
    capsys.readouterr()
    assert main(["ngram", "score", "--lm", str(model), "--text", str(test_txt), "--json"]) == 0

    def reject(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    d = json.loads(capsys.readouterr().out, parse_constant=reject)
    assert d["ppl"] is None and d["oov"] == 1 and d["tokens"] == 4
