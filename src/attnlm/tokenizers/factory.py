"""The one tokenizer factory: train a tokenizer of any kind by name, or load one from a file,
and encode text with errors that name what could not be encoded.

``attnlm tokenize train``, training runs (``train.tokenizer = "char" | "bpe" | PATH``) and
sentence-pair data all build their tokenizers here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlm.base.errors import AttnlmError, ConfigError, InputError
from attnlm.tokenizers.base import Tokenizer, TokenizerConfigError, load
from attnlm.tokenizers.bpe import BPETokenizer, split_pattern
from attnlm.tokenizers.char import CharTokenizer
from attnlm.tokenizers.classic_bpe import ClassicBPETokenizer
from attnlm.tokenizers.split import Splitter
from attnlm.tokenizers.word import WordTokenizer
from attnlm.tokenizers.wordpiece import WordPieceTokenizer

# kinds that need a vocabulary size to train
SIZED_KINDS = ("bpe", "classic-bpe", "wordpiece")
TRAINABLE_KINDS = ("char", "word", "classic-bpe", "bpe", "wordpiece")
# published tokenizers a run names instead of training one (see attnlm.tokenizers.gpt2)
PRETRAINED_KINDS = ("gpt2",)


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


def make_tokenizer(
    spec: str, text: str, train_text: str, vocab_size: int | None, *, unk: bool = False
) -> Tokenizer:
    """A run's tokenizer from its spec: ``char`` (alphabet of the whole ``text``, so
    validation characters are encodable; ``unk``: one more id, ``<unk>``, for characters
    the text does not have, so other texts can be evaluated), another trainable kind (trained
    on ``train_text`` only), ``gpt2`` (GPT-2's published tokenizer), or a path to a saved
    tokenizer file."""
    if spec == "char":
        return train_tokenizer("char", text, unk=unk)
    if spec in TRAINABLE_KINDS:
        return train_tokenizer(spec, train_text, vocab_size)
    if spec == "gpt2":
        from attnlm.tokenizers.gpt2 import gpt2_tokenizer

        return gpt2_tokenizer()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"train.tokenizer must be {', '.join(TRAINABLE_KINDS + PRETRAINED_KINDS)} or a "
            f"tokenizer file; {spec!r} is none"
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


# A cut for chunked encoding: just after a line break that a non-space character follows.
_LINE_START = re.compile(r"\n(?=\S)")
# Texts probing whether a byte-level BPE pattern can put a line break and the character after
# it into one piece (then chunks cut at line starts would encode differently).
_LINE_PROBES = (
    "a\nb",
    "a.\nB",
    "a \nb",
    "1\n2",
    "\u00e9\n\u00f1",
    ")\n(",
    "a\n\u4e2d",
    "'\ns",
    "\n\n-",
)
ENCODE_CHUNK_CHARS = 1 << 20


def chunk_safe(tokenizer: Any) -> bool:
    """Whether encoding a text in pieces cut at line starts (after ``\\n``, before a non-space
    character) gives exactly the ids of encoding it whole: true for the built-in kinds (their
    words and pre-tokenizer chunks never cross such a cut), checked on probe texts for a
    byte-level BPE pattern and special tokens; false for unknown tokenizer classes."""
    known = (CharTokenizer, WordTokenizer, ClassicBPETokenizer, WordPieceTokenizer, BPETokenizer)
    if not isinstance(tokenizer, known):
        return False
    if any(_LINE_START.search(s) for s in tokenizer.special_tokens):
        return False
    if isinstance(tokenizer, BPETokenizer):
        split = Splitter(split_pattern(tokenizer.pattern))
        for probe in _LINE_PROBES:
            if any(_LINE_START.search(piece) for piece in split(probe)):
                return False
    return True


def iter_encode(
    tokenizer: Any, text: str, what: str, *span: Any, **options: Any
) -> Iterator[list[int]]:
    """The ids of ``text[start:end]`` in pieces of about ``chunk_chars`` characters (cut at
    line starts, see :func:`chunk_safe`), so a long text is encoded without a list of every
    id; concatenated they equal ``encode_text(tokenizer, text[start:end], what)``. A tokenizer
    that is not :func:`chunk_safe`, or a text without line starts, is encoded in one piece.
    ``start``, ``end`` and ``chunk_chars`` as :func:`iter_encode_spans` takes them."""
    for _, _, ids in iter_encode_spans(tokenizer, text, what, *span, **options):
        yield ids


def iter_encode_spans(
    tokenizer: Any,
    text: str,
    what: str,
    start: int = 0,
    end: int | None = None,
    chunk_chars: int | None = None,
) -> Iterator[tuple[int, int, list[int]]]:
    """:func:`iter_encode` with the span of each piece: ``(begin, stop, ids of
    text[begin:stop])``."""
    end = len(text) if end is None else end
    chunk_chars = ENCODE_CHUNK_CHARS if chunk_chars is None else chunk_chars
    if not chunk_safe(tokenizer):
        yield start, end, encode_text(tokenizer, text[start:end], what)
        return
    pos = start
    while pos < end:
        stop = end
        if end - pos > chunk_chars:
            m = _LINE_START.search(text, pos + chunk_chars, end)
            if m:
                stop = m.end()
        yield pos, stop, encode_text(tokenizer, text[pos:stop], what)
        pos = stop


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
