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
"""

from __future__ import annotations

import base64
import heapq
import os
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from itertools import chain, repeat
from typing import Any, Literal

import regex

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
from attnlm.tokenizers.split import Splitter
from attnlm.tokenizers.training import MAX_SYMBOLS, learn_merges

#: GPT-2's pre-tokenization regex as published (Radford et al., 2019, ``encoder.py``).
GPT2_PUBLISHED = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: Built-in pre-tokenization patterns. ``gpt2`` is GPT-2's regex with the letter alternative
#: moved first, which splits identically (the alternatives that can match at a position never
#: overlap, except the contractions, which stay before punctuation) and runs about 15% faster
#: in Python's ``regex``; ``cl100k`` is cl100k_base's (GPT-3.5/4) exactly.
PATTERNS: dict[str, str] = {
    "gpt2": r""" ?\p{L}+|'(?:[stmd]|re|ve|ll)| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "cl100k": (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
        r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    ),
}

_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
#: The 256 byte values in GPT-2 order; position = id of that single-byte token after training.
GPT2_BYTE_ORDER: list[int] = _PRINTABLE + [b for b in range(256) if b not in set(_PRINTABLE)]
_BYTE_TO_ID = bytes(GPT2_BYTE_ORDER.index(b) for b in range(256))  # bytes.translate table

#: Chunks longer than this (in bytes) are merged with the O(n log n) heap loop.
LONG_CHUNK = 64
_INF = 1 << 62
_SINGLE_BYTES = [bytes([b]) for b in range(256)]
_PAIR_SLICES = [slice(i, i + 2) for i in range(LONG_CHUNK)]
DEFAULT_CACHE_SIZE = 1 << 17

Engine = Literal["auto", "python", "tiktoken"]
SpecialSet = Collection[str] | Literal["all"]


def resolve_pattern(pattern: str) -> tuple[str, str]:
    """``(name, regex)`` for a built-in pattern name, or ``("", pattern)`` for a valid regex."""
    if pattern in PATTERNS:
        return pattern, PATTERNS[pattern]
    if not isinstance(pattern, str) or not pattern:
        raise TokenizerConfigError("pattern must be a built-in name (gpt2, cl100k) or a regex")
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", pattern):
        raise TokenizerConfigError(
            f"unknown pattern name {pattern!r} (built-in: {', '.join(PATTERNS)}; "
            "or pass a regular expression)"
        )
    try:
        compiled = regex.compile(pattern)
    except regex.error as e:
        raise TokenizerConfigError(f"invalid pre-tokenization regex {pattern!r}: {e}") from None
    if compiled.groups:
        raise TokenizerConfigError(
            f"pre-tokenization regex {pattern!r} has {compiled.groups} capturing group(s), "
            "which would make findall return the groups instead of the chunks: use "
            "non-capturing groups (?:...)"
        )
    for pos in range(len(_EMPTY_PROBE) + 1):
        m = compiled.match(_EMPTY_PROBE, pos)
        if m is not None and m.end() == pos:
            raise TokenizerConfigError(
                f"pre-tokenization regex {pattern!r} can match the empty string (e.g. at "
                f"{_EMPTY_PROBE[pos : pos + 8]!r}); every chunk must hold at least one character"
            )
    return "", pattern


#: Text on which a custom pattern must not match the empty string anywhere (a mix of letters,
#: digits, punctuation, whitespace and non-ASCII characters).
_EMPTY_PROBE = "Hello, World! it's 123 4.5e6\n\t  héllo 日本語 x_y-z  \r\n©😀\x00"

#: What custom patterns are extended with: a character no alternative of the pattern covers
#: becomes a chunk of its own, so no text is ever lost and both engines see the same chunks.
UNCOVERED = r"[\s\S]"


