"""Corpora, splits, token windows and pretrained model files by name."""

from attnlm.data.corpus import (
    cache_dir,
    default_corpus,
    default_corpus_path,
    load_text,
    read_text,
    split_text,
    text_info,
)
from attnlm.data.pretrained import PRETRAINED, pretrained_names, pretrained_path
from attnlm.data.windows import (
    TokenFile,
    Windows,
    bits_per_char,
    read_token_file,
    token_dtype,
    write_token_file,
)

__all__ = [
    "cache_dir",
    "default_corpus",
    "default_corpus_path",
    "load_text",
    "read_text",
    "split_text",
    "text_info",
    "PRETRAINED",
    "pretrained_names",
    "pretrained_path",
    "TokenFile",
    "Windows",
    "bits_per_char",
    "read_token_file",
    "token_dtype",
    "write_token_file",
]
