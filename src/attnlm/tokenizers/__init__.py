"""Tokenizers: character, word, classic BPE, byte-level BPE, tiktoken rank files, WordPiece,
Hugging Face ``tokenizer.json`` (byte-level BPE, WordPiece), the vocabulary of a GGUF file, the
SentencePiece files of an OPUS-MT (Marian) folder.

All kinds follow one protocol (:class:`Tokenizer`): ``encode``, ``decode``, ``encode_batch``,
``vocab_size``, ``special_tokens``, ``save(path)`` (one JSON file); :func:`load` restores any
kind. See ``docs/tokenizers.md``.
"""

from attnlm.tokenizers.base import (
    DisallowedSpecialTokenError,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerConfigError,
    TokenizerFileError,
    UnknownTokenError,
    load,
)
from attnlm.tokenizers.bpe import PATTERNS, BPETokenizer
from attnlm.tokenizers.char import CharTokenizer
from attnlm.tokenizers.classic_bpe import ClassicBPETokenizer
from attnlm.tokenizers.factory import (
    chunk_safe,
    encode_text,
    iter_encode,
    make_tokenizer,
    token_label,
    train_tokenizer,
)
from attnlm.tokenizers.gguf import GGUFTokenizer
from attnlm.tokenizers.hf_bpe import HFByteBPETokenizer
from attnlm.tokenizers.hf_spm import HFSpmBPETokenizer
from attnlm.tokenizers.marian_spm import MarianSPMTokenizer
from attnlm.tokenizers.tiktoken_io import read_tiktoken, write_tiktoken
from attnlm.tokenizers.word import WordTokenizer, split_words
from attnlm.tokenizers.wordpiece import WordPieceTokenizer

__all__ = [
    "PATTERNS",
    "BPETokenizer",
    "CharTokenizer",
    "ClassicBPETokenizer",
    "DisallowedSpecialTokenError",
    "GGUFTokenizer",
    "HFByteBPETokenizer",
    "HFSpmBPETokenizer",
    "InvalidTokenIdError",
    "MarianSPMTokenizer",
    "Tokenizer",
    "TokenizerConfigError",
    "TokenizerFileError",
    "UnknownTokenError",
    "WordPieceTokenizer",
    "WordTokenizer",
    "chunk_safe",
    "encode_text",
    "iter_encode",
    "load",
    "make_tokenizer",
    "token_label",
    "read_tiktoken",
    "split_words",
    "train_tokenizer",
    "write_tiktoken",
]
