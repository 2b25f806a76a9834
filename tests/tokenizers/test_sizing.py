"""The vocabulary size sized from the data (``bpe_vocab_size = 0``): the rule of thumb by
hand on small texts, its floor and cap, and its use by pair tokenizers and text runs."""

from __future__ import annotations

from attnlm.tokenizers.sizing import (
    MAX_VOCAB,
    MIN_VOCAB,
    WORDS_PER_TOKEN,
    repeated_words,
    vocab_size_for,
)


def test_repeated_words_by_hand():
    # "a" x3, "b" x2, "c" x1, "d" x2 (across texts), "é" x2: four words seen twice or more
    assert repeated_words(["a b a c", "a b d", "d é, é!"]) == 4
    assert repeated_words([]) == 0


def test_vocab_size_rule_floor_and_cap():
    assert vocab_size_for(["a b c"]) == MIN_VOCAB  # nothing repeated: the floor
    words = [f"w{i}" for i in range(4000)]
    text = " ".join(words * 2)  # 4000 distinct words, each twice
    raw = 256 + WORDS_PER_TOKEN * 4000
    want = max(MIN_VOCAB, min(MAX_VOCAB, 64 * -(-int(raw) // 64)))
    assert vocab_size_for([text]) == want and want % 64 == 0
    many = " ".join(f"x{i} x{i}" for i in range(100_000))
    assert vocab_size_for([many]) == MAX_VOCAB


def test_pair_tokenizers_size_from_data():
    from attnlm.data.pairs import (
        Pair,
        PairTokenizerConfig,
        register_pair_tokenizer_kind,
        train_pair_tokenizers,
    )
    from attnlm.tokenizers import train_tokenizer

    asked = []

    def trainer(texts, vocab_size, specials):  # records the size it is asked for
        asked.append((len(texts), vocab_size))
        return train_tokenizer("char", "".join(texts), unk=True)

    register_pair_tokenizer_kind("sizing-test", trainer)
    pairs = [Pair(f"word{i} is here", f"mot{i} est ici") for i in range(700)] * 2
    sources, targets = [p.source for p in pairs], [p.target for p in pairs]
    train_pair_tokenizers(pairs, PairTokenizerConfig(kind="sizing-test", vocab_size=0))
    assert asked == [(2 * len(pairs), vocab_size_for(sources + targets))]
    asked.clear()
    cfg = PairTokenizerConfig(kind="sizing-test", vocab_size=0, shared=False)
    train_pair_tokenizers(pairs, cfg)  # one per side, each sized from its own side
    assert asked == [(len(pairs), vocab_size_for(sources)), (len(pairs), vocab_size_for(targets))]
    asked.clear()
    train_pair_tokenizers(pairs, PairTokenizerConfig(kind="sizing-test", vocab_size=700))
    assert asked == [(2 * len(pairs), 700)]  # an explicit size is kept
    assert vocab_size_for(sources) > MIN_VOCAB  # the data is large enough to leave the floor
