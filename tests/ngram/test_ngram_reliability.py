"""Issue 15: ARPA values are validated, incomplete .npz models and bad sampling settings give
one-line errors."""

import math

import numpy as np
import pytest

from attnlm.base.errors import ConfigError, InputError
from attnlm.cli import main
from attnlm.ngram import train
from attnlm.ngram.arpa import read_arpa, write_arpa
from attnlm.ngram.files import load_model

# A hand-written order-2 model: line numbers matter for the error messages below.
ARPA = """\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.30103
-0.5\t</s>\t0
-0.4\ta\t-0.2

\\2-grams:
-0.1\t<s> a
-0.2\ta </s>

\\end\\
"""
LINE = {"a": 9, "<s> a": 12}  # line numbers of two entries


def _write(tmp_path, text):
    p = tmp_path / "lm.arpa"
    p.write_text(text, encoding="utf-8")
    return p


def test_reference_file_reads(tmp_path):
    m = read_arpa(_write(tmp_path, ARPA))
    # p(a | <s>) = 10^-0.1, p(</s> | a) = 10^-0.2: the file's own values
    assert m.score_sentences([["a"]]).tokens == 2
    assert math.isclose(m.score_sentences([["a"]]).logprob, -0.3, abs_tol=1e-6)


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "0.5", "1e3"])
@pytest.mark.parametrize("entry", ["a", "<s> a"])
def test_bad_log_probability_is_rejected_with_its_line(tmp_path, bad, entry):
    good = "-0.4\ta\t-0.2" if entry == "a" else "-0.1\t<s> a"
    text = ARPA.replace(good, good.replace(good.split("\t")[0], bad, 1))
    with pytest.raises(InputError, match=rf"line {LINE[entry]}: log10 probability") as e:
        read_arpa(_write(tmp_path, text))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_bad_backoff_is_rejected_with_its_line(tmp_path, bad):
    text = ARPA.replace("-0.4\ta\t-0.2", f"-0.4\ta\t{bad}")
    with pytest.raises(InputError, match=rf"line {LINE['a']}: back-off weight"):
        read_arpa(_write(tmp_path, text))


def test_nan_is_not_a_fill_in_marker(tmp_path):
    """Order 3 with a trigram whose bigram prefix is missing: the reader adds the prefix and
    computes its probability by back-off; a NaN in the file is rejected, never 'filled in'."""
    text = ARPA.replace("ngram 2=2\n", "ngram 2=2\nngram 3=1\n").replace(
        "\\end\\", "\\3-grams:\n-0.05\t<s> a </s>\n\n\\end\\"
    )
    m = read_arpa(_write(tmp_path, text))  # prefix "<s> a" exists; fine
    assert math.isclose(m.score_sentences([["a"]]).logprob, -0.15, abs_tol=1e-6)
    nan_bigram = text.replace("-0.2\ta </s>", "nan\ta </s>")
    with pytest.raises(InputError, match="line 14: log10 probability"):
        read_arpa(_write(tmp_path, nan_bigram))


def test_added_prefix_probability_is_the_backoff_value(tmp_path):
    # trigram "a a </s>" needs the bigram "a a", absent from the file: its probability must be
    # bo(a) + log10 p(a) = -0.2 + -0.4 (hand-computed), every stored value finite
    text = ARPA.replace("ngram 2=2\n", "ngram 2=2\nngram 3=1\n").replace(
        "\\end\\", "\\3-grams:\n-0.05\ta a </s>\n\n\\end\\"
    )
    m = read_arpa(_write(tmp_path, text))
    assert all(np.isfinite(lp).all() for lp in m.logp)
    assert math.isclose(m.logprob("a", ["a"]), -0.6, abs_tol=1e-9)
    ids = [m.vocab.index[w] for w in ("a", "a")]
    key = ids[0] * m.V + ids[1]
    pos = int(np.searchsorted(m.keys[1], key))
    assert m.keys[1][pos] == key
    assert math.isclose(m.logp[1][pos], -0.6, abs_tol=1e-9)


def _small_model():
    sents = [["a", "b", "a"], ["b", "a"], ["a", "a", "b"]]
    return train(sents, 2)


@pytest.mark.parametrize("drop", ["logp2", "bo1", "keys1"])
def test_npz_missing_key_is_one_line_error(tmp_path, drop, capsys):
    p = tmp_path / "lm.npz"
    _small_model().save(p)
    with np.load(p) as z:
        arrays = {k: z[k] for k in z.files if k != drop}
    np.savez(p, **arrays)
    with pytest.raises(InputError, match=f"missing '{drop}'") as e:
        load_model(p)
    assert "\n" not in str(e.value)
    text = tmp_path / "t.txt"
    text.write_text("a b\n")
    assert main(["ngram", "score", "--lm", str(p), "--text", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"temperature": 0.0},
        {"seed": -1},
        {"seed": 2**63},
    ],
)
def test_sample_rejects_bad_settings(kw):
    with pytest.raises(ConfigError):
        _small_model().sample(2, **kw)


def test_a_tiny_temperature_samples_the_likeliest_word():
    """p ** (1 / t) for t = 1e-320 underflowed to 0 for every word, and sampling stopped at
    once (empty sentences, exit 0); relative to the likeliest word it is greedy decoding:
    every word drawn (and the end, when a sentence ends early) is a most likely one."""
    import warnings

    m = _small_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning on the way either
        samples = m.sample(5, temperature=1e-320, max_len=4, seed=0)
    for sent in samples:
        assert sent, "an empty sentence"
        ctx = ["<s>"]
        for w in [*sent, "</s>"][:4]:
            p = m.distribution(ctx)
            assert p[m.vocab.encode([w])[0]] == p.max(), (sent, w)
            ctx.append(w)


def test_written_arpa_reads_back(tmp_path):
    m = _small_model()
    write_arpa(m, tmp_path / "m.arpa")
    back = read_arpa(tmp_path / "m.arpa")
    got = back.score_sentences([["a", "b"]]).logprob
    assert math.isclose(got, m.score_sentences([["a", "b"]]).logprob, abs_tol=1e-5)


def test_an_order_beyond_max_order_is_refused_at_once(tmp_path, capsys):
    """Counting and estimating loop over every order: ``--order 1000000`` ran past a minute on
    a 2 KB text. Both trainers refuse orders above MAX_ORDER; MAX_ORDER itself trains."""
    import time

    from attnlm.ngram import train_arpa
    from attnlm.ngram.counts import MAX_ORDER

    sents = [["a", "b", "a"], ["b", "a"]]
    assert train(sents, MAX_ORDER).order == MAX_ORDER
    for bad in (MAX_ORDER + 1, 10**6):
        with pytest.raises(ConfigError, match=f"order must be in 1..{MAX_ORDER}, got {bad}"):
            train(sents, bad)
        with pytest.raises(ConfigError, match=f"order must be in 1..{MAX_ORDER}"):
            train_arpa(iter(["a b a\n"]), bad, tmp_path / "m.arpa", memory="1M")
    text = tmp_path / "t.txt"
    text.write_text("a b a\nb a\n", encoding="utf-8")
    start = time.monotonic()
    argv = ["ngram", "train", "--order", "1000000", "--text", str(text), "--arpa"]
    argv.append(str(tmp_path / "x.arpa"))
    assert main(argv) == 2 and time.monotonic() - start < 30
    assert capsys.readouterr().err.count("\n") == 1
