"""The WordPiece tokenizer: BERT's greedy longest-match-first sub-words, and decoding.

Follows BERT (Devlin et al., 2019; Google's ``tokenization.py``) as Hugging Face's
``BertTokenizerFast`` runs it, so ids are identical to ``BertTokenizerFast`` (all steps: the
docstring of :mod:`attnlm.tokenizers.wordpiece`). Special tokens, normalisation and
pre-tokenisation come from :mod:`~attnlm.tokenizers.wordpiece.basic`; this module holds step 4,
**WordPiece**: per word, the longest vocabulary entry that starts it, then the longest
``##``-prefixed entry that continues it, and so on (a word with a part that matches nothing,
or longer than ``max_input_chars_per_word``, is one ``[UNK]``), with a per-chunk cache (the
fast path of :meth:`WordPieceTokenizer._encode_plain`). Model input:
:mod:`~attnlm.tokenizers.wordpiece.template`; training: :mod:`~attnlm.tokenizers.wordpiece.train`;
BERT and Hugging Face files: :mod:`~attnlm.tokenizers.wordpiece.files`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.tokenizers.base import (
    InvalidTokenIdError,
    Tokenizer,
    TokenizerConfigError,
    TokenizerFileError,
    check_text,
    register_kind,
)
from attnlm.tokenizers.wordpiece.basic import (
    CLS,
    MASK,
    MAX_INPUT_CHARS_PER_WORD,
    PAD,
    PREFIX,
    SEP,
    SPECIAL_SPLIT,
    SPECIAL_TOKENS,
    UNK,
    bert_normalize,
    word_pattern,
)
from attnlm.tokenizers.wordpiece.files import (
    config_options,
    hf_json_settings,
    open_bert_file,
    read_vocab_txt,
    write_vocab_txt,
)
from attnlm.tokenizers.wordpiece.template import model_input, pad_rows, truncate_longest_first
from attnlm.tokenizers.wordpiece.train import learn_vocab

# ``transformers``' clean-up of decoded text (``clean_up_tokenization_spaces=True``), in its
# order: the spaces that token joining puts before punctuation and around apostrophes
CLEAN_UP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


@register_kind
class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece tokenizer (the exact steps: :mod:`attnlm.tokenizers.wordpiece`).

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
        self._special_split = SPECIAL_SPLIT
        self._word_re = word_pattern(self.handle_chinese_chars)
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
        tokens = read_vocab_txt(p)
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
        tokens, kw = hf_json_settings(doc)
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
        merges, the algorithm of ``tokenizers``' ``WordPieceTrainer``
        (:mod:`attnlm.tokenizers.wordpiece.train`).

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
        return cls(learn_vocab(word_counts, vocab_size, min_frequency), **opts)

    # ------------------------------------------------------------------ encoding
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def special_tokens(self) -> dict[str, int]:
        return {s: self.token_to_id[s] for s in SPECIAL_TOKENS}

    def normalize(self, text: str) -> str:
        """BertNormalizer: clean text, strip accents, lower-case (CJK is handled by the split)."""
        return bert_normalize(
            text,
            clean_text=self.clean_text,
            lowercase=self.lowercase,
            strip_accents=self.strip_accents,
        )

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
            a, b = truncate_longest_first(a, b, max_length)
        return model_input(a, b, self.cls_id, self.sep_id)

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
        return pad_rows(rows, self.pad_id, pad_to)

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
        write_vocab_txt(path, self.vocab)

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
    p, doc = open_bert_file(path)
    if doc is not None:
        options: dict[str, Any] = {}
        mml = config_options(p).get("model_max_length")
        if mml is not None:
            options["model_max_length"] = mml
        try:
            return WordPieceTokenizer.from_hf_json(doc, **options)
        except TokenizerFileError as e:
            raise TokenizerFileError(f"{p}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TokenizerFileError(f"{p}: corrupt tokenizer.json ({e!r})") from None
    return WordPieceTokenizer.from_vocab_file(p, **config_options(p))
