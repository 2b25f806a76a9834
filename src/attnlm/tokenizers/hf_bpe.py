"""Byte-level BPE tokenizers from a Hugging Face ``tokenizer.json`` (GPT-2, SmolLM2, Llama 3,
Qwen, Mistral-Nemo ...), encoding as the ``tokenizers`` library does.

What the file holds and what we read from it:

* ``model``: ``{"type": "BPE", "vocab": {token: id}, "merges": [...], "ignore_merges"}``.
  Tokens are written in GPT-2's byte-to-character alphabet (every byte is a printable
  character: byte 0x20, the space, is ``Ġ``). ``merges`` is the merge list in priority order,
  as ``"a b"`` strings (older files) or ``["a", "b"]`` pairs. ``ignore_merges`` (Llama 3): a
  pre-token that is itself in the vocabulary is that token, without merging.
* ``normalizer``: none, or Unicode normal forms (``NFC``, ``NFKC``, ...) and sequences of them.
* ``pre_tokenizer``: ``ByteLevel`` (``add_prefix_space``; ``use_regex`` splits with GPT-2's
  regex), ``Split`` (a ``Regex`` or ``String`` pattern, ``Isolated`` or ``Removed``,
  ``invert``; Llama 3's and Qwen's regexes), ``Digits``, or a ``Sequence`` of them, applied in
  turn: each splits the pieces of the one before.
* ``added_tokens``: ``{id, content, special, lstrip, rstrip, normalized, single_word}``; they
  are cut out of the text first (longest first) and never split.
* ``post_processor``: a ``TemplateProcessing`` template adds its special tokens (Llama 3's
  ``<|begin_of_text|>``) when ``encode(text, add_special_tokens=True)``.

Other model types (``Unigram``, ``WordLevel``) and pre-tokenizers (``Metaspace`` ...) are
refused with one line naming them; a ``WordPiece`` file loads as
:class:`~attnlm.tokenizers.wordpiece.WordPieceTokenizer`.

Encoding one pre-token: its UTF-8 bytes become alphabet characters (the symbols); then,
repeatedly, the adjacent pair with the lowest merge rank (leftmost among equals) is merged,
until no adjacent pair is a merge; each symbol is a vocabulary id. This is the ``tokenizers``
definition (ranks of pairs, not of the merged strings as in tiktoken).
"""

from __future__ import annotations

import heapq
import re
import unicodedata
from array import array
from collections.abc import Callable, Iterable
from typing import Any

import regex

from attnlm.base.errors import InputError
from attnlm.tokenizers.base import (
    MAX_VOCAB_SIZE,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerFileError,
    check_text,
    register_kind,
)
from attnlm.tokenizers.bpe.patterns import GPT2_PUBLISHED
from attnlm.tokenizers.split import Splitter

NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
CACHE_SIZE = 1 << 16


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the
    other 68 (controls, space, 0x7F-0xA0, 0xAD) for ``chr(256 + k)`` in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + k) for k, b in enumerate(others)})
    return table


BYTE_TO_CHAR = byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
_BYTE_CHARS = [BYTE_TO_CHAR[b] for b in range(256)]


def _fail(what: str) -> TokenizerFileError:
    return TokenizerFileError(what)


# -- normalizer and pre-tokenizers ------------------------------------------------------------


def normalizer(
    spec: dict | None, more: dict[str, Callable[[dict], Callable[[str], str]]] | None = None
) -> Callable[[str], str]:
    """A ``tokenizer.json`` normalizer as a function: Unicode normal forms and sequences of
    them; ``more``: the other kinds a reader takes (kind -> builder of its spec)."""
    if spec is None:
        return lambda s: s
    kind, more = spec.get("type"), more or {}
    if kind in NORMAL_FORMS:
        return lambda s: unicodedata.normalize(kind, s)
    if kind in more:
        return more[kind](spec)
    if kind == "Sequence":
        steps = [normalizer(n, more) for n in spec.get("normalizers", [])]

        def run(s: str) -> str:
            for step in steps:
                s = step(s)
            return s

        return run
    known = ", ".join((*more, *NORMAL_FORMS, "Sequence"))
    raise _fail(f"tokenizer.json normalizer {kind!r} is not supported (none, {known})")


