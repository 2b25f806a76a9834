"""The tokenizer protocol, its errors, and the single-file JSON format shared by every kind.

Every tokenizer maps text to a list of integer ids and back:

* ``encode(text) -> list[int]`` and ``decode(ids) -> str``; ``encode_batch(texts)``;
* ``vocab_size``: one more than the largest id it can produce;
* ``special_tokens``: ``{token string: id}`` for reserved tokens (``<unk>``, ``<|endoftext|>``);
* ``save(path)`` writes one JSON file; :func:`load` restores any kind from it.

File format (UTF-8 JSON object)::

    {"format": "attnlm-tokenizer", "version": 1, "kind": "<kind>", ...fields of that kind...}

The kind's own fields are documented on each class (``to_dict``).
"""

from __future__ import annotations

import inspect
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.fileio import atomic_write_text, read_file_text
from attnlm.base.foreign import foreign_reader, json_depth_problem, surrogate_problem
from attnlm.base.textio import MAX_LINE

FILE_FORMAT = "attnlm-tokenizer"
FILE_VERSION = 1
UNK = "<unk>"  # the unknown-token string of the char, word and classic BPE kinds (and n-grams)


class UnkFirst:
    """A vocabulary whose id 0 is :data:`UNK`, its one special token (the word and classic
    BPE kinds)."""

    @property
    def special_tokens(self) -> dict[str, int]:
        return {UNK: 0}


#: No token id (rank, special token id) may reach this: 2**21 = 2,097,152, eight times the
#: largest public vocabularies (about 262k). A file declaring larger ids is refused on load
#: instead of making a model allocate an embedding of that many rows.
MAX_VOCAB_SIZE = 1 << 21


class TokenizerConfigError(ConfigError, InputError):
    """A tokenizer setting that cannot work (vocabulary size too small, unknown pattern name).

    It is both a :class:`ConfigError` and an :class:`InputError`, so either catches it.
    """


class UnknownTokenError(InputError):
    """Text contains a character or word the tokenizer has no id for (and no ``<unk>``)."""


class DisallowedSpecialTokenError(InputError):
    """Text contains a special token (e.g. ``<|endoftext|>``) that the caller did not allow."""


class TokenizerFileError(InputError):
    """A tokenizer or rank file is missing, corrupt, or of an unknown kind."""


class InvalidTokenIdError(InputError):
    """``decode`` got an id that is not in the vocabulary."""


_REGISTRY: dict[str, type[Tokenizer]] = {}


def register_kind(cls: type[Tokenizer]) -> type[Tokenizer]:
    """Class decorator: make ``cls`` loadable by :func:`load` under ``cls.kind``."""
    _REGISTRY[cls.kind] = cls
    return cls


class Tokenizer(ABC):
    """Base class of all attnlm tokenizers (see the module docstring for the protocol)."""

    kind: ClassVar[str] = ""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of the token ids ``ids``."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]``."""
        return [self.encode(t) for t in texts]

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """One more than the largest token id."""

    @property
    def special_tokens(self) -> dict[str, int]:
        """Reserved tokens as ``{string: id}`` (empty when the tokenizer has none)."""
        return {}

    def token_text(self, i: int) -> str:
        """Human-readable form of one token id (used by ``attnlm tokenize show``)."""
        return self.decode([i])

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The kind-specific JSON fields (see each class)."""

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer:
        """Rebuild from the fields written by :meth:`to_dict`."""

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this tokenizer to one JSON file (see the module docstring for the format)."""
        doc = {"format": FILE_FORMAT, "version": FILE_VERSION, "kind": self.kind}
        doc.update(self.to_dict())
        text = json.dumps(doc)
        if len(text) > MAX_LINE // 2:  # a large vocabulary (Qwen's 151,936 ids and merges):
            text = json.dumps(doc, indent=0)  # a value per line, which the reader's limit takes
        atomic_write_text(path, text)  # one-line InputError on failure

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


