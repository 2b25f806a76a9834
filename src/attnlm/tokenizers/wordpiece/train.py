"""The WordPiece trainer: the algorithm of Hugging Face ``tokenizers``' ``WordPieceTrainer``.

BPE merges (:func:`attnlm.tokenizers.training.learn_merges`) over the words of BERT's basic
tokenisation, where every character after the first of a word is a ``##`` continuation
symbol; the vocabulary order and the tie-break (smallest ids, alphabet in code-point order, so
the same result on every machine) are described in :mod:`attnlm.tokenizers.wordpiece`.
"""

from __future__ import annotations

from collections import Counter

from attnlm.tokenizers.base import TokenizerConfigError
from attnlm.tokenizers.training import learn_merges
from attnlm.tokenizers.wordpiece.basic import PREFIX, SPECIAL_TOKENS


def learn_vocab(word_counts: Counter[str], vocab_size: int, min_frequency: int = 0) -> list[str]:
    """The vocabulary (special tokens first, ids 0-4) of at most ``vocab_size`` tokens learned
    from ``word_counts`` (normalised, pre-tokenized words and their counts); ``min_frequency``:
    stop when the best pair is rarer."""
    if not word_counts:
        raise TokenizerConfigError("cannot train a WordPiece vocabulary on text without words")
    # Symbols: "\x00c" is a word-initial piece (NUL never survives clean_text), "c" a
    # continuation; so string concatenation of two symbols is the merged symbol.
    # Alphabet as tokenizers': every character as a word-initial piece (so a word may
    # start with any character seen in training), plus "##c" for characters seen inside
    # words; code-point order, so ties (smallest pair of ids) break the same everywhere.
    firsts = sorted({c for w in word_counts for c in w})
    conts = sorted({c for w in word_counts for c in w[1:]})
    symbols: list[str] = ["\x00" + c for c in firsts] + conts
    n_base = len(SPECIAL_TOKENS) + len(symbols)
    if vocab_size < n_base:
        raise TokenizerConfigError(
            f"vocab_size {vocab_size} is below the {len(SPECIAL_TOKENS)} special tokens plus "
            f"{len(symbols)} characters of this text (use at least {n_base})"
        )
    sid = {s: i for i, s in enumerate(symbols)}
    words = [[sid["\x00" + w[0]]] + [sid[c] for c in w[1:]] for w in word_counts]
    counts = list(word_counts.values())
    learn_merges(
        words,
        counts,
        symbols,
        vocab_size - len(SPECIAL_TOKENS),
        min_frequency=min_frequency,
    )
    seen: set[str] = set()
    vocab = list(SPECIAL_TOKENS)
    for s in symbols:
        tok = s[1:] if s.startswith("\x00") else PREFIX + s
        if tok not in seen and tok not in SPECIAL_TOKENS:
            seen.add(tok)
            vocab.append(tok)
    return vocab
