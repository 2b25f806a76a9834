"""Byte-level BPE as in GPT-2 and later (tiktoken's ``gpt2``/``cl100k_base`` scheme).

Encoding:

1. *Special tokens* (e.g. ``<|endoftext|>``) allowed by the caller are cut out of the text and
   get their own ids; a special token that is not allowed raises
   :class:`DisallowedSpecialTokenError` (tiktoken's ``allowed_special``/``disallowed_special``).
2. *Pre-tokenization*: a regex splits each stretch of ordinary text into chunks (built-in
   patterns ``gpt2`` and ``cl100k``, or any regex for the ``regex`` module); merges never
   cross chunk boundaries. A custom regex must have no capturing groups and must not match
   the empty string (checked when training and loading); a character it does not cover
   becomes a chunk of its own (:func:`split_pattern`), so ``decode(encode(text)) == text``
   for every pattern and both engines split alike.
3. *Merging*: each chunk's UTF-8 bytes start as single-byte tokens; the adjacent pair whose
   concatenation has the lowest rank is merged (the leftmost one on ties) until no adjacent
   pair is in the vocabulary. The token id is the rank.

Any Unicode string round-trips exactly (lone surrogates, which are not Unicode scalar values,
are replaced by U+FFFD first, as tiktoken does).

Two engines give the same ids: ``"python"`` (compiled regex (stdlib ``re`` on ASCII stretches
for the built-in patterns, :mod:`attnlm.tokenizers.split`), bounded per-chunk cache,
lowest-rank merge loop; a heap-based loop for long chunks) and ``"tiktoken"`` (our ranks,
pattern and special tokens handed to ``tiktoken.Encoding``). ``engine="auto"`` picks tiktoken
when it is installed and accepts the pattern.

Training (:meth:`BPETokenizer.train`) counts the pre-tokenized chunks of the text and learns
merges over their bytes with :func:`attnlm.tokenizers.training.learn_merges`: incremental
pair counts, a pair-to-words index and a lazy max-heap. **Ids and tie-break**: the 256 single
bytes get ids 0..255 in GPT-2's byte order (the printable bytes ``!``..``~``, ``¡``..``¬``,
``®``..``ÿ`` first, then the others in byte order, as in the ``gpt2`` and ``cl100k`` rank
files); merged tokens get 256, 257, ... in order of creation. Among pairs with equal counts
the one with the smallest ``(left id, right id)`` is merged first. This is exactly the rule of
Hugging Face ``tokenizers``' byte-level ``BpeTrainer`` (its alphabet is sorted by the GPT-2
byte-to-unicode characters, which is the same order), so both learn the same merges.

One job per module:

* :mod:`~attnlm.tokenizers.bpe.patterns`: pre-tokenization (step 2: the patterns, their
  validation, splitting and chunk counting; special-token cutting and surrogate repair);
* :mod:`~attnlm.tokenizers.bpe.merge`: merging (step 3: GPT-2's byte order, the two merge
  loops, merges recovered from ranks);
* :mod:`~attnlm.tokenizers.bpe.train`: the trainer;
* :mod:`~attnlm.tokenizers.bpe.files`: the JSON fields of a tokenizer file;
* :mod:`~attnlm.tokenizers.bpe.tokenizer`: :class:`BPETokenizer` (step 1, both engines, the
  per-chunk cache, decoding).

Every name is importable from ``attnlm.tokenizers.bpe`` itself.
"""

from attnlm.tokenizers.bpe.files import from_fields, to_fields
from attnlm.tokenizers.bpe.merge import (
    GPT2_BYTE_ORDER,
    LONG_CHUNK,
    recover_merges,
)
from attnlm.tokenizers.bpe.merge import _merge_long as _merge_long  # tests compare the two loops
from attnlm.tokenizers.bpe.merge import _merge_short as _merge_short
from attnlm.tokenizers.bpe.patterns import (
    GPT2_PUBLISHED,
    PATTERNS,
    UNCOVERED,
    count_chunks,
    resolve_pattern,
    split_pattern,
)
from attnlm.tokenizers.bpe.tokenizer import (
    DEFAULT_CACHE_SIZE,
    BPETokenizer,
    Engine,
    SpecialSet,
    tiktoken_available,
)
from attnlm.tokenizers.bpe.train import learn_ranks

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "GPT2_BYTE_ORDER",
    "GPT2_PUBLISHED",
    "LONG_CHUNK",
    "PATTERNS",
    "UNCOVERED",
    "BPETokenizer",
    "Engine",
    "SpecialSet",
    "count_chunks",
    "from_fields",
    "learn_ranks",
    "recover_merges",
    "resolve_pattern",
    "split_pattern",
    "tiktoken_available",
    "to_fields",
]