def _split_on(pattern: Callable[[str], Iterable[Any]], behavior: str, invert: bool):
    """A splitting step: ``pattern(piece)`` gives match objects; ``Isolated`` keeps matches
    and the text between them as pieces, ``Removed`` drops the matches (``invert``: the text
    between matches plays the matches' part)."""
    if behavior not in ("Isolated", "Removed"):
        raise _fail(f"Split behavior {behavior!r} is not supported (Isolated, Removed)")
    keep_matches = behavior == "Isolated"

    def split(piece: str) -> list[str]:
        segments, pos = [], 0  # (text, is a match)
        for m in pattern(piece):
            if m.end() > m.start():
                segments += [(piece[pos : m.start()], invert), (m.group(), not invert)]
                pos = m.end()
        segments.append((piece[pos:], invert))
        return [t for t, is_match in segments if t and (keep_matches or not is_match)]

    return split


def _pre_tokenizer(spec: dict | None) -> tuple[list[Callable[[str], list[str]]], bool]:
    """The steps of a pre-tokenizer (each ``piece -> pieces``) and whether a ``ByteLevel``
    step is among them (the alphabet mapping itself is applied at the end)."""
    if spec is None:
        raise _fail(
            "no pre_tokenizer: only byte-level BPE (a ByteLevel pre-tokenizer) is supported"
        )
    kind = spec.get("type")
    if kind == "Sequence":
        steps, byte_level = [], False
        for sub in spec.get("pretokenizers", []):
            s, b = _pre_tokenizer(sub)
            steps += s
            byte_level |= b
        return steps, byte_level
    if kind == "ByteLevel":
        steps = []
        if spec.get("add_prefix_space", False):
            steps.append(lambda p: [p if p.startswith(" ") else " " + p])
        if spec.get("use_regex", True):
            steps.append(Splitter(GPT2_PUBLISHED))
        return steps, True
    if kind == "Split":
        pattern = spec.get("pattern") or {}
        if "Regex" in pattern:
            compiled = regex.compile(pattern["Regex"])
        elif "String" in pattern:
            compiled = regex.compile(regex.escape(pattern["String"]))
        else:
            raise _fail(f"Split pattern {pattern!r} is neither Regex nor String")
        behavior = spec.get("behavior", "Isolated")
        return [_split_on(compiled.finditer, behavior, bool(spec.get("invert")))], False
    if kind == "Digits":
        compiled = regex.compile(r"\p{N}" if spec.get("individual_digits") else r"\p{N}+")
        return [_split_on(compiled.finditer, "Isolated", False)], False
    raise _fail(f"pre_tokenizer {kind!r} is not supported (ByteLevel, Split, Digits, Sequence)")


def _merges(raw: Iterable, vocab: dict[str, int], split: Callable[[str], list[str]] | None = None
            ) -> dict[str, int]:  # fmt: skip
    """``{"left right": rank}`` from ``"a b"`` strings or ``["a", "b"]`` pairs (``split``: how a
    string is cut, by default at its first space).

    Keyed by the one string rather than by a pair: a file's own ``"a b"`` is the key, so the
    table holds no strings of its own (a 49k-merge vocabulary costs a third of the memory).
    Byte-level symbols never hold a space (byte 0x20 is ``Ġ``), so ``left + " " + right`` of
    two symbols names one pair; a merge whose parts hold a space could never apply anyway."""
    out: dict[str, int] = {}
    for rank, item in enumerate(raw):
        if isinstance(item, str):
            pair = split(item) if split else item.split(" ", 1)
        else:
            pair = item
        if len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise _fail(f"merge {rank} {item!r} is not a pair of tokens")
        if pair[0] + pair[1] not in vocab:
            raise _fail(f"merge {rank} {item!r} makes {pair[0] + pair[1]!r}, which is not in "
                        "the vocab")  # fmt: skip
        key = f"{pair[0]} {pair[1]}"
        out.setdefault(item if isinstance(item, str) and item == key else key, rank)
    return out


