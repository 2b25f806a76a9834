"""word2vec training: the sampling tables against gensim's, the batched step against the
one-pair-at-a-time update, the windows against a plain loop, and a model that learns."""

import numpy as np
import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.word2vec.train import (
    Group,
    NoiseSampler,
    Word2VecConfig,
    batched_step,
    cbow_step,
    make_cbow_batch,
    make_groups,
    reference_step,
    sentence_bounds,
    train_word2vec,
)
from attnlm.word2vec.vocab import Vocab, alias_table, split_sentences

pytestmark = pytest.mark.usefixtures("one_thread")

ANIMALS = "cat dog horse cow sheep goat pig hen duck mouse".split()
NUMBERS = "one two three four five six seven eight nine ten".split()
COMMON = "the a and of".split()


def topic_sentences(n=1500, seed=0):
    """Sentences of one topic each (animals or numbers) sprinkled with common words: words
    of a topic share contexts, so their vectors should end up near each other."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        topic = ANIMALS if k % 2 else NUMBERS
        words = list(rng.choice(topic, 8)) + list(rng.choice(COMMON, 3))
        rng.shuffle(words)
        out.append([str(w) for w in words])
    return out


def test_vocabulary_counts_subsampling_and_noise_match_gensim():
    gensim = pytest.importorskip("gensim.models")
    sentences = topic_sentences(300) + [["rare"] * 2, ["once"]]
    ours = Vocab.build(sentences, min_count=2)
    model = gensim.Word2Vec(min_count=2, sample=1e-3, negative=5)
    model.build_vocab(sentences)
    wv = model.wv
    assert sorted(ours.words) == sorted(wv.index_to_key) and "once" not in ours.words
    assert list(ours.counts) == sorted(ours.counts, reverse=True)
    for w, c in zip(ours.words, ours.counts):
        assert wv.get_vecattr(w, "count") == c
    keep = ours.keep_probabilities(1e-3)
    for w, p in zip(ours.words, keep):  # gensim stores p * 2**32 as an integer
        assert wv.get_vecattr(w, "sample_int") == pytest.approx(p * 2**32, abs=2)
    # gensim's cumulative table of count**0.75 (scaled to 2**31 - 1), in its word order
    ours_p = dict(zip(ours.words, ours.noise()))
    cum = model.cum_table / model.cum_table[-1]
    gensim_p = np.diff(np.concatenate([[0.0], cum]))
    for w, p in zip(wv.index_to_key, gensim_p):
        assert ours_p[w] == pytest.approx(p, rel=1e-6)


def test_alias_table_gives_exactly_the_distribution():
    p = np.random.default_rng(1).random(40) ** 5
    p /= p.sum()
    keep, alias = alias_table(p)
    implied = keep / len(p)
    np.add.at(implied, alias, (1 - keep) / len(p))
    np.testing.assert_allclose(implied, p, atol=1e-15)
    draws = NoiseSampler(p).draw((400_000,), torch.Generator().manual_seed(0)).numpy()
    freq = np.bincount(draws, minlength=len(p)) / len(draws)
    assert np.abs(freq - p).max() < 4 * np.sqrt(p.max() / len(draws))


def plain_windows(ids, sent, reach, start, stop):
    """Per centre word (by position), its context words: a plain loop."""
    out = []
    for i in range(start, stop):  # the window of position i: reach[i] words each side
        r = int(reach[i])
        out.append([int(ids[j]) for j in range(i - r, i + r + 1)
                    if j != i and 0 <= j < len(ids) and sent[j] == sent[i]])  # fmt: skip
    return out


def random_text(n=200, window=4, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30, n).astype(np.int32)
    sent = np.repeat(np.arange(20), 10)[:n].astype(np.int32)
    reach = window - rng.integers(0, window, n)
    return ids, sent, reach


def test_skipgram_groups_are_the_dynamic_windows_of_a_plain_loop():
    ids, sent, reach = random_text()
    neg = torch.randint(0, 30, (140, 3))
    got = {}
    for g in make_groups(ids, sent, reach, 10, 150, 4, neg):
        for b, centre in enumerate(g.centres.tolist()):
            ctx = g.contexts[b][g.valid[b]].tolist()
            got.setdefault(centre, []).append((sorted(ctx), g.negatives[b].tolist()))
    want = {}
    for i, ctx in enumerate(plain_windows(ids, sent, reach, 10, 150)):
        want.setdefault(int(ids[10 + i]), []).append((sorted(ctx), neg[i].tolist()))
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}


@pytest.mark.parametrize("share", [1, 3, 8])
def test_cbow_batch_holds_the_windows_rows_and_columns_of_a_plain_loop(share):
    ids, sent, reach = random_text()
    runs = -(-140 // share)
    neg = torch.randint(0, 30, (runs, 3))
    b = make_cbow_batch(ids, sentence_bounds(sent), reach, 10, 150, neg)
    used = len(b.centres) // runs  # rows per run: share, or fewer when that fits
    assert len(b.centres) == runs * used >= 140 and used <= share
    rows = [b.contexts[o : o + c].tolist() for o, c in zip(b.offsets, b.counts)]
    assert b.counts.tolist() == sorted(b.counts.tolist(), reverse=True)
    assert b.counts.tolist() == [len(r) for r in rows]
    # column j holds the j-th context word of every row that has one, rows in order
    columns = [[r[j] for r in rows if len(r) > j] for j in range(8)]
    assert b.widths == [len(c) for c in columns if c]
    assert b.columns.tolist() == [w for c in columns for w in c]
    # every centre word with its context and the noise words of its run (padding: empty)
    noise = b.negatives.repeat_interleave(used, dim=0).tolist()
    got = sorted(zip(b.centres.tolist(), map(sorted, rows), noise))
    plain = plain_windows(ids, sent, reach, 10, 150)
    assert sorted((c, r) for c, r, _ in got if r) == sorted(
        (int(ids[10 + i]), sorted(r)) for i, r in enumerate(plain) if r
    )
    assert sum(1 for _, r, _ in got if not r) == len(got) - sum(1 for r in plain if r)
    assert noise[::used] == neg.tolist()  # the rows of a run share its noise words


def random_groups(seed=0, vocab=25, dim=8, k=3):
    g = torch.Generator().manual_seed(seed)
    groups = []
    for r in (1, 2, 3):
        b = 6
        centres = torch.randint(0, vocab, (b,), generator=g)
        negatives = torch.randint(0, vocab, (b, k), generator=g)
        negatives[0, 0] = centres[0]  # a noise word equal to the centre word is skipped
        ctx = torch.randint(0, vocab, (b, 2 * r), generator=g)
        valid = torch.rand(b, 2 * r, generator=g) < 0.7
        valid[1] = False  # a centre word with no context at all
        groups.append(Group(centres, torch.where(valid, ctx, 0), negatives, valid=valid))
    syn0 = torch.randn(vocab, dim, generator=g) * 0.3
    syn1 = torch.randn(vocab, dim, generator=g) * 0.3
    return syn0, syn1, groups


def test_skipgram_batched_step_equals_the_pair_by_pair_update():
    syn0, syn1, groups = random_groups()
    for g in groups:  # reference_step computes every gradient from the parameters before
        a0, a1 = syn0.clone(), syn1.clone()  # the batch, so compare one group at a time
        loss_b, n_b = batched_step(a0, a1, [g], 0.05)
        loss_r, n_r = reference_step(syn0, syn1, [g], 0.05, sg=True)
        assert n_b == n_r
        assert loss_b == pytest.approx(loss_r, rel=1e-5)
        torch.testing.assert_close(a0, syn0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a1, syn1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share", [1, 4, 7])
def test_cbow_step_equals_the_word_by_word_update(share):
    g = torch.Generator().manual_seed(share)
    vocab, dim, k, n, window = 25, 8, 3, 40, 3
    ids = torch.randint(0, vocab, (n,), generator=g).numpy()
    ids[5:8] = ids[6]  # a word in its own context, and twice in one window
    sent = np.cumsum(torch.rand(n, generator=g).numpy() < 0.2)  # one-word sentences too
    reach = window - torch.randint(0, window, (n,), generator=g).numpy()
    runs = -(-n // share)
    negatives = torch.randint(0, vocab, (runs, k), generator=g)
    negatives[runs - 1] = torch.arange(k)  # frequent words: seen again in other rows
    b = make_cbow_batch(ids, sentence_bounds(sent), reach, 0, n, negatives)
    b.negatives[0, 0] = b.centres[0]  # a noise word equal to the centre word is skipped
    assert (b.counts == 0).any() and (b.counts == 2 * window).any()
    syn0 = torch.randn(vocab, dim, generator=g) * 0.3
    syn1 = torch.randn(vocab, dim, generator=g) * 0.3
    a0, a1 = syn0.clone(), syn1.clone()
    loss_b, n_b = cbow_step(a0, a1, b, 0.05)
    loss_r, n_r = reference_step(syn0, syn1, [b.as_group()], 0.05, sg=False)
    assert n_b == n_r == int((b.counts > 0).sum())
    assert loss_b == pytest.approx(loss_r, rel=1e-5)
    torch.testing.assert_close(a0, syn0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a1, syn1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sg", [True, False])
def test_a_trained_model_learns_the_topics_and_its_loss_falls(sg):
    cfg = Word2VecConfig(dim=24, window=3, negative=5, min_count=1, epochs=3, sg=sg,
                         sample=0, batch=512, seed=3)  # fmt: skip
    result = train_word2vec(topic_sentences(), cfg)
    assert result.epoch_losses[-1] < result.epoch_losses[0]
    vectors = result.vectors
    same = other = 0
    for topic, rest in ((ANIMALS, NUMBERS), (NUMBERS, ANIMALS)):
        for w in topic:
            near = [x for x, _ in vectors.most_similar([w], top=5)]
            same += sum(x in topic for x in near)
            other += sum(x in rest for x in near)
    # at random, about as many neighbours would come from the other topic
    assert same >= 0.9 * (same + other) and same >= 70
    assert result.words == cfg.epochs * sum(map(len, topic_sentences()))
    assert 0 < result.cpu_seconds and 0 < result.seconds


def test_training_is_deterministic_for_a_seed():
    cfg = Word2VecConfig(dim=8, min_count=1, epochs=1, batch=256, seed=5)
    a = train_word2vec(topic_sentences(200), cfg).vectors.vectors
    b = train_word2vec(topic_sentences(200), cfg).vectors.vectors
    np.testing.assert_array_equal(a, b)


def test_progress_reports_words_and_rates():
    seen = []
    cfg = Word2VecConfig(dim=8, min_count=1, epochs=2, batch=256)
    train_word2vec(topic_sentences(200), cfg, seen.append)
    total = 2 * 200 * 11
    assert seen[-1].words == seen[-1].total_words == total
    assert [p.epoch for p in seen] == sorted(p.epoch for p in seen) and seen[-1].epoch == 2
    assert all(a.words <= b.words for a, b in zip(seen, seen[1:]))
    assert all(a.alpha >= b.alpha for a, b in zip(seen, seen[1:]))
    assert seen[-1].words_per_s > 0 and seen[-1].eta == pytest.approx(0.0)


def test_sentences_are_paragraphs_of_lowercased_words():
    text = "First Citizen:\nBefore we proceed, O'er the hill.\n\nAll:\nSpeak, speak.\n \n"
    assert split_sentences(text) == [
        ["first", "citizen", "before", "we", "proceed", "o'er", "the", "hill"],
        ["all", "speak", "speak"],
    ]


def test_bad_settings_and_texts_are_one_line_errors():
    with pytest.raises(ConfigError, match="dim must be an integer >= 1"):
        Word2VecConfig(dim=0)
    with pytest.raises(ConfigError, match="sample"):
        Word2VecConfig(sample=1.5)
    with pytest.raises(InputError, match="no word occurs --min-count 5 times"):
        train_word2vec("just a few words", Word2VecConfig())
