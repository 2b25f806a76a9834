"""BLEU and chrF through sacrebleu, checked against values computed by hand."""

import math

import pytest

pytest.importorskip("sacrebleu")

from attnlm.base.errors import ConfigError, InputError  # noqa: E402
from attnlm.loading.scores import corpus_bleu, corpus_chrf, translation_scores  # noqa: E402

# Two sentences, lower case, no punctuation: the 13a tokenizer leaves them as they are.
HYPS = ["the cat sat on the mat", "there is a big dog"]
REFS = ["the cat is on the mat", "there is a big dog here"]


def test_bleu_by_hand():
    # Modified (clipped) n-gram precisions, summed over both sentences:
    # 1-grams: the x2, cat, on, mat match (sat does not): 5/6; sentence 2: 5/5      -> 10/11
    # 2-grams: "the cat", "on the", "the mat" of 5; all 4 of sentence 2             -> 7/9
    # 3-grams: "on the mat" of 4; "there is a", "is a big", "a big dog" of 3        -> 4/7
    # 4-grams: none of 3; "there is a big", "is a big dog" of 2                     -> 2/5
    p = [10 / 11, 7 / 9, 4 / 7, 2 / 5]
    c, r = 6 + 5, 6 + 6  # output and reference lengths
    bp = math.exp(1 - r / c)  # c < r
    expected = 100 * bp * math.exp(sum(math.log(x) for x in p) / 4)
    s = corpus_bleu(HYPS, REFS)
    assert s.score == pytest.approx(expected, abs=1e-9)
    assert s.precisions == pytest.approx([100 * x for x in p])
    assert s.brevity_penalty == pytest.approx(bp)
    assert (s.hyp_len, s.ref_len) == (11, 12) and s.length_ratio == pytest.approx(11 / 12)
    assert s.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert s.to_dict()["precisions"] == list(s.precisions)


def test_bleu_perfect_and_settings():
    assert corpus_bleu(REFS, REFS).score == pytest.approx(100.0)
    # no brevity penalty when the output is longer than the references
    longer = corpus_bleu([r + " too" for r in REFS], REFS)
    assert longer.brevity_penalty == 1.0
    # lowercase changes the score; the signature records it
    upper = ["The Cat is on the mat", "There is a big dog here"]
    assert corpus_bleu(upper, REFS).score < 100
    low = corpus_bleu(upper, REFS, lowercase=True)
    assert low.score == pytest.approx(100.0) and "case:lc" in low.signature
    # punctuation is split off by 13a, not by the "none" tokenizer
    assert corpus_bleu(["a b c d."], ["a b c d ."]).score == pytest.approx(100.0)
    assert corpus_bleu(["a b c d."], ["a b c d ."], tokenize="none").score < 100


def test_bleu_multiple_references():
    hyp = ["the cat sat on the mat"]
    refs = [["the cat is on the mat", "a cat sat on a mat today"]]
    s = corpus_bleu(hyp, refs)
    # clipping takes the maximum count over references:
    # 1-grams 6/6, 2-grams 5/5 ("cat sat", "sat on" from the second), 3-grams 2/4
    # ("cat sat on", "on the mat"), 4-grams 0/3, which "exp" smoothing (mteval's) turns into
    # 1 / (2 * 3): the k-th zero precision becomes 1 / (2**k * total)
    assert s.precisions == pytest.approx([100.0, 100.0, 50.0, 100 / (2 * 3)])
    bp = math.exp(1 - 6 / 6)
    assert s.score == pytest.approx(100 * bp * (1 * 1 * 0.5 * (1 / 6)) ** 0.25)
    unsmoothed = corpus_bleu(hyp, refs, smooth="none")
    assert unsmoothed.precisions[3] == 0.0 and unsmoothed.score == 0.0
    assert "smooth:none" in unsmoothed.signature
    assert s.ref_len == 6  # the reference length closest to the output's
    assert s.signature.startswith("nrefs:2|")
    # a variable number of references per sentence
    v = corpus_bleu(HYPS, [[REFS[0], "x y z"], REFS[1]])
    assert v.signature.startswith("nrefs:var|")
    assert v.score == pytest.approx(corpus_bleu(HYPS, REFS).score)


def test_chrf_by_hand():
    # Spaces are removed: "thecat" vs "thecats" and "adog" vs "adog". For order n the first
    # sentence has 7-n output n-grams, 8-n reference n-grams, all 7-n matching; the second has
    # max(5-n, 0) of each. Counts are summed over the corpus, then per-order precision (all 1
    # here) and recall are averaged and combined as F-beta with beta = 2.
    hyp_counts = [(7 - n) + max(5 - n, 0) for n in range(1, 7)]
    ref_counts = [(8 - n) + max(5 - n, 0) for n in range(1, 7)]
    precision = 1.0
    recall = sum(h / r for h, r in zip(hyp_counts, ref_counts)) / 6
    expected = 100 * (1 + 4) * precision * recall / (4 * precision + recall)
    s = corpus_chrf(["the cat", "a dog"], ["the cats", "a dog"])
    assert s.score == pytest.approx(expected, abs=1e-9)
    assert (s.char_order, s.word_order, s.beta) == (6, 0, 2)
    assert "nc:6|nw:0" in s.signature
    pp = corpus_chrf(["the cat", "a dog"], ["the cats", "a dog"], word_order=2)
    assert "nw:2" in pp.signature and pp.score != s.score


def test_translation_scores_dict():
    d = translation_scores(HYPS, REFS)
    assert d["bleu"] == pytest.approx(corpus_bleu(HYPS, REFS).score)
    assert d["chrf"] == pytest.approx(corpus_chrf(HYPS, REFS).score)
    assert d["sentences"] == 2 and d["bleu_signature"] and d["chrf_signature"]


@pytest.mark.parametrize(
    "hyps, refs, message",
    [
        (["a"], ["a", "b"], "1 hypotheses but 2 references"),
        ([], [], "no sentences"),
        ("abc", ["a", "b", "c"], "not one string"),
        (["a"], [[]], "non-empty list"),
        ([None], ["a"], "not a string"),
    ],
)
def test_bad_input(hyps, refs, message):
    with pytest.raises(InputError, match=message):
        corpus_bleu(hyps, refs)


def test_bad_settings():
    with pytest.raises(ConfigError, match="smoothing"):
        corpus_bleu(HYPS, REFS, smooth="magic")
    with pytest.raises(ConfigError, match="tokenizer"):
        corpus_bleu(HYPS, REFS, tokenize="nope")
    with pytest.raises(ConfigError, match="word_order"):
        corpus_chrf(HYPS, REFS, word_order=-1)