def checked_vocab(model: dict[str, Any]) -> dict[str, int]:
    """A ``tokenizer.json`` BPE model's ``vocab`` (token -> id), checked: non-empty, every id a
    non-negative integer below :data:`MAX_VOCAB_SIZE`, no id given twice."""
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise _fail("BPE model has no vocab")
    bad = next((t for t, i in vocab.items() if type(i) is not int or i < 0), None)
    if bad is not None:
        raise _fail(f"vocab id of {bad!r} is {vocab[bad]!r}, not a non-negative integer")
    top = max(vocab.values())
    if top >= MAX_VOCAB_SIZE:  # tables are sized by the largest id
        raise _fail(f"vocab id {top:,} is out of range: ids must be below {MAX_VOCAB_SIZE:,}")
    if len(set(vocab.values())) != len(vocab):
        seen: dict[int, str] = {}
        token, i = next((t, i) for t, i in vocab.items() if seen.setdefault(i, t) != t)
        raise _fail(f"vocab tokens {seen[i]!r} and {token!r} have the same id {i}")
    return vocab


def check_added_tokens(doc: dict[str, Any]) -> None:
    """Every ``added_tokens`` entry has an integer id in range and a string ``content``."""
    for token in doc.get("added_tokens") or []:
        if not isinstance(token, dict) or type(token.get("id")) is not int:
            raise _fail(f"added token {token!r} has no integer 'id'")
        if not 0 <= token["id"] < MAX_VOCAB_SIZE:
            raise _fail(
                f"added token id {token['id']:,} is out of range: ids must be in "
                f"0..{MAX_VOCAB_SIZE - 1:,}"
            )
        if not isinstance(token.get("content"), str):
            raise _fail(f"added token {token!r} has no string 'content'")


class _ByteTable:
    """``{id: bytes}`` as one buffer and offsets (a dict of 49k ``bytes`` objects costs five
    times the memory): ``get(i)`` the bytes of id ``i`` or None; ``size`` the largest id + 1."""

    def __init__(self, table: dict[int, bytes]) -> None:
        self.size = max(table) + 1
        self._start = array("q", [0]) * self.size
        self._len = array("i", [-1]) * self.size  # -1: no token has this id
        buf, pos = bytearray(), 0
        for i, b in table.items():
            self._start[i], self._len[i] = pos, len(b)
            buf += b
            pos += len(b)
        self._buf = bytes(buf)

    def get(self, i: int) -> bytes | None:
        if not 0 <= i < self.size or self._len[i] < 0:
            return None
        start = self._start[i]
        return self._buf[start : start + self._len[i]]


# -- the tokenizer ----------------------------------------------------------------------------


