"""WordPiece tokenizer: BERT's basic tokenization, then greedy longest-match-first sub-words.

Follows BERT (Devlin et al., 2019; Google's ``tokenization.py``) as Hugging Face's
``BertTokenizerFast`` runs it (``tokenizers``' ``BertNormalizer`` + ``BertPreTokenizer`` +
``WordPiece`` model + BERT template), so ids are identical to ``BertTokenizerFast``:

1. **Special tokens** ``[PAD] [UNK] [CLS] [SEP] [MASK]`` written in the text are matched first,
   exactly (case-sensitive, before any normalisation), and become their own ids.
2. **Normalisation** (``BertNormalizer``), in this order: ``clean_text`` removes NUL, U+FFFD and
   control, format and private-use characters (Cc, Cf, Co; not tab, newline, carriage return,
   and not unassigned code points, which ``tokenizers`` keeps) and
   turns whitespace into spaces; ``handle_chinese_chars`` makes every CJK ideograph its own
   word; ``strip_accents`` (default: same as ``lowercase``) decomposes to NFD and drops
   non-spacing marks (category Mn); ``lowercase`` lowers each character on its own (no Greek
   final-sigma rule, as Rust's ``char::to_lowercase``).
3. **Pre-tokenisation** (``BertPreTokenizer``): split on whitespace, and make every punctuation
   character its own word; punctuation is every ASCII character that is neither a letter, a
   digit nor a space (``!"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~``) plus Unicode categories P*.
4. **WordPiece**: per word, take the longest vocabulary entry that starts the word, then the
   longest ``##``-prefixed entry that continues it, and so on; a word with a part that matches
   nothing, or longer than ``max_input_chars_per_word`` (100) characters, becomes one
   ``[UNK]``.

:meth:`WordPieceTokenizer.encode` gives the ids without ``[CLS]``/``[SEP]`` (as
``add_special_tokens=False``); :meth:`~WordPieceTokenizer.encode_for_model` gives model input
``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with token-type ids (0 for A and its
separators, 1 for B and its final ``[SEP]``), an attention mask, and truncation to the model
window (longest-first for pairs, as ``tokenizers``);
:meth:`~WordPieceTokenizer.encode_batch_for_model` pads a batch on the right with ``[PAD]``.

**Training** (:meth:`WordPieceTokenizer.train`) uses the algorithm of Hugging Face
``tokenizers``' ``WordPieceTrainer``: BPE merges over the words of the basic tokenisation, where
every character after the first of a word is a ``##`` continuation symbol; merging ``a`` and
``##b`` gives ``ab``, merging ``##a`` and ``##b`` gives ``##ab``. The vocabulary is the special
tokens, every character of the training words, the ``##`` forms of the characters seen inside
words (each group in code-point order), then the merged symbols in merge order. Ties between
equally frequent pairs go to the pair with the smallest ids (left, then right), the rule of
``tokenizers``' trainer; since our alphabet ids follow code points (``tokenizers`` numbers its
``##`` characters in hash-map order), the result is the same on every machine. (Google's
original trainer scores candidates by the likelihood gain of a unigram language model
instead; we do not implement it.)

Files: :meth:`from_vocab_file` reads BERT's ``vocab.txt`` (one token per line, line number =
id); :meth:`from_hf_json` reads a ``tokenizers`` ``tokenizer.json`` whose model is
``WordPiece`` (``BertNormalizer`` options, vocab, unk token, continuing prefix, maximum word
length); both are also reached through :func:`attnlm.tokenizers.load`, which accepts a folder
holding either file. :meth:`save` writes our JSON format (fields in :meth:`to_dict`).
"""

from __future__ import annotations

import os
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import regex

from attnlm.errors import InputError
from attnlm.fileio import read_file_text
from attnlm.tokenizers.base import (
    InvalidTokenIdError,
    Tokenizer,
    TokenizerConfigError,
    TokenizerFileError,
    check_text,
    register_kind,
)
from attnlm.tokenizers.training import learn_merges

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 100
MODEL_INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")

