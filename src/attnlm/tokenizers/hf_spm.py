"""SentencePiece-style BPE tokenizers from a Hugging Face ``tokenizer.json`` (Llama 2, Mistral,
Gemma 2/3, Phi-3, and what ``attnlm export`` writes for a GGUF ``llama`` vocabulary), encoding
and decoding as the ``tokenizers`` library does.

What the file holds and what we read from it:

* ``model``: ``{"type": "BPE", "vocab", "merges", "byte_fallback", "unk_token", "fuse_unk",
  "ignore_merges"}``. Tokens are text, with ``▁`` (U+2581) for a space; ``<0xNN>`` tokens hold
  one byte each. A character that is not a token becomes the tokens of its UTF-8 bytes
  (``byte_fallback``), else the unknown token (consecutive ones fused with ``fuse_unk``).
* ``normalizer``: none, ``Prepend``, ``Replace`` (a ``String`` or ``Regex`` pattern), Unicode
  normal forms, or a ``Sequence`` of them (Llama 2's and Gemma's ``Prepend("▁")`` +
  ``Replace(" ", "▁")``).
* ``pre_tokenizer``: none, ``Metaspace`` (``replacement``, ``prepend_scheme`` ``always`` /
  ``first`` / ``never`` or the older ``add_prefix_space``, ``split``), ``Split`` (``Isolated``,
  ``Removed``, ``MergedWithPrevious``, ``MergedWithNext``), or a ``Sequence`` of them.
* ``added_tokens``: cut out of the text first, as for byte-level BPE
  (:class:`~attnlm.tokenizers.hf_bpe.HFByteBPETokenizer`); the normalizer and pre-tokenizer
  then see each piece between them on its own (so ``Prepend`` puts ``▁`` before each).
* ``post_processor``: a ``TemplateProcessing`` template's tokens (BOS) with
  ``encode(text, add_special_tokens=True)``.
* ``decoder``: ``Replace``, ``ByteFallback``, ``Fuse``, ``Strip``, ``Metaspace`` or a
  ``Sequence`` of them, applied to the list of token strings as ``tokenizers`` applies them.

Anything else (another normalizer, pre-tokenizer or decoder type, BPE ``dropout``,
``continuing_subword_prefix``) is refused with one line naming it.

Encoding one pre-token: its characters are the symbols (bytes or the unknown token for those
that are not tokens); then, repeatedly, the adjacent pair with the lowest merge rank (leftmost
among equals) is merged, until no adjacent pair is a merge.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

import regex

from attnlm.base.errors import InputError
from attnlm.tokenizers.base import (
    InvalidTokenIdError,
    check_text,
    register_kind,
)
from attnlm.tokenizers.hf_bpe import (
    CACHE_SIZE,
    HFByteBPETokenizer,
    _fail,
    check_added_tokens,
    checked_vocab,
    normalizer,
)

SPACE = "\u2581"  # ▁
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
_BYTE_OF = {t: b for b, t in enumerate(BYTE_TOKENS)}


def _pattern(spec: dict, where: str) -> regex.Pattern:
    pattern = spec.get("pattern") or {}
    if "String" in pattern:
        return regex.compile(regex.escape(pattern["String"]))
    if "Regex" in pattern:
        try:
            return regex.compile(pattern["Regex"])
        except (regex.error, TypeError) as e:
            raise _fail(f"{where} regex {pattern['Regex']!r} does not compile ({e})") from None
    raise _fail(f"{where} pattern {pattern!r} is neither Regex nor String")


# -- normalizer ---------------------------------------------------------------------------------


def _prepend(spec: dict) -> Callable[[str], str]:
    prefix = str(spec.get("prepend", ""))
    return lambda s: prefix + s if s else s


def _replace(spec: dict) -> Callable[[str], str]:
    compiled, content = _pattern(spec, "Replace normalizer"), str(spec.get("content", ""))
    return lambda s: compiled.sub(lambda m: content, s)


def _normalizer(spec: dict | None) -> Callable[[str], str]:
    """The byte-level reader's normalizers and SentencePiece's ``Prepend`` / ``Replace``."""
    return normalizer(spec, {"Prepend": _prepend, "Replace": _replace})


# -- pre-tokenizer: each step maps (piece, starts the text) pairs ------------------------------

Step = Callable[[str, bool], list[tuple[str, bool]]]


def _split(compiled: regex.Pattern, behavior: str, invert: bool) -> Step:
    if behavior not in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext"):
        raise _fail(f"pre_tokenizer Split behavior {behavior!r} is not supported")

    def split(piece: str, first: bool) -> list[tuple[str, bool]]:
        segments, pos = [], 0  # (text, is a match)
        for m in compiled.finditer(piece):
            if m.end() > m.start():
                segments += [(piece[pos : m.start()], invert), (m.group(), not invert)]
                pos = m.end()
        segments.append((piece[pos:], invert))
        segments = [(t, k) for t, k in segments if t]
        out: list[str] = []
        if behavior == "Isolated":
            out = [t for t, _ in segments]
        elif behavior == "Removed":
            out = [t for t, k in segments if not k]
        elif behavior == "MergedWithPrevious":
            for t, k in segments:
                if k and out:
                    out[-1] += t
                else:
                    out.append(t)
        else:  # MergedWithNext
            glue = False
            for t, k in segments:
                if glue:
                    out[-1] += t
                else:
                    out.append(t)
                glue = k
        return [(t, first and n == 0) for n, t in enumerate(out)]

    return split


def _metaspace(spec: dict) -> Step:
    rep = str(spec.get("replacement", SPACE))
    scheme = spec.get("prepend_scheme")
    if scheme is None:  # older files: add_prefix_space
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    if scheme not in ("always", "first", "never"):
        raise _fail(f"pre_tokenizer Metaspace prepend_scheme {scheme!r} is not supported")
    splitter = _split(regex.compile(regex.escape(rep)), "MergedWithNext", False)
    do_split = bool(spec.get("split", True))

    def step(piece: str, first: bool) -> list[tuple[str, bool]]:
        piece = piece.replace(" ", rep)
        if (scheme == "always" or (scheme == "first" and first)) and not piece.startswith(rep):
            piece = rep + piece
        return splitter(piece, first) if do_split else [(piece, first)]

    return step


def _pre_tokenizer(spec: dict | None) -> list[Step]:
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        return [s for sub in spec.get("pretokenizers", []) for s in _pre_tokenizer(sub)]
    if kind == "Metaspace":
        return [_metaspace(spec)]
    if kind == "Split":
        compiled = _pattern(spec, "Split pre_tokenizer")
        return [_split(compiled, spec.get("behavior", "Isolated"), bool(spec.get("invert")))]
    raise _fail(
        f"tokenizer.json pre_tokenizer {kind!r} is not supported with byte_fallback BPE "
        "(none, Metaspace, Split, Sequence)"
    )


# -- decoder: token strings -> token strings ---------------------------------------------------


def _decoder(spec: dict | None) -> Callable[[list[str]], list[str]]:
    if spec is None:
        return lambda tokens: tokens
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [_decoder(d) for d in spec.get("decoders", [])]

        def run(tokens: list[str]) -> list[str]:
            for step in steps:
                tokens = step(tokens)
            return tokens

        return run
    if kind == "Replace":
        compiled, content = _pattern(spec, "Replace decoder"), str(spec.get("content", ""))
        return lambda tokens: [compiled.sub(lambda m: content, t) for t in tokens]
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        content, start, stop = (
            str(spec.get("content", " ")),
            spec.get("start", 0),
            spec.get("stop", 0),
        )
        return lambda tokens: [_strip(t, content, int(start), int(stop)) for t in tokens]
    if kind == "Metaspace":
        rep = str(spec.get("replacement", SPACE))
        scheme = spec.get("prepend_scheme")
        if scheme is None:
            scheme = "always" if spec.get("add_prefix_space", True) else "never"

        def meta(tokens: list[str]) -> list[str]:
            out = [t.replace(rep, " ") for t in tokens]
            if out and scheme != "never" and out[0].startswith(" "):
                out[0] = out[0][1:]
            return out

        return meta
    raise _fail(
        f"tokenizer.json decoder {kind!r} is not supported "
        "(Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)"
    )


def _byte_fallback(tokens: list[str]) -> list[str]:
    """Runs of ``<0xNN>`` tokens as the text of their bytes (one U+FFFD per byte where they
    are not valid UTF-8)."""
    out: list[str] = []
    run = bytearray()
    count = 0

    def flush() -> None:
        nonlocal count
        if count:
            try:
                out.append(bytes(run).decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" for _ in range(count))
            run.clear()
            count = 0

    for t in tokens:
        b = _BYTE_OF.get(t)
        if b is None:
            flush()
            out.append(t)
        else:
            run.append(b)
            count += 1
    flush()
    return out


def _strip(token: str, content: str, start: int, stop: int) -> str:
    begin, end = 0, len(token)
    while begin < end and begin < start and token[begin] == content:
        begin += 1
    k = 0
    while end > begin and k < stop and token[end - 1] == content:
        end -= 1
        k += 1
    return token[begin:end]


# -- the tokenizer ------------------------------------------------------------------------------


@register_kind
class HFSpmBPETokenizer(HFByteBPETokenizer):
    """A SentencePiece-style BPE ``tokenizer.json`` (see the module docstring).
    ``encode(text)`` equals ``tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids``
    and ``decode(ids)`` its ``decode(ids, skip_special_tokens=False)``.

    JSON fields: ``tokenizer_json``, the whole Hugging Face document."""

    kind = "hf-spm"

    def __init__(self, doc: dict[str, Any]) -> None:
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise _fail("tokenizer.json has no 'model' object")
        model = doc["model"]
        if model.get("type", "BPE") != "BPE":
            raise _fail(f"model type {model.get('type')!r} is not supported here")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise _fail(f"tokenizer.json BPE {key}={model[key]!r} is not supported")
        if model.get("dropout"):
            raise _fail("BPE dropout is not supported (encoding would be random)")
        self.doc = doc
        vocab = checked_vocab(model)
        self._vocab: dict[str, int] = vocab
        self._merges = _pair_ranks(model.get("merges") or [], vocab)
        self._ignore_merges = bool(model.get("ignore_merges", False))
        self._byte_fallback = bool(model.get("byte_fallback", False))
        self._fuse_unk = bool(model.get("fuse_unk", False))
        unk = model.get("unk_token")
        self._unk = vocab.get(unk) if unk is not None else None
        check_added_tokens(doc)
        self._added = {t["content"]: t for t in doc.get("added_tokens") or []}
        self._normalize = _normalizer(doc.get("normalizer"))
        self._pre_steps = _pre_tokenizer(doc.get("pre_tokenizer"))
        self._decode_steps = _decoder(doc.get("decoder"))
        self._id_to_token: dict[int, str] = {i: t for t, i in vocab.items()}
        for t in self._added.values():
            self._id_to_token[int(t["id"])] = t["content"]
        self._size = max(self._id_to_token) + 1
        self._raw_re = self._added_regex(normalized=False)
        self._norm_re = self._added_regex(normalized=True)
        self._template = self._single_template(doc.get("post_processor"))
        self._cache: dict[str, tuple[int, ...]] = {}

    @property
    def bos_id(self) -> int | None:
        """The token the post-processor puts before the text (None when it puts none)."""
        first = self._template[0] if self._template else None
        return first if first is not None and len(self._template) > 1 else None

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the file's template."""
        check_text(text)
        ids: list[int] = []
        pos = 0
        for piece, added in self._cut(text, self._raw_re):
            if added is not None:
                ids.append(added)
                pos += 1
                continue
            first = pos == 0
            pos += 1
            for sub, added2 in self._cut(self._normalize(piece), self._norm_re):
                if added2 is not None:
                    ids.append(added2)
                    first = False
                else:
                    ids += self._encode_normalized_piece(sub, first)
                    first = False
        if not add_special_tokens:
            return ids
        out: list[int] = []
        for item in self._template:
            out += ids if item is None else [item]
        return out

    def _encode_normalized_piece(self, text: str, first: bool) -> list[int]:
        pieces = [(text, first)]
        for step in self._pre_steps:
            pieces = [q for p, f in pieces for q in step(p, f)]
        ids: list[int] = []
        cache = self._cache
        for piece, _ in pieces:
            found = cache.get(piece)
            if found is None:
                found = self._bpe_word(piece)
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[piece] = found
            ids += found
        return ids

    def _symbols(self, word: str) -> list[str]:
        """The first symbols of ``word``: its characters, a character that is not a token as
        its byte tokens (or the unknown token)."""
        vocab, out = self._vocab, []
        unk = None if self._unk is None else self._id_to_token[self._unk]
        last_unk = False
        for c in word:
            if c in vocab:
                out.append(c)
                last_unk = False
                continue
            if self._byte_fallback:
                parts = [BYTE_TOKENS[b] for b in c.encode("utf-8")]
                if all(p in vocab for p in parts):
                    out += parts
                    last_unk = False
                    continue
            if unk is None:
                raise InputError(
                    f"the tokenizer has no token for {c!r}, no byte tokens for it and no "
                    "unknown token: that text cannot be encoded"
                )
            if not (self._fuse_unk and last_unk):
                out.append(unk)
            last_unk = True
        return out

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        vocab = self._vocab
        if self._ignore_merges and word in vocab:
            return (vocab[word],)
        symbols: list[str | None] = list(self._symbols(word))
        n = len(symbols)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        merges = self._merges
        heap = []
        for i in range(n - 1):
            rank = merges.get((symbols[i], symbols[i + 1]))  # type: ignore[arg-type]
            if rank is not None:
                heap.append((rank, i, symbols[i], symbols[i + 1]))
        heapq.heapify(heap)
        while heap:
            rank, i, left, right = heapq.heappop(heap)
            j = nxt[i] if symbols[i] is not None else n
            if symbols[i] != left or j >= n or symbols[j] != right:
                continue  # stale: one side has merged since
            symbols[i], symbols[j] = left + right, None
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            for a, b in ((prv[i], i), (i, nxt[i])):
                if a >= 0 and b < n:
                    r = merges.get((symbols[a], symbols[b]))  # type: ignore[arg-type]
                    if r is not None:
                        heapq.heappush(heap, (r, a, symbols[a], symbols[b]))
        return tuple(vocab[s] for s in symbols if s is not None)

    # -- decoding and the protocol ----------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` through the file's decoder."""
        tokens = []
        special = self._special_ids if skip_special_tokens else set()
        for i in ids:
            t = self._id_to_token.get(i) if isinstance(i, int) else None
            if t is None:
                raise InvalidTokenIdError(
                    f"token id {i!r} is not in the vocabulary (size {self.vocab_size})"
                )
            if i not in special:
                tokens.append(t)
        return "".join(self._decode_steps(tokens))

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        return self.decode(ids, skip_special_tokens).encode("utf-8")

    def token_bytes(self, i: int) -> bytes:
        t = self._id_to_token.get(i)
        if t in _BYTE_OF:
            return bytes([_BYTE_OF[t]])
        return self.decode_bytes([i])

    def token_text(self, i: int) -> str:
        t = self._id_to_token.get(i)
        if t is None:
            raise InvalidTokenIdError(f"token id {i!r} is not in the vocabulary")
        return t.replace(SPACE, " ")

    @property
    def vocab_size(self) -> int:
        return self._size


def _pair_ranks(raw: Iterable, vocab: dict[str, int]) -> dict[tuple[str, str], int]:
    """``{(left, right): rank}`` from ``"a b"`` strings or ``["a", "b"]`` pairs."""
    out: dict[tuple[str, str], int] = {}
    for rank, item in enumerate(raw):
        pair = item.split(" ", 1) if isinstance(item, str) else item
        if len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise _fail(f"merge {rank} {item!r} is not a pair of tokens")
        if pair[0] + pair[1] not in vocab:
            raise _fail(f"merge {rank} {item!r} makes {pair[0] + pair[1]!r}, not in the vocab")
        out.setdefault((pair[0], pair[1]), rank)
    return out