@register_kind
class HFByteBPETokenizer(Tokenizer):
    """A byte-level BPE ``tokenizer.json`` (see the module docstring). ``encode(text)`` equals
    ``tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids``; added and special
    tokens written in the text are encoded as their ids, as there.

    JSON fields: ``tokenizer_json``, the whole Hugging Face document (so a checkpoint's
    tokenizer file reproduces it exactly)."""

    kind = "hf-bpe"

    def __init__(
        self, doc: dict[str, Any], merge_split: Callable[[str], list[str]] | None = None
    ) -> None:
        """``merge_split``: how a ``"a b"`` merge string is cut (default: at its first space;
        llama.cpp's GGUF reader cuts at the first space after the first character)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise _fail("tokenizer.json has no 'model' object")
        model = doc["model"]
        if model.get("type", "BPE") != "BPE":
            raise _fail(f"model type {model.get('type')!r} is not supported here")
        for key in ("byte_fallback", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise _fail(f"BPE {key}={model[key]!r} is not byte-level BPE (not supported)")
        if model.get("dropout"):
            raise _fail("BPE dropout is not supported (encoding would be random)")
        self.doc = doc
        vocab = checked_vocab(model)
        self._vocab: dict[str, int] = vocab  # not a copy: a 49k vocabulary is megabytes
        self._merges = _merges(model.get("merges") or [], vocab, merge_split)
        self._ignore_merges = bool(model.get("ignore_merges", False))
        unk = model.get("unk_token")
        self._unk = self._vocab.get(unk) if unk is not None else None
        check_added_tokens(doc)
        self._normalize = normalizer(doc.get("normalizer"))
        self._steps, byte_level = _pre_tokenizer(doc.get("pre_tokenizer"))
        if not byte_level:
            raise _fail("the pre_tokenizer has no ByteLevel step: not byte-level BPE")
        self._added = {t["content"]: t for t in doc.get("added_tokens") or []}
        decoder: dict[int, bytes] = {}
        for token, i in self._vocab.items():
            alphabet = all(c in CHAR_TO_BYTE for c in token)
            decoder[i] = bytes(map(CHAR_TO_BYTE.get, token)) if alphabet else token.encode()
        for token in self._added.values():
            decoder[int(token["id"])] = token["content"].encode("utf-8")
        self._decoder = _ByteTable(decoder)
        self._raw_re = self._added_regex(normalized=False)
        self._norm_re = self._added_regex(normalized=True)
        self._template = self._single_template(doc.get("post_processor"))
        self._cache: dict[str, tuple[int, ...]] = {}

    # -- added tokens and the template ---------------------------------------------------------

    def _added_regex(self, normalized: bool) -> tuple[re.Pattern[str], list[int]] | None:
        """Added tokens matched on the raw (``normalized: false``) or the normalized text,
        longest first (``lstrip`` / ``rstrip`` take the whitespace beside them), with the id of
        each alternative."""
        tokens = [t for t in self._added.values() if bool(t.get("normalized")) == normalized]
        if not tokens:
            return None
        tokens.sort(key=lambda t: -len(t["content"]))
        alts = []
        for k, t in enumerate(tokens):
            if t.get("single_word"):
                raise _fail(f"added token {t['content']!r}: single_word is not supported")
            left, right = (r"\s*" if t.get(side) else "" for side in ("lstrip", "rstrip"))
            alts.append(f"(?P<t{k}>{left}{re.escape(t['content'])}{right})")
        ids = [int(t["id"]) for t in tokens]
        if any(t.get("lstrip") for t in tokens) or not all(t["content"] for t in tokens):
            return re.compile("|".join(alts)), ids
        # the alternatives grouped by their first character, each group behind a lookahead:
        # the same matches (no alternative can match where its first character is not), but
        # a position is tried against its own group only, not every token (Gemma's 6,414
        # took 10 ms a character)
        groups: dict[str, list[str]] = {}
        for t, alt in zip(tokens, alts):
            groups.setdefault(t["content"][0], []).append(alt)
        parts = [f"(?={re.escape(c)})(?:{'|'.join(g)})" for c, g in groups.items()]
        return re.compile("|".join(parts)), ids

    def _single_template(self, spec: dict | None) -> list[int | None]:
        """The ``single`` template of a ``TemplateProcessing`` post-processor as ids with None
        where the text goes (``[None]`` when there is none)."""
        if not spec:
            return [None]
        kind = spec.get("type")
        if kind == "Sequence":
            found = [self._single_template(p) for p in spec.get("processors", [])]
            return next((t for t in found if t != [None]), [None])
        if kind != "TemplateProcessing":
            return [None]  # ByteLevel, RobertaProcessing ...: ids unchanged for one text
        out: list[int | None] = []
        specials = spec.get("special_tokens", {})
        for item in spec.get("single", []):
            if "Sequence" in item:
                out.append(None)
            else:
                name = item["SpecialToken"]["id"]
                out += specials.get(name, {}).get("ids", [])
        return out

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the file's template (e.g. a
        beginning-of-text token) as ``tokenizers`` does by default."""
        check_text(text)
        ids: list[int] = []
        for piece, added in self._cut(text, self._raw_re):
            if added is not None:
                ids.append(added)
                continue
            for sub, added2 in self._cut(self._normalize(piece), self._norm_re):
                if added2 is not None:
                    ids.append(added2)
                else:
                    ids += self._encode_normalized(sub)
        if not add_special_tokens:
            return ids
        out: list[int] = []
        for item in self._template:
            out += ids if item is None else [item]
        return out

    @staticmethod
    def _cut(text: str, added: tuple[re.Pattern[str], list[int]] | None):
        """``(piece, None)`` for ordinary text and ``("", id)`` for each added token."""
        if added is None:
            if text:
                yield text, None
            return
        pattern, ids = added
        pos = 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                yield text[pos : m.start()], None
            yield "", ids[int(m.lastgroup[1:])]
            pos = m.end()
        if pos < len(text):
            yield text[pos:], None

    def _encode_normalized(self, text: str) -> list[int]:
        pieces = [text]
        for step in self._steps:
            pieces = [p for piece in pieces for p in step(piece)]
        ids: list[int] = []
        cache = self._cache
        for piece in pieces:
            found = cache.get(piece)
            if found is None:
                found = self._bpe("".join(_BYTE_CHARS[b] for b in piece.encode("utf-8")))
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[piece] = found
            ids += found
        return ids

    def _bpe(self, word: str) -> tuple[int, ...]:
        """Merge the characters of one byte-level pre-token by merge rank (a heap of the
        adjacent pairs; stale entries are skipped)."""
        vocab = self._vocab
        if self._ignore_merges and word in vocab:
            return (vocab[word],)
        symbols = list(word)
        n = len(symbols)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        merges = self._merges
        heap = []
        for i in range(n - 1):
            rank = merges.get(f"{symbols[i]} {symbols[i + 1]}")
            if rank is not None:
                heap.append((rank, i, symbols[i], symbols[i + 1]))
        heapq.heapify(heap)
        while heap:
            rank, i, left, right = heapq.heappop(heap)
            j = nxt[i] if symbols[i] is not None else n
            if symbols[i] != left or j >= n or symbols[j] != right:
                continue  # a stale pair: one side has merged since
            symbols[i], symbols[j] = left + right, None
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            for a, b in ((prv[i], i), (i, nxt[i])):
                if a >= 0 and b < n:
                    rank = merges.get(f"{symbols[a]} {symbols[b]}")
                    if rank is not None:
                        heapq.heappush(heap, (rank, a, symbols[a], symbols[b]))
        out = []
        for s in symbols:
            if s is None:
                continue
            i = vocab.get(s)
            if i is None:
                i = self._unk
            if i is None:  # no token and no unknown token: the text would vanish silently
                raw = bytes(CHAR_TO_BYTE.get(c, 0x3F) for c in s)
                raise InputError(
                    f"the tokenizer's byte-level vocabulary has no token for {raw!r} and no "
                    "unknown token: that text cannot be encoded (a damaged tokenizer.json?)"
                )
            out.append(i)
        return tuple(out)

    # -- decoding and the protocol -------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The bytes of the tokens ``ids``."""
        out = []
        for i in ids:
            b = self._decoder.get(i) if isinstance(i, int) else None
            if b is None:
                raise InvalidTokenIdError(
                    f"token id {i!r} is not in the vocabulary (size {self.vocab_size})"
                )
            if skip_special_tokens and i in self._special_ids:
                continue
            out.append(b)
        return b"".join(out)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8, e.g. half a character, becomes U+FFFD)."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        return self.decode_bytes([i])

    @property
    def _special_ids(self) -> set[int]:
        return set(self.special_tokens.values())

    @property
    def vocab_size(self) -> int:
        return self._decoder.size

    @property
    def special_tokens(self) -> dict[str, int]:
        return {c: int(t["id"]) for c, t in self._added.items() if t.get("special")}

    def to_dict(self) -> dict[str, Any]:
        return {"tokenizer_json": self.doc}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HFByteBPETokenizer:
        return cls(data["tokenizer_json"])