# CJK Unified Ideographs blocks, as BERT's ``_is_chinese_char`` (not Hangul, kana or symbols),
# with the ranges of tokenizers' BertNormalizer: it starts Extension E at U+2B920, where
# Google's code has U+2B820, so U+2B820-U+2B91F are ordinary letters here.
_CJK = (
    "\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff"
    "\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b920-\U0002ceaf\U0002f800-\U0002fa1f"
)
_ASCII_PUNCT = r"!-/:-@\[-`{-~"
# One pre-token: a CJK ideograph, a punctuation character, or a run of anything else that is
# not whitespace. (Whitespace is \s: after clean_text it is exactly Rust's char::is_whitespace.)
_WORD = regex.compile(rf"[{_CJK}]|[{_ASCII_PUNCT}\p{{P}}]|[^\s{_CJK}{_ASCII_PUNCT}\p{{P}}]+")
_WORD_NO_CJK = regex.compile(rf"[{_ASCII_PUNCT}\p{{P}}]|[^\s{_ASCII_PUNCT}\p{{P}}]+")
# clean_text: NUL, U+FFFD and control, format and private-use characters (Cc, Cf, Co) except
# \t \n \r go; unassigned code points (Cn) stay, as in tokenizers (its "other" tables list
# assigned characters only).
_CONTROL = regex.compile(r"[\x00\ufffd\p{Cc}\p{Cf}\p{Co}--[\t\n\r]]", flags=regex.V1)
_ASCII_CONTROL = {c: None for c in range(32) if chr(c) not in "\t\n\r"} | {127: None}
_MARK = regex.compile(r"\p{Mn}+")


def _lower(text: str) -> str:
    """Lower-case character by character (Rust ``char::to_lowercase``): capital sigma is
    always ``σ``, never the final ``ς`` that Python's ``str.lower`` picks at a word end."""
    if "\u03a3" in text:
        text = text.replace("\u03a3", "\u03c3")
    return text.lower()


# ``transformers``' clean-up of decoded text (``clean_up_tokenization_spaces=True``), in its
# order: the spaces that token joining puts before punctuation and around apostrophes
CLEAN_UP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


