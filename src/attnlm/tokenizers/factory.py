"""The one tokenizer factory: train a tokenizer of any kind by name, or load one from a file,
and encode text with errors that name what could not be encoded.

``attnlm tokenize train``, training runs (``train.tokenizer = "char" | "bpe" | PATH``) and
sentence-pair data all build their tokenizers here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlm.errors import AttnlmError, ConfigError, InputError
from attnlm.tokenizers.base import Tokenizer, TokenizerConfigError, load
from attnlm.tokenizers.bpe import BPETokenizer
from attnlm.tokenizers.char import CharTokenizer
from attnlm.tokenizers.classic_bpe import ClassicBPETokenizer
from attnlm.tokenizers.word import WordTokenizer
from attnlm.tokenizers.wordpiece import WordPieceTokenizer

# kinds that need a vocabulary size to train
SIZED_KINDS = ("bpe", "classic-bpe", "wordpiece")
TRAINABLE_KINDS = ("char", "word", "classic-bpe", "bpe", "wordpiece")


def train_tokenizer(
    kind: str,
    text: str,
    vocab_size: int | None = None,
    *,
    unk: bool = False,
    min_freq: int | None = None,
    pattern: str | None = None,
    special_tokens: list[str] | None = None,
    lowercase: bool = True,
) -> Tokenizer:
    """Train a tokenizer of ``kind`` (one of :data:`TRAINABLE_KINDS`) on ``text``.
    ``min_freq``: word: minimum count (default 1); wordpiece: minimum pair count to merge
    (default 0). ``lowercase``: wordpiece only (BERT uncased)."""
    if kind not in TRAINABLE_KINDS:
        raise TokenizerConfigError(
            f"unknown tokenizer kind {kind!r} (known: {', '.join(TRAINABLE_KINDS)})"
        )
    if kind in SIZED_KINDS and vocab_size is None:
        raise TokenizerConfigError(f"tokenizer kind {kind} needs a vocabulary size")
    if kind == "char":
        return CharTokenizer.train(text, unk=unk)
    if kind == "word":
        return WordTokenizer.train(text, min_freq=min_freq or 1, max_size=vocab_size)
    if kind == "wordpiece":
        return WordPieceTokenizer.train(
            text, vocab_size, min_frequency=min_freq or 0, lowercase=lowercase
        )
    if kind == "classic-bpe":
        return ClassicBPETokenizer.train(text, vocab_size)
    kwargs: dict[str, Any] = {"special_tokens": special_tokens or None}
    if pattern is not None:
        kwargs["pattern"] = pattern
    return BPETokenizer.train(text, vocab_size, **kwargs)


def make_tokenizer(spec: str, text: str, train_text: str, vocab_size: int | None) -> Tokenizer:
    """A run's tokenizer from its spec: ``char`` (alphabet of the whole ``text``, so
    validation characters are encodable), another trainable kind (trained on ``train_text``
    only), or a path to a saved tokenizer file."""
    if spec == "char":
        return train_tokenizer("char", text)
    if spec in TRAINABLE_KINDS:
        return train_tokenizer(spec, train_text, vocab_size)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"train.tokenizer must be {', '.join(TRAINABLE_KINDS)} or a tokenizer file; "
            f"{spec!r} is none"
        )
    return load(path)


def encode_text(tokenizer: Any, text: str, what: str) -> list[int]:
    """Encode ``text``; characters the tokenizer cannot encode raise InputError naming
    ``what`` (e.g. "validation text")."""
    try:
        return list(tokenizer.encode(text))
    except AttnlmError as e:
        raise InputError(f"{what}: the tokenizer cannot encode this text ({e})") from None
    except (KeyError, ValueError) as e:
        raise InputError(f"{what}: the tokenizer cannot encode this text ({e})") from None


def token_label(tokenizer: Any, token_id: int) -> str:
    """A readable string for one token id (for plots and the explorer): the token's text, its
    bytes' UTF-8 with escapes for a byte-level piece that ends inside a character."""
    if hasattr(tokenizer, "token_bytes"):
        return tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")
    if isinstance(tokenizer, ClassicBPETokenizer):
        from attnlm.tokenizers.classic_bpe import END

        return tokenizer.token_text(token_id).replace(END, " ")
    if hasattr(tokenizer, "token_text"):
        return tokenizer.token_text(token_id)
    return tokenizer.decode([token_id])
