"""BERT's basic tokenization, the steps before WordPiece: special tokens, ``BertNormalizer`` and
``BertPreTokenizer`` (Devlin et al., 2019; Google's ``tokenization.py``, as Hugging Face
``tokenizers`` runs it).

* The five special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (:data:`SPECIAL_TOKENS`) are cut
  out of the text first, exactly (:data:`SPECIAL_SPLIT`), before any normalisation.
* :func:`bert_normalize`: ``clean_text`` (remove NUL, U+FFFD and Cc/Cf/Co characters except
  tab, newline and carriage return), ``strip_accents`` (NFD, drop category Mn), ``lowercase``
  (character by character, no Greek final sigma).
* :func:`word_pattern`: the pre-tokenizer regex; each match is one word: a CJK ideograph, a
  punctuation character, or a run of anything else that is not whitespace.

The WordPiece pieces of each word: :mod:`attnlm.tokenizers.wordpiece.tokenizer`.
"""

from __future__ import annotations

import unicodedata

import regex

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 100

#: Cuts text at the special tokens: ``SPECIAL_SPLIT.split(text)`` has them at odd positions.
SPECIAL_SPLIT = regex.compile("(" + "|".join(regex.escape(s) for s in SPECIAL_TOKENS) + ")")

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


def word_pattern(handle_chinese_chars: bool) -> regex.Pattern[str]:
    """BertPreTokenizer as a regex whose ``findall`` gives the words of normalised text;
    ``handle_chinese_chars``: every CJK ideograph is a word of its own."""
    return _WORD if handle_chinese_chars else _WORD_NO_CJK


def bert_normalize(
    text: str, *, clean_text: bool, lowercase: bool, strip_accents: bool | None
) -> str:
    """BertNormalizer: clean text, strip accents, lower-case (CJK is handled by the split);
    ``strip_accents=None`` strips them when lower-casing."""
    if text.isascii():
        if clean_text:
            text = text.translate(_ASCII_CONTROL)
        return text.lower() if lowercase else text
    if clean_text:
        text = _CONTROL.sub("", text)
    strip = lowercase if strip_accents is None else strip_accents
    if strip:
        text = _MARK.sub("", unicodedata.normalize("NFD", text))
    return _lower(text) if lowercase else text
