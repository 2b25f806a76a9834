"""Parallel data: sentence pairs read from tab-separated files, split, filtered and tokenized.

File format (the Tatoeba / manythings.org layout)::

    source<TAB>target[<TAB>anything else]      one pair per line, UTF-8

One job per module, each with its own docstring for the details:

* :mod:`~attnlm.data.pairs.read`: reading (:func:`read_pairs`, :func:`parse_pairs`) and
  writing (:func:`write_pairs`) pairs files; how every irregularity (CRLF, byte order mark,
  header line, missing tab, empty side, non-UTF-8 bytes) is handled, leniently by default or
  with ``strict=True``, and reported in a :class:`PairsReport`, so nothing disappears silently.
* :mod:`~attnlm.data.pairs.split`: the deterministic train / validation / test split
  (:func:`split_pairs`), grouped by source sentence and ordered by a keyed BLAKE2b hash, so it
  is independent of file order and Python version; :func:`group_references` for
  multi-reference BLEU.
* :mod:`~attnlm.data.pairs.filter`: the length filter (:func:`filter_pairs`).
* :mod:`~attnlm.data.pairs.tokenizers`: the source and target tokenizers
  (:func:`train_pair_tokenizers`, :class:`PairTokenizers`): one shared or one per side, of any
  trainable kind, with the sequence-to-sequence special tokens ``<pad>``, ``<s>``, ``</s>``
  (:class:`SpecialIds`) and the start / end token rules of a :class:`PairTokenizerConfig`.
* :mod:`~attnlm.data.pairs.encode`: pairs as token ids ready to batch (:func:`encode_pairs`,
  :class:`EncodedPairs`).

Every name is importable from ``attnlm.data.pairs`` itself.
"""

from attnlm.data.pairs.encode import EncodedPairs, encode_pairs
from attnlm.data.pairs.filter import filter_pairs
from attnlm.data.pairs.read import (
    FIRST_LINES,
    HEADER_NAMES,
    SKIP_REASONS,
    HeaderMode,
    Pair,
    PairsReport,
    decode_utf8,
    looks_like_header,
    parse_pairs,
    read_pairs,
    write_pairs,
)
from attnlm.data.pairs.split import (
    RUN_PAIRS_DIR,
    RUN_SPLIT_SEED,
    PairSplits,
    group_references,
    split_pairs,
    stable_hash,
)
from attnlm.data.pairs.tokenizers import (
    PairTokenizerConfig,
    PairTokenizers,
    PairTrainer,
    SpecialIds,
    register_pair_tokenizer_kind,
    special_ids,
    train_pair_tokenizers,
)

__all__ = [
    "FIRST_LINES",
    "HEADER_NAMES",
    "RUN_PAIRS_DIR",
    "RUN_SPLIT_SEED",
    "SKIP_REASONS",
    "EncodedPairs",
    "HeaderMode",
    "Pair",
    "PairSplits",
    "PairTokenizerConfig",
    "PairTokenizers",
    "PairTrainer",
    "PairsReport",
    "SpecialIds",
    "decode_utf8",
    "encode_pairs",
    "filter_pairs",
    "group_references",
    "looks_like_header",
    "parse_pairs",
    "read_pairs",
    "register_pair_tokenizer_kind",
    "special_ids",
    "split_pairs",
    "stable_hash",
    "train_pair_tokenizers",
    "write_pairs",
]