@foreign_reader("tokenizer")
def load(path: str | os.PathLike[str]) -> Tokenizer:
    """Restore a tokenizer of any kind from a file written by ``Tokenizer.save``; also reads
    a BERT ``vocab.txt``, a Hugging Face ``tokenizer.json`` (WordPiece, byte-level or
    SentencePiece-style BPE), a GGUF model file's vocabulary (``*.gguf``), a folder holding
    one of them, or an OPUS-MT folder's SentencePiece files (``source.spm``, ``target.spm``,
    ``vocab.json``). (The kinds register themselves when :mod:`attnlm.tokenizers` is
    imported, which importing this module always does first.)"""
    p = Path(path)
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not (p / "tokenizer.json").is_file() and (p / "source.spm").is_file():
            return _REGISTRY["marian-spm"].from_folder(p)  # an OPUS-MT (Marian) folder
        if not (p / "tokenizer.json").is_file() and len(ggufs) == 1:
            p = ggufs[0]  # a folder holding one GGUF model file (a pretrained name's)
        elif not (p / "tokenizer.json").is_file():
            return _REGISTRY["wordpiece"].from_bert_files(p)
        else:
            p = p / "tokenizer.json"
    if p.suffix.lower() == ".gguf":
        return _REGISTRY["gguf"].from_gguf(p)  # the vocabulary in a GGUF model's metadata
    raw = read_file_text(p, "tokenizer file", TokenizerFileError)
    if not raw.lstrip().startswith("{") and p.suffix == ".txt":
        return _REGISTRY["wordpiece"].from_bert_files(p)  # a BERT vocab.txt
    problem = json_depth_problem(raw)
    if problem:
        raise TokenizerFileError(f"{p}: not a tokenizer file ({problem})")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TokenizerFileError(
            f"{p}: not a tokenizer file (invalid JSON at line {e.lineno}, column {e.colno})"
        ) from None
    problem = surrogate_problem(raw, doc)
    if problem:
        raise TokenizerFileError(f"{p}: not a tokenizer file ({problem})")
    if isinstance(doc, dict) and "format" not in doc and "model" in doc:
        return _load_hf_json(p, doc)  # a Hugging Face tokenizers tokenizer.json
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        raise TokenizerFileError(
            f"{p}: not an attnlm tokenizer file (no 'format': '{FILE_FORMAT}')"
        )
    if doc.get("version") != FILE_VERSION:
        raise TokenizerFileError(f"{p}: unsupported tokenizer file version {doc.get('version')!r}")
    kind = doc.get("kind")
    cls = _REGISTRY.get(kind)  # type: ignore[arg-type]
    if cls is None:
        known = ", ".join(sorted(_REGISTRY))
        raise TokenizerFileError(f"{p}: unknown tokenizer kind {kind!r} (known: {known})")
    try:
        return cls.from_dict(doc)
    except TokenizerFileError as e:
        raise TokenizerFileError(f"{p}: {e}") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
        raise TokenizerFileError(f"{p}: corrupt {kind} tokenizer file ({detail})") from None


#: Hugging Face ``tokenizer.json`` model types -> our kinds (BPE: byte-level, or SentencePiece-
#: style ``hf-spm``)
HF_MODEL_KINDS = {"WordPiece": "wordpiece", "BPE": "hf-bpe"}


def _load_hf_json(p: Path, doc: dict[str, Any]) -> Tokenizer:
    """A Hugging Face ``tokenizer.json`` by its model type; other types are refused."""
    model = doc.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind is None and isinstance(model, dict) and "merges" in model:
        kind = "BPE"  # older files leave the type out
    if kind not in HF_MODEL_KINDS:
        known = ", ".join(HF_MODEL_KINDS)
        raise TokenizerFileError(
            f"{p}: tokenizer.json model type {kind!r} is not supported (supported: {known})"
        )
    if kind == "WordPiece":
        return _REGISTRY["wordpiece"].from_bert_files(p)
    try:
        return _REGISTRY["hf-spm" if _spm_style(doc) else "hf-bpe"](doc)
    except TokenizerFileError as e:
        raise TokenizerFileError(f"{p}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TokenizerFileError(f"{p}: corrupt tokenizer.json ({e})") from None


def _spm_style(doc: dict[str, Any]) -> bool:
    """A SentencePiece-style BPE file (``byte_fallback``, ``▁`` for spaces) rather than a
    byte-level one: its model falls back to bytes, or, with no ``ByteLevel`` pre-tokenizer, it
    has a ``Metaspace`` pre-tokenizer or a ``Prepend`` / ``Replace`` normalizer."""
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    if model.get("byte_fallback"):  # type: ignore[union-attr]
        return True
    text = json.dumps([doc.get("normalizer"), doc.get("pre_tokenizer")])
    if '"ByteLevel"' in text:
        return False
    return any(f'"{k}"' in text for k in ("Metaspace", "Prepend", "Replace"))


def special_encoder(tok: Any) -> Callable[[str], list[int]]:
    """``text -> ids`` with the tokenizer's default special tokens: BOS (or EOS) where the
    tokenizer's own files ask for one (a GGUF file's ``add_bos_token``, a ``tokenizer.json``
    post-processor), as llama.cpp and ``transformers`` encode a plain prompt; a tokenizer whose
    ``encode`` takes no ``add_special_tokens`` encodes as it always does. A text that starts
    with the BOS token written out (a chat template's rendering) gets no second one."""
    try:
        takes_flag = "add_special_tokens" in inspect.signature(tok.encode).parameters
    except (TypeError, ValueError):
        takes_flag = False
    if not takes_flag:
        return lambda text: list(tok.encode(text))
    bos = getattr(tok, "bos_id", None)

    def encode(text: str) -> list[int]:
        ids = list(tok.encode(text, add_special_tokens=True))
        # a text that writes the BOS itself (a rendered chat template) keeps one
        return ids[1:] if bos is not None and ids[:2] == [bos, bos] else ids

    return encode


def check_text(text: object) -> None:
    """Raise :class:`InputError` unless ``text`` is a ``str``."""
    if not isinstance(text, str):
        raise InputError(f"expected text as a str, got {type(text).__name__}")