@register_kind
class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece tokenizer (see the module docstring for the exact steps).

    ``vocab``: the tokens, position = id; it must contain the five special tokens.
    ``lowercase``: lower-case the text (BERT "uncased"); ``strip_accents``: drop accents
    (``None`` means "when lower-casing", BERT's default); ``handle_chinese_chars``: every CJK
    ideograph its own word; ``clean_text``: remove control characters and normalise whitespace;
    ``max_input_chars_per_word``: longer words become ``[UNK]``; ``model_max_length``: the
    default truncation length of :meth:`encode_for_model` (``None``: no truncation).

    Attributes: ``pad_id``, ``unk_id``, ``cls_id``, ``sep_id``, ``mask_id``, ``vocab`` (list),
    ``token_to_id`` (dict).

    JSON fields: ``vocab`` (list of strings), ``lowercase``, ``strip_accents`` (bool or null),
    ``handle_chinese_chars``, ``clean_text``, ``continuing_prefix`` (``"##"``),
    ``max_input_chars_per_word``, ``model_max_length`` (int or null).
    """

    kind = "wordpiece"

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        handle_chinese_chars: bool = True,
        clean_text: bool = True,
        continuing_prefix: str = PREFIX,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
        model_max_length: int | None = None,
    ) -> None:
        vocab = list(vocab)
        if any(not isinstance(t, str) or not t for t in vocab):
            raise TokenizerConfigError("WordPiece vocabulary entries must be non-empty strings")
        token_to_id: dict[str, int] = {}
        for i, t in enumerate(vocab):
            token_to_id[t] = i  # a duplicate line maps to its last id, as BERT's load_vocab
        missing = [s for s in SPECIAL_TOKENS if s not in token_to_id]
        if missing:
            raise TokenizerConfigError(
                "WordPiece vocabulary lacks the special token(s) " + " ".join(missing)
            )
        if not continuing_prefix:
            raise TokenizerConfigError("continuing_prefix must be a non-empty string")
        if max_input_chars_per_word < 1:
            raise TokenizerConfigError("max_input_chars_per_word must be at least 1")
        if model_max_length is not None and model_max_length < 2:
            raise TokenizerConfigError("model_max_length must be at least 2 ([CLS] and [SEP])")
        self.vocab: list[str] = vocab
        self.token_to_id: dict[str, int] = token_to_id
        self.lowercase = bool(lowercase)
        self.strip_accents = None if strip_accents is None else bool(strip_accents)
        self.handle_chinese_chars = bool(handle_chinese_chars)
        self.clean_text = bool(clean_text)
        self.continuing_prefix = continuing_prefix
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        self.model_max_length = model_max_length
        self.pad_id = token_to_id[PAD]
        self.unk_id = token_to_id[UNK]
        self.cls_id = token_to_id[CLS]
        self.sep_id = token_to_id[SEP]
        self.mask_id = token_to_id[MASK]
        self._special_ids = frozenset(token_to_id[s] for s in SPECIAL_TOKENS)
        self._special_split = regex.compile(
            "(" + "|".join(regex.escape(s) for s in SPECIAL_TOKENS) + ")"
        )
        self._word_re = _WORD if self.handle_chinese_chars else _WORD_NO_CJK
        # Sub-word tables: word-initial pieces and continuation pieces (prefix removed), with
        # the longest piece length, so matching tries only lengths that can exist.
        p = continuing_prefix
        self._first = {t: i for t, i in token_to_id.items() if not t.startswith(p)}
        self._cont = {t[len(p) :]: i for t, i in token_to_id.items() if t.startswith(p) and t != p}
        self._max_first = max(map(len, self._first), default=1)
        self._max_cont = max(map(len, self._cont), default=1)
        self._cache: dict[str, tuple[int, ...]] = {}  # whitespace chunk -> ids
        self._word_cache: dict[str, tuple[int, ...]] = {}  # pre-tokenized word -> ids

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_vocab_file(cls, path: str | os.PathLike[str], **options: Any) -> WordPieceTokenizer:
        """Read a BERT ``vocab.txt`` (UTF-8, one token per line, line number = id).

        ``options`` are the constructor's keywords (e.g. ``lowercase=False`` for a cased
        vocabulary); defaults are BERT uncased.
        """
        p = Path(path)
        raw = read_file_text(p, "vocabulary file", TokenizerFileError)
        lines = raw.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        tokens = [t.rstrip("\r") for t in lines]
        if not tokens:
            raise TokenizerFileError(f"{p}: empty vocabulary file")
        if "" in tokens:
            raise TokenizerFileError(f"{p}: empty line {tokens.index('') + 1} in vocabulary file")
        try:
            return cls(tokens, **options)
        except TokenizerConfigError as e:
            raise TokenizerFileError(f"{p}: {e}") from None

    @classmethod
    def from_bert_files(cls, path: str | os.PathLike[str]) -> WordPieceTokenizer:
        """A BERT ``vocab.txt``, WordPiece ``tokenizer.json`` or a folder holding them (with
        ``tokenizer_config.json`` options): :func:`load_bert_files`."""
        return load_bert_files(path)

    @classmethod
    def from_hf_json(cls, doc: dict[str, Any], **options: Any) -> WordPieceTokenizer:
        """Build from a parsed Hugging Face ``tokenizers`` ``tokenizer.json`` document.

        Reads ``model`` (``type: WordPiece``, ``vocab`` ``{token: id}``, ``unk_token``,
        ``continuing_subword_prefix``, ``max_input_chars_per_word``), the ``BertNormalizer``
        options and the truncation length. Raises :class:`TokenizerFileError` for another model
        type or pre-tokenizer.
        """
        model = doc.get("model") or {}
        if model.get("type") != "WordPiece":
            raise TokenizerFileError(
                f"tokenizer.json model is {model.get('type')!r}, only 'WordPiece' is supported"
            )
        if model.get("unk_token", UNK) != UNK:
            raise TokenizerFileError(f"unk_token {model['unk_token']!r} is not {UNK}")
        vocab_map = model["vocab"]
        ids = sorted(vocab_map.values())
        if ids != list(range(len(ids))):
            raise TokenizerFileError("WordPiece vocab ids are not 0..N-1 without gaps")
        tokens = [""] * len(ids)
        for t, i in vocab_map.items():
            tokens[i] = t
        norm = doc.get("normalizer")
        kw: dict[str, Any] = {}
        if norm is None:
            kw.update(lowercase=False, strip_accents=False, handle_chinese_chars=False)
            kw.update(clean_text=False)
        elif norm.get("type") == "BertNormalizer":
            kw.update(
                lowercase=norm.get("lowercase", True),
                strip_accents=norm.get("strip_accents"),
                handle_chinese_chars=norm.get("handle_chinese_chars", True),
                clean_text=norm.get("clean_text", True),
            )
        else:
            raise TokenizerFileError(f"unsupported normalizer {norm.get('type')!r}")
        pre = doc.get("pre_tokenizer")
        if pre is not None and pre.get("type") != "BertPreTokenizer":
            raise TokenizerFileError(f"unsupported pre_tokenizer {pre.get('type')!r}")
        trunc = doc.get("truncation") or {}
        kw.update(
            continuing_prefix=model.get("continuing_subword_prefix", PREFIX),
            max_input_chars_per_word=model.get("max_input_chars_per_word", 100),
            model_max_length=trunc.get("max_length"),
        )
        kw.update(options)
        try:
            return cls(tokens, **kw)
        except TokenizerConfigError as e:
            raise TokenizerFileError(str(e)) from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WordPieceTokenizer:
        vocab = data["vocab"]
        if not isinstance(vocab, list):
            raise TypeError("'vocab' must be a list of strings")
        try:
            return cls(
                vocab,
                lowercase=data["lowercase"],
                strip_accents=data.get("strip_accents"),
                handle_chinese_chars=data.get("handle_chinese_chars", True),
                clean_text=data.get("clean_text", True),
                continuing_prefix=data.get("continuing_prefix", PREFIX),
                max_input_chars_per_word=data.get("max_input_chars_per_word", 100),
                model_max_length=data.get("model_max_length"),
            )
        except TokenizerConfigError as e:
            raise TokenizerFileError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "vocab": self.vocab,
            "lowercase": self.lowercase,
            "strip_accents": self.strip_accents,
            "handle_chinese_chars": self.handle_chinese_chars,
            "clean_text": self.clean_text,
            "continuing_prefix": self.continuing_prefix,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "model_max_length": self.model_max_length,
        }

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        text: str | Iterable[str],
        vocab_size: int,
        *,
        min_frequency: int = 0,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        handle_chinese_chars: bool = True,
        model_max_length: int | None = None,
    ) -> WordPieceTokenizer:
        """Learn a vocabulary of at most ``vocab_size`` tokens (specials and characters
        included) from ``text`` (a string or an iterable of strings) by ``##``-aware BPE
        merges, the algorithm of ``tokenizers``' ``WordPieceTrainer`` (module docstring).

        ``min_frequency``: stop when the best pair is rarer. The five special tokens take ids
        0-4 (``[PAD]`` = 0).
        """
        opts = dict(
            lowercase=lowercase,
            strip_accents=strip_accents,
            handle_chinese_chars=handle_chinese_chars,
            model_max_length=model_max_length,
        )
        probe = cls(list(SPECIAL_TOKENS), **opts)
        texts = [text] if isinstance(text, str) else text
        word_counts: Counter[str] = Counter()
        for t in texts:
            check_text(t)
            for piece in probe._special_split.split(t):
                if piece and piece not in probe.token_to_id:
                    word_counts.update(probe._words(piece))
        if not word_counts:
            raise TokenizerConfigError("cannot train a WordPiece vocabulary on text without words")
        # Symbols: "\x00c" is a word-initial piece (NUL never survives clean_text), "c" a
        # continuation; so string concatenation of two symbols is the merged symbol.
        # Alphabet as tokenizers': every character as a word-initial piece (so a word may
        # start with any character seen in training), plus "##c" for characters seen inside
        # words; code-point order, so ties (smallest pair of ids) break the same everywhere.
        firsts = sorted({c for w in word_counts for c in w})
        conts = sorted({c for w in word_counts for c in w[1:]})
        symbols: list[str] = ["\x00" + c for c in firsts] + conts
        n_base = len(SPECIAL_TOKENS) + len(symbols)
        if vocab_size < n_base:
            raise TokenizerConfigError(
                f"vocab_size {vocab_size} is below the {len(SPECIAL_TOKENS)} special tokens plus "
                f"{len(symbols)} characters of this text (use at least {n_base})"
            )
        sid = {s: i for i, s in enumerate(symbols)}
        words = [[sid["\x00" + w[0]]] + [sid[c] for c in w[1:]] for w in word_counts]
        counts = list(word_counts.values())
        learn_merges(
            words,
            counts,
            symbols,
            vocab_size - len(SPECIAL_TOKENS),
            min_frequency=min_frequency,
        )
        seen: set[str] = set()
        vocab = list(SPECIAL_TOKENS)
        for s in symbols:
            tok = s[1:] if s.startswith("\x00") else PREFIX + s
            if tok not in seen and tok not in SPECIAL_TOKENS:
                seen.add(tok)
                vocab.append(tok)
        return cls(vocab, **opts)

    # ------------------------------------------------------------------ encoding
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def special_tokens(self) -> dict[str, int]:
        return {s: self.token_to_id[s] for s in SPECIAL_TOKENS}

    def normalize(self, text: str) -> str:
        """BertNormalizer: clean text, strip accents, lower-case (CJK is handled by the split)."""
        if text.isascii():
            if self.clean_text:
                text = text.translate(_ASCII_CONTROL)
            return text.lower() if self.lowercase else text
        if self.clean_text:
            text = _CONTROL.sub("", text)
        strip = self.lowercase if self.strip_accents is None else self.strip_accents
        if strip:
            text = _MARK.sub("", unicodedata.normalize("NFD", text))
        return _lower(text) if self.lowercase else text

    def _words(self, text: str) -> list[str]:
        """Normalised words of ``text`` (no special-token handling): BertPreTokenizer."""
        return self._word_re.findall(self.normalize(text))

    def _word_ids(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first WordPiece ids of one word."""
        n = len(word)
        if n > self.max_input_chars_per_word:
            return (self.unk_id,)
        out: list[int] = []
        table, longest = self._first, self._max_first
        start = 0
        while start < n:
            end = min(n, start + longest)
            while end > start:
                i = table.get(word[start:end])
                if i is not None:
                    break
                end -= 1
            else:
                return (self.unk_id,)
            out.append(i)
            start = end
            table, longest = self._cont, self._max_cont
        return tuple(out)

    def _encode_plain(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (no special tokens) to ``out``.

        Fast path: after ``clean_text`` the whitespace of ``str.split`` is exactly BERT's, so
        the normalised text is cut into whitespace-separated chunks and each distinct chunk
        (``"lord,"``) is split into words and pieces once, then served from a cache."""
        norm = self.normalize(text)
        if not self.clean_text:  # str.split's whitespace may differ from BERT's here
            for w in self._word_re.findall(norm):
                out += self._word_ids(w)
            return
        cache, words = self._cache, self._word_cache
        if len(cache) > 500_000:
            cache.clear()
            words.clear()
        get, word_get, findall = cache.get, words.get, self._word_re.findall
        for chunk in norm.split():
            ids = get(chunk)
            if ids is None:
                ws = findall(chunk)
                if len(ws) == 1:
                    w = ws[0]
                    ids = word_get(w)
                    if ids is None:
                        ids = words[w] = self._word_ids(w)
                else:
                    pieces: list[int] = []
                    for w in ws:
                        wids = word_get(w)
                        if wids is None:
                            wids = words[w] = self._word_ids(w)
                        pieces += wids
                    ids = tuple(pieces)
                cache[chunk] = ids
            out += ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without ``[CLS]``/``[SEP]`` (``add_special_tokens=False``);
        special tokens written in the text (``[MASK]``) become their ids."""
        check_text(text)
        out: list[int] = []
        if "[" in text:
            specials = self.token_to_id
            for k, piece in enumerate(self._special_split.split(text)):
                if k % 2:
                    out.append(specials[piece])
                elif piece:
                    self._encode_plain(piece, out)
        else:
            self._encode_plain(text, out)
        return out

    def tokenize(self, text: str) -> list[str]:
        """The token strings of ``encode(text)`` (``##`` marks a continuation)."""
        vocab = self.vocab
        return [vocab[i] for i in self.encode(text)]

    def encode_for_model(
        self,
        text: str | Sequence[int],
        pair: str | Sequence[int] | None = None,
        max_length: int | None = None,
    ) -> dict[str, list[int]]:
        """Model input for one sentence or a sentence pair, as ``BertTokenizerFast(text, pair,
        truncation=True, max_length=max_length)``.

        ``text``/``pair``: strings, or ids already encoded with :meth:`encode`.
        ``max_length`` (default ``model_max_length``; ``None``: no truncation) counts the
        special tokens; an empty ``pair`` string counts as no pair (as ``transformers``); a
        pair is cut longest-first (the longer side loses tokens from its
        end; when both are too long each keeps half). Returns ``{"input_ids",
        "token_type_ids", "attention_mask"}``, lists of the same length T.
        """
        if isinstance(pair, str) and not pair:
            pair = None  # as transformers, an empty second text means no pair
        a = self.encode(text) if isinstance(text, str) else list(text)
        b = None if pair is None else (self.encode(pair) if isinstance(pair, str) else list(pair))
        if max_length is None:
            max_length = self.model_max_length
        if max_length is not None:
            a, b = self._truncate(a, b, max_length)
        ids = [self.cls_id, *a, self.sep_id]
        types = [0] * len(ids)
        if b is not None:
            ids += b
            ids.append(self.sep_id)
            types += [1] * (len(b) + 1)
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids)}

    def _truncate(
        self, a: list[int], b: list[int] | None, max_length: int
    ) -> tuple[list[int], list[int] | None]:
        """Longest-first truncation of ``tokenizers`` (``TruncationStrategy::LongestFirst``)."""
        n_special = 2 if b is None else 3
        room = max_length - n_special
        if room < 0:
            raise InputError(
                f"max_length {max_length} leaves no room next to the {n_special} special tokens"
            )
        if b is None:
            return a[:room], None
        if len(a) + len(b) <= room:
            return a, b
        n1, n2 = len(a), len(b)
        swap = n1 > n2
        if swap:
            n1, n2 = n2, n1
        n2 = n1 if n1 > room else max(n1, room - n1)
        if n1 + n2 > room:
            n1 = room // 2
            n2 = n1 + room % 2
        if swap:
            n1, n2 = n2, n1
        return a[:n1], b[:n2]

    def encode_batch_for_model(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        pad_to: int | None = None,
    ) -> dict[str, list[list[int]]]:
        """A padded batch of :meth:`encode_for_model` results (``padding=True``): every row is
        right-padded with ``[PAD]`` (type 0, mask 0) to the longest row, or to ``pad_to`` when
        given (``padding="max_length"``). Returns lists of B rows of equal length T;
        ``torch.tensor`` turns each into a ``(B, T)`` tensor."""
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"{len(texts)} texts but {len(pairs)} pairs")
        rows = [
            self.encode_for_model(t, None if pairs is None else pairs[k], max_length)
            for k, t in enumerate(texts)
        ]
        width = max((len(r["input_ids"]) for r in rows), default=0)
        if pad_to is not None:
            if pad_to < width:
                raise InputError(f"pad_to {pad_to} is shorter than the longest row ({width})")
            width = pad_to
        out: dict[str, list[list[int]]] = {k: [] for k in MODEL_INPUT_KEYS}
        for r in rows:
            n = width - len(r["input_ids"])
            out["input_ids"].append(r["input_ids"] + [self.pad_id] * n)
            out["token_type_ids"].append(r["token_type_ids"] + [0] * n)
            out["attention_mask"].append(r["attention_mask"] + [0] * n)
        return out

    # ------------------------------------------------------------------ decoding
    def decode(
        self,
        ids: Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool = False,
    ) -> str:
        """Text of ``ids`` as ``BertTokenizerFast.decode``: tokens joined by spaces, a
        ``##`` piece glued to the previous one, no space before ``. , ? !``;
        ``skip_special_tokens`` drops the five special tokens; ``clean_up_tokenization_spaces``
        also removes the spaces of :data:`CLEAN_UP` (as ``transformers`` with that flag: "J '
        ai" -> "J'ai", "don ' t" -> "don't")."""
        vocab = self.vocab
        n = len(vocab)
        p = self.continuing_prefix
        out: list[str] = []
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < n:
                raise InvalidTokenIdError(f"token id {i!r} is not in the vocabulary (size {n})")
            if skip_special_tokens and i in self._special_ids:
                continue
            t = vocab[i]
            if out:
                if t.startswith(p):
                    t = t[len(p) :]
                elif t not in (".", ",", "?", "!"):
                    t = " " + t
            out.append(t)
        text = "".join(out)
        if clean_up_tokenization_spaces:
            for spaced, joined in CLEAN_UP:
                text = text.replace(spaced, joined)
        return text

    def token_text(self, i: int) -> str:
        """The vocabulary entry of id ``i`` (``##ing`` for a continuation)."""
        if not isinstance(i, int) or not 0 <= i < len(self.vocab):
            raise InvalidTokenIdError(f"token id {i!r} is not in the vocabulary")
        return self.vocab[i]

    def save_vocab(self, path: str | os.PathLike[str]) -> None:
        """Write the vocabulary as a BERT ``vocab.txt`` (one token per line)."""
        from attnlm.fileio import atomic_write_text

        atomic_write_text(Path(path), "".join(t + "\n" for t in self.vocab))

    def __repr__(self) -> str:
        return (
            f"WordPieceTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
            f"strip_accents={self.strip_accents})"
        )


