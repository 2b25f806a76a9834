"""Corpora, splits and token windows."""

from attnlm.data.corpus import (
    cache_dir,
    default_corpus,
    default_corpus_path,
    load_text,
    read_text,
    split_text,
    text_info,
)

__all__ = [
    "cache_dir",
    "default_corpus",
    "default_corpus_path",
    "load_text",
    "read_text",
    "split_text",
    "text_info",
]
