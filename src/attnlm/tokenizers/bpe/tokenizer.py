"""The byte-level BPE tokenizer (GPT-2 / tiktoken scheme): special tokens, the two encoding
engines with their per-chunk cache, decoding, and the tokenizer's files.

Steps, engines and training are described in :mod:`attnlm.tokenizers.bpe`; this module holds
:class:`BPETokenizer` itself. Pre-tokenization: :mod:`~attnlm.tokenizers.bpe.patterns`; merging
one chunk: :mod:`~attnlm.tokenizers.bpe.merge`; training: :mod:`~attnlm.tokenizers.bpe.train`;
JSON fields: :mod:`~attnlm.tokenizers.bpe.files`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Sequence
from itertools import chain
from typing import Any, Literal

from attnlm.tokenizers.base import (
    MAX_VOCAB_SIZE,
    DisallowedSpecialTokenError,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerConfigError,
    TokenizerFileError,
    check_text,
    register_kind,
)
from attnlm.tokenizers.bpe.files import from_fields, to_fields
from attnlm.tokenizers.bpe.merge import LONG_CHUNK, _merge_long, _merge_short, recover_merges
from attnlm.tokenizers.bpe.patterns import (
    _fix_surrogates,
    _special_regex,
    resolve_pattern,
    split_pattern,
)
from attnlm.tokenizers.bpe.train import learn_ranks
from attnlm.tokenizers.split import Splitter

DEFAULT_CACHE_SIZE = 1 << 17

Engine = Literal["auto", "python", "tiktoken"]
SpecialSet = Collection[str] | Literal["all"]


def tiktoken_available() -> bool:
    """Whether the ``tiktoken`` package (the accelerated engine) can be imported."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    return True


