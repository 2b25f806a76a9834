"""Static word embeddings: word2vec skip-gram and CBOW with negative sampling (Mikolov et al.
2013), the word2vec file formats, nearest neighbours, analogies and the standard evaluations
(see docs/word2vec.md).

Typical use::

    from attnlm.word2vec import Word2VecConfig, train_word2vec, WordVectors
    result = train_word2vec(text, Word2VecConfig(dim=100, window=5, epochs=5))
    result.vectors.save("vectors.txt")              # or .bin: word2vec's binary format
    WordVectors.load("vectors.txt").most_similar(["king"], top=10)
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".vocab": "Vocab split_sentences words_of",
        ".vectors": "WordVectors",
        ".train": "Word2VecConfig Progress TrainResult train_word2vec",
        ".evaluate": "evaluate_word_pairs evaluate_word_analogies evaluate_all",
    },
)