def split_pattern(pattern: str) -> str:
    r"""The regex that actually splits text for ``pattern`` (a validated regex): built-in
    patterns as they are (they cover every character), a custom one as
    ``(?:PATTERN)|[\s\S]``: where PATTERN matches, its chunk; any character it leaves
    uncovered, a chunk of one character. The Python and tiktoken engines both use this."""
    if pattern in PATTERNS.values() or pattern == GPT2_PUBLISHED:
        return pattern
    return f"(?:{pattern})|{UNCOVERED}"


# `re`'s \s also matches U+001C..U+001F, `regex`'s (Unicode White_Space) does not: exclude them
_WS, _NON_WS = r"[^\S\x1c-\x1f]", r"[\S\x1c-\x1f]"
_WS_THEN_NON_WS = re.compile(rf"{_WS}*{_NON_WS}+|{_WS}+")


def count_chunks(text: str, pattern: str) -> Counter[str]:
    r"""``Counter(regex.findall(pattern, text))``, computed faster for the built-in patterns
    (see :mod:`attnlm.tokenizers.split`; for ``gpt2`` also the piece counting below).

    No ``gpt2`` chunk crosses a point where a non-space character is followed by a space
    (letter, digit and punctuation runs stop at whitespace; whitespace chunks hold only
    whitespace and look ahead only within their run). So the text is cut there into pieces
    ``\s*\S+`` with the fast ``re`` module, each distinct piece is split once, and its chunks
    are counted as often as the piece occurs. Pieces that occur equally often are joined and
    split in one call (joined pieces still meet at such a point).
    """
    if pattern not in (PATTERNS["gpt2"], GPT2_PUBLISHED):
        return Counter(Splitter(pattern)(text))
    compiled = regex.compile(pattern)
    pieces = _WS_THEN_NON_WS.findall(text)
    out: Counter[str] = Counter()
    if not pieces:
        return out
    piece_counts = Counter(pieces)
    # the first piece may start with a non-space and the last may be only spaces: alone
    alone = {pieces[0], pieces[-1]}
    by_count: dict[int, list[str]] = {}
    for piece, n in piece_counts.items():
        if piece not in alone:
            by_count.setdefault(n, []).append(piece)
    for piece in alone:
        n = piece_counts[piece]
        for chunk in compiled.findall(piece):
            out[chunk] += n
    for n, group in by_count.items():
        found = Counter(compiled.findall("".join(group)))
        if n == 1:
            out.update(found)
        else:
            for chunk, k in found.items():
                out[chunk] += k * n
    return out


def _fix_surrogates(text: str) -> str:
    """Replace lone surrogates by U+FFFD (what tiktoken does before encoding)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _special_regex(tokens: Iterable[str]) -> re.Pattern[str]:
    alts = sorted(tokens, key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(t) for t in alts))


def _merge_short(piece: bytes, ranks: dict[bytes, int], max_rank: int | None = None) -> list[bytes]:
    """Lowest-rank-first merging of one chunk: keep the rank of every adjacent pair, merge the
    leftmost minimum, update its two neighbours. O(n^2) worst case, fastest for short chunks.
    With ``max_rank`` only pairs of lower rank are merged."""
    inf = _INF if max_rank is None else max_rank
    get = ranks.get
    n = len(piece)
    parts = list(map(_SINGLE_BYTES.__getitem__, piece))
    slices = _PAIR_SLICES[: n - 1] if n <= LONG_CHUNK else map(slice, range(n - 1), range(2, n + 1))
    pr = list(map(get, map(piece.__getitem__, slices), repeat(inf, n - 1)))
    while pr:
        m = min(pr)
        if m >= inf:
            break
        i = pr.index(m)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pr[i]
        if i > 0:
            pr[i - 1] = get(parts[i - 1] + parts[i], inf)
        if i < len(pr):
            pr[i] = get(parts[i] + parts[i + 1], inf)
    return parts


def _merge_long(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """The same merges as :func:`_merge_short` in O(n log n): a heap of ``(rank, left start)``
    over a linked list of symbols, stale entries skipped when popped."""
    n = len(piece)
    get = ranks.get
    end = list(range(1, n + 1))  # end[i]: end of the symbol starting at i (valid if alive)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    for i in range(n - 1):
        r = get(piece[i : i + 2])
        if r is not None:
            heap.append((r, i, i + 1, i + 2))
    heapq.heapify(heap)
    while heap:
        _, i, j, e = heapq.heappop(heap)
        if not alive[i] or nxt[i] != j or end[j] != e:
            continue
        end[i] = e
        alive[j] = False
        k = nxt[j]
        nxt[i] = k
        if k < n:
            prv[k] = i
        p = prv[i]
        if p >= 0:
            r = get(piece[p:e])
            if r is not None:
                heapq.heappush(heap, (r, p, i, e))
        if k < n:
            r = get(piece[i : end[k]])
            if r is not None:
                heapq.heappush(heap, (r, i, k, end[k]))
    out = []
    i = 0
    while i < n:
        out.append(piece[i : end[i]])
        i = nxt[i]
    return out


def tiktoken_available() -> bool:
    """Whether the ``tiktoken`` package (the accelerated engine) can be imported."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    return True