@register_kind
class BPETokenizer(Tokenizer):
    """Byte-level BPE tokenizer (GPT-2 / tiktoken scheme; see :mod:`attnlm.tokenizers.bpe`).

    ``ranks`` maps each token's bytes to its id (= merge priority); all 256 single bytes must
    be present. ``special_tokens`` maps strings to ids above every rank. ``merges`` is the
    ordered list of merged byte pairs, when known (trained tokenizers); for rank files it is
    recovered on first access.

    JSON fields: ``pattern`` (built-in name or regex), ``ranks`` (base64 tokens, position =
    id, or ``{base64: id}`` when ids have gaps), ``merges`` (``[[left id, right id], ...]`` or
    null), ``special_tokens`` (``{string: id}``).
    """

    kind = "bpe"

    def __init__(
        self,
        ranks: dict[bytes, int],
        pattern: str = "gpt2",
        special_tokens: dict[str, int] | Sequence[str] | None = None,
        merges: list[tuple[bytes, bytes]] | None = None,
        engine: Engine = "auto",
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise TokenizerConfigError(
                f"ranks lack {len(missing)} single-byte tokens (first: byte 0x{missing[0]:02x});"
                " byte-level BPE needs a rank for every byte"
            )
        self._ranks: dict[bytes, int] = dict(ranks)
        top = max(self._ranks.values())
        low = min(self._ranks.values())
        if top >= MAX_VOCAB_SIZE or low < 0:
            bad = top if top >= MAX_VOCAB_SIZE else low
            raise TokenizerConfigError(
                f"rank {bad} out of range: token ids must be in 0..{MAX_VOCAB_SIZE - 1}"
            )
        self.pattern_name, self.pattern = resolve_pattern(pattern)
        self._split = Splitter(split_pattern(self.pattern))
        self._special = self._check_specials(special_tokens, top)
        self._decoder: dict[int, bytes] = {r: t for t, r in self._ranks.items()}
        for s, i in self._special.items():
            self._decoder[i] = s.encode("utf-8")
        self._merges = list(merges) if merges is not None else None
        self.cache_size = int(cache_size)
        self._cache: dict[str, tuple[int, ...]] = {}
        self._special_re: dict[frozenset[str], re.Pattern[str]] = {}
        self._tk: Any = None
        self._tk_error: str | None = None
        self.engine = engine

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tk"] = None  # rebuilt on demand in the new process
        state["_tk_error"] = None
        state["_cache"] = {}
        if state["_engine"] == "tiktoken":
            state["_engine"] = "auto"
        return state

    @staticmethod
    def _check_specials(
        special_tokens: dict[str, int] | Sequence[str] | None, top: int
    ) -> dict[str, int]:
        if special_tokens is None:
            return {}
        if not isinstance(special_tokens, dict):
            special_tokens = {s: top + 1 + k for k, s in enumerate(special_tokens)}
        used: dict[int, str] = {}
        for s, i in special_tokens.items():
            if not isinstance(s, str) or not s:
                raise TokenizerConfigError(f"special token {s!r} must be a non-empty string")
            if not isinstance(i, int) or isinstance(i, bool) or i <= top:
                raise TokenizerConfigError(
                    f"special token {s!r} has id {i!r}, but ids 0..{top} belong to the merges; "
                    f"use an id >= {top + 1}"
                )
            if i >= MAX_VOCAB_SIZE:
                raise TokenizerConfigError(
                    f"special token {s!r} has id {i}: token ids must be below {MAX_VOCAB_SIZE}"
                )
            if i in used:
                raise TokenizerConfigError(f"special tokens {used[i]!r} and {s!r} share id {i}")
            used[i] = s
        return dict(special_tokens)

    # ------------------------------------------------------------------ construction

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        pattern: str = "gpt2",
        special_tokens: dict[str, int] | Sequence[str] | None = None,
        *,
        min_frequency: int = 0,
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256`` merges from ``text`` (fewer if the text runs out of pairs).

        ``vocab_size`` counts the 256 byte tokens and the merged tokens, not the special
        tokens, which get the ids given (or, for a list, the ids after the merges) and are cut
        out of the training text. Pairs seen fewer than ``min_frequency`` times are not merged.
        """
        ranks, merges, pattern = learn_ranks(
            text, vocab_size, pattern, special_tokens, min_frequency=min_frequency
        )
        return cls(ranks, pattern=pattern, special_tokens=special_tokens, merges=merges)

    @classmethod
    def from_tiktoken(
        cls,
        path: str | os.PathLike[str],
        pattern: str,
        special_tokens: dict[str, int] | None = None,
        **kwargs: Any,
    ) -> BPETokenizer:
        """Load a ``.tiktoken`` rank file with a pattern (name or regex) and special tokens."""
        from attnlm.tokenizers.tiktoken_io import read_tiktoken

        ranks = read_tiktoken(path)
        try:
            return cls(ranks, pattern=pattern, special_tokens=special_tokens, **kwargs)
        except TokenizerConfigError as e:
            if "single-byte" in str(e):
                raise TokenizerFileError(f"{path}: {e}") from None
            raise

    def save_tiktoken(self, path: str | os.PathLike[str]) -> None:
        """Write the ranks as a ``.tiktoken`` file (pattern and special tokens are not in it)."""
        from attnlm.tokenizers.tiktoken_io import write_tiktoken

        write_tiktoken(path, self._ranks)

    # ------------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        return max(self._decoder) + 1

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def ranks(self) -> dict[bytes, int]:
        """``{token bytes: id}`` of the non-special tokens (a copy)."""
        return dict(self._ranks)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merged byte pairs in merge order (recovered from the ranks when not stored)."""
        if self._merges is None:
            self._merges = recover_merges(self._ranks)
        return list(self._merges)

    @property
    def engine(self) -> str:
        """The engine in use: ``"python"`` or ``"tiktoken"``; assign ``"auto"``, ``"python"``
        or ``"tiktoken"`` to choose (``"auto"``: tiktoken when installed and it accepts the
        pattern, else python)."""
        if self._engine == "auto":
            self._engine = "tiktoken" if self._tiktoken_encoding() is not None else "python"
        return self._engine

    @engine.setter
    def engine(self, value: Engine) -> None:
        if value not in ("auto", "python", "tiktoken"):
            raise TokenizerConfigError(f"unknown engine {value!r} (auto, python, tiktoken)")
        if value == "tiktoken" and self._tiktoken_encoding() is None:
            raise TokenizerConfigError(f"tiktoken engine unavailable: {self._tk_error}")
        self._engine = value

    def _tiktoken_encoding(self) -> Any:
        if self._tk is None and self._tk_error is None:
            try:
                import tiktoken
            except ImportError:
                self._tk_error = "tiktoken is not installed"
                return None
            try:
                self._tk = tiktoken.Encoding(
                    name=f"attnlm-bpe-{id(self):x}",
                    pat_str=split_pattern(self.pattern),
                    mergeable_ranks=self._ranks,
                    special_tokens=self._special,
                )
            except Exception as e:  # tiktoken rejects some regexes
                self._tk_error = f"tiktoken rejected the tokenizer ({e})"
        return self._tk

    # ------------------------------------------------------------------ encoding

    def encode(
        self,
        text: str,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
    ) -> list[int]:
        """Token ids of ``text``. Special tokens in ``allowed_special`` (a set, or ``"all"``)
        are encoded as their ids; one from ``disallowed_special`` (default: every special
        token not allowed) raises :class:`DisallowedSpecialTokenError`; others are ordinary
        text. Same semantics as ``tiktoken.Encoding.encode``."""
        if not self._special and not (allowed_special and allowed_special != "all"):
            return self.encode_ordinary(text)
        allowed = self._special_set(allowed_special, "allowed_special")
        if disallowed_special == "all":
            disallowed = frozenset(self._special) - allowed
        else:
            disallowed = self._special_set(disallowed_special, "disallowed_special")
        check_text(text)
        if disallowed:
            m = self._special_pattern(disallowed).search(text)
            if m:
                raise DisallowedSpecialTokenError(
                    f"text contains the special token {m.group()!r} at position {m.start()}; "
                    "allow it (allowed_special) to encode it as one token, or pass "
                    "disallowed_special=() to encode it as ordinary text"
                )
        if not allowed:
            return self.encode_ordinary(text)
        if self.engine == "tiktoken":
            try:
                return self._tk.encode(text, allowed_special=set(allowed), disallowed_special=())
            except UnicodeEncodeError:  # pragma: no cover - tiktoken fixes these itself
                text = _fix_surrogates(text)
                return self._tk.encode(text, allowed_special=set(allowed), disallowed_special=())
        ids: list[int] = []
        start = 0
        for m in self._special_pattern(allowed).finditer(text):
            ids += self._encode_ordinary_py(text[start : m.start()])
            ids.append(self._special[m.group()])
            start = m.end()
        ids += self._encode_ordinary_py(text[start:])
        return ids

    def _special_set(self, value: SpecialSet, what: str) -> frozenset[str]:
        if value == "all":
            return frozenset(self._special)
        if isinstance(value, str):
            raise TokenizerConfigError(f"{what} must be a set of special tokens or 'all'")
        out = frozenset(value)
        unknown = out - set(self._special)
        if unknown:
            raise TokenizerConfigError(
                f"{what}: {sorted(unknown)[0]!r} is not a special token of this tokenizer"
            )
        return out

    def _special_pattern(self, tokens: frozenset[str]) -> re.Pattern[str]:
        pat = self._special_re.get(tokens)
        if pat is None:
            pat = self._special_re[tokens] = _special_regex(tokens)
        return pat

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens treated as ordinary text."""
        check_text(text)
        if self.engine == "tiktoken":
            return self._tk.encode_ordinary(text)
        return self._encode_ordinary_py(text)

    def encode_batch(self, texts: Sequence[str], **kwargs: Any) -> list[list[int]]:
        """``[encode(t, **kwargs) for t in texts]``."""
        return [self.encode(t, **kwargs) for t in texts]

    def _encode_ordinary_py(self, text: str) -> list[int]:
        """The pure-Python engine: regex split, per-chunk cache, lowest-rank merges."""
        chunks = self._split(text)
        cache = self._cache
        if cache:
            vals = list(map(cache.get, chunks))
            if None not in vals:
                return list(chain.from_iterable(vals))
        missing = list(set(chunks).difference(cache))
        try:
            pieces = [c.encode("utf-8") for c in missing]
        except UnicodeEncodeError:
            return self._encode_ordinary_py(_fix_surrogates(text))
        ranks = self._ranks
        found = list(map(ranks.get, pieces))  # chunks that are one token
        new = {}
        for c, piece, r in zip(missing, pieces, found):
            new[c] = (r,) if r is not None else self._piece_ids(piece)
        if len(cache) + len(new) <= self.cache_size:
            cache.update(new)
            table = cache
        else:  # the cache is full: look up in both for this text, then keep only the new
            table = {**cache, **new}
            cache.clear()
            if len(new) <= self.cache_size:
                cache.update(new)
        return list(chain.from_iterable(map(table.__getitem__, chunks)))

    def _piece_ids(self, piece: bytes) -> tuple[int, ...]:
        ranks = self._ranks
        r = ranks.get(piece)
        if r is not None:
            return (r,)
        if not piece:
            return ()
        parts = _merge_long(piece, ranks) if len(piece) > LONG_CHUNK else _merge_short(piece, ranks)
        return tuple([ranks[p] for p in parts])

    # ------------------------------------------------------------------ decoding

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of the tokens ``ids`` (may end inside a UTF-8 character)."""
        d = self._decoder
        ids = list(ids)
        try:
            return b"".join(map(d.__getitem__, ids))
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, int) or i not in d)
            raise InvalidTokenIdError(
                f"token id {bad!r} is not in the vocabulary (size {self.vocab_size})"
            ) from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 (e.g. a partial character at the
        end of a stream) become U+FFFD with the default ``errors="replace"``."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def token_bytes(self, i: int) -> bytes:
        """The bytes of one token id."""
        return self.decode_bytes([i])

    # ------------------------------------------------------------------ files

    def to_dict(self) -> dict[str, Any]:
        return to_fields(
            self._ranks, self._merges, self.pattern_name or self.pattern, self._special
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        return cls(**from_fields(data))