def load_bert_files(path: str | os.PathLike[str]) -> WordPieceTokenizer:
    """A WordPiece tokenizer from a ``vocab.txt``, a ``tokenizer.json``, or a folder holding
    one of them (``tokenizer.json`` preferred). A ``vocab.txt`` takes ``do_lower_case``,
    ``strip_accents``, ``tokenize_chinese_chars`` and ``model_max_length`` from a
    ``tokenizer_config.json`` beside it when there is one (else BERT uncased defaults); a
    ``tokenizer.json`` takes only ``model_max_length`` from it (as ``transformers`` does)."""
    import json

    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            p = p / "tokenizer.json"
        elif (p / "vocab.txt").is_file():
            p = p / "vocab.txt"
        else:
            raise TokenizerFileError(f"{p}: folder has neither tokenizer.json nor vocab.txt")
    try:
        with open(p, encoding="utf-8") as f:
            is_json = f.read(64).lstrip().startswith("{")
    except FileNotFoundError:
        raise TokenizerFileError(f"{p}: no such tokenizer or vocabulary file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerFileError(f"{p}: cannot read file ({e})") from None
    if is_json:
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerFileError(f"{p}: cannot read tokenizer file ({e})") from None
        options: dict[str, Any] = {}
        mml = _config_options(p).get("model_max_length")
        if mml is not None:
            options["model_max_length"] = mml
        try:
            return WordPieceTokenizer.from_hf_json(doc, **options)
        except TokenizerFileError as e:
            raise TokenizerFileError(f"{p}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TokenizerFileError(f"{p}: corrupt tokenizer.json ({e!r})") from None
    return WordPieceTokenizer.from_vocab_file(p, **_config_options(p))


def _config_options(p: Path) -> dict[str, Any]:
    """Constructor options from the ``tokenizer_config.json`` beside ``p`` (if any)."""
    import json

    options: dict[str, Any] = {}
    cfg = p.with_name("tokenizer_config.json")
    if cfg.is_file():
        try:
            conf = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerFileError(f"{cfg}: cannot read tokenizer config ({e})") from None
        if "do_lower_case" in conf:
            options["lowercase"] = bool(conf["do_lower_case"])
        if "strip_accents" in conf:
            options["strip_accents"] = conf["strip_accents"]
        if "tokenize_chinese_chars" in conf:
            options["handle_chinese_chars"] = bool(conf["tokenize_chinese_chars"])
        mml = conf.get("model_max_length")
        if isinstance(mml, int) and 2 <= mml < 1_000_000:
            options["model_max_length"] = mml
    return options