@register_kind
class BPETokenizer(Tokenizer):
    """Byte-level BPE tokenizer (GPT-2 / tiktoken scheme; see the module docstring).

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
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise TokenizerConfigError(
                f"vocab_size {vocab_size!r} too small: byte-level BPE needs at least 256 "
                "(one token per byte)"
            )
        if vocab_size > MAX_SYMBOLS:
            raise TokenizerConfigError(f"vocab_size {vocab_size} too large (max {MAX_SYMBOLS})")
        name, pat = resolve_pattern(pattern)
        check_text(text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _fix_surrogates(text)
        names = list(special_tokens or ())
        segments = _special_regex(names).split(text) if names else [text]
        counts: Counter[str] = Counter()
        for seg in segments:
            counts.update(count_chunks(seg, split_pattern(pat)))
        words = [list(w.encode("utf-8").translate(_BYTE_TO_ID)) for w in counts]
        symbols: list[bytes] = [bytes([b]) for b in GPT2_BYTE_ORDER]
        merged = learn_merges(
            words, list(counts.values()), symbols, vocab_size, min_frequency=min_frequency
        )
        ranks = {s: i for i, s in enumerate(symbols)}
        merges = [(symbols[a], symbols[b]) for a, b, *_ in merged]
        return cls(ranks, pattern=name or pat, special_tokens=special_tokens, merges=merges)

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
        by_id = sorted(self._ranks.items(), key=lambda kv: kv[1])
        if all(r == k for k, (_, r) in enumerate(by_id)):
            ranks: Any = [base64.b64encode(t).decode("ascii") for t, _ in by_id]
        else:
            ranks = {base64.b64encode(t).decode("ascii"): r for t, r in by_id}
        merges = None
        if self._merges is not None:
            merges = [[self._ranks[a], self._ranks[b]] for a, b in self._merges]
        return {
            "pattern": self.pattern_name or self.pattern,
            "ranks": ranks,
            "merges": merges,
            "special_tokens": dict(self._special),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        raw = data["ranks"]
        if isinstance(raw, list):
            ranks = {base64.b64decode(t, validate=True): i for i, t in enumerate(raw)}
        elif isinstance(raw, dict):
            ranks = {base64.b64decode(t, validate=True): int(r) for t, r in raw.items()}
        else:
            raise TypeError("'ranks' must be a list or an object")
        if len(ranks) != len(raw):
            raise ValueError("duplicate tokens in 'ranks'")
        decoder = {r: t for t, r in ranks.items()}
        merges = data.get("merges")
        pairs = None
        if merges is not None:
            pairs = [(decoder[int(a)], decoder[int(b)]) for a, b in merges]
        return cls(
            ranks,
            pattern=data["pattern"],
            special_tokens=data.get("special_tokens") or None,
            merges=pairs,
        )


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list implied by a rank table: for each multi-byte token in rank order, the two
    parts that merging with only lower ranks produces. Tokens that no merge can produce
    (fewer or more than two parts remain) are skipped."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _merge_short(token, ranks, max_rank=rank)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges
