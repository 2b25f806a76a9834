"""BERT's and Hugging Face's WordPiece files, read and written without building a tokenizer.

* ``vocab.txt`` (BERT): UTF-8, one token per line, line number = id (:func:`read_vocab_txt`,
  :func:`write_vocab_txt`).
* ``tokenizer.json`` (Hugging Face ``tokenizers``) whose model is ``WordPiece``: the vocab
  ``{token: id}``, unk token, continuing prefix, maximum word length, the ``BertNormalizer``
  options and the truncation length (:func:`hf_json_settings`).
* ``tokenizer_config.json`` (``transformers``) beside either: ``do_lower_case``,
  ``strip_accents``, ``tokenize_chinese_chars``, ``model_max_length``
  (:func:`config_options`).

:func:`open_bert_file` finds the file in a folder (``tokenizer.json`` preferred) and parses it
when it is JSON. Our own JSON format is the tokenizer's ``to_dict`` (module
:mod:`attnlm.tokenizers.wordpiece.tokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_write_text, read_file_text
from attnlm.base.foreign import load_json
from attnlm.base.foreign import register as _register_reader
from attnlm.tokenizers.base import TokenizerFileError
from attnlm.tokenizers.wordpiece.basic import MAX_INPUT_CHARS_PER_WORD, PREFIX, UNK


def read_vocab_txt(p: Path) -> list[str]:
    """The tokens of a BERT ``vocab.txt`` in id order (CR LF line ends accepted)."""
    raw = read_file_text(p, "vocabulary file", TokenizerFileError)
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens = [t.rstrip("\r") for t in lines]
    if not tokens:
        raise TokenizerFileError(f"{p}: empty vocabulary file")
    if "" in tokens:
        raise TokenizerFileError(f"{p}: empty line {tokens.index('') + 1} in vocabulary file")
    return tokens


def write_vocab_txt(path: str | os.PathLike[str], vocab: Sequence[str]) -> None:
    """Write ``vocab`` as a BERT ``vocab.txt`` (one token per line)."""
    atomic_write_text(Path(path), "".join(t + "\n" for t in vocab))


def hf_json_settings(doc: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The tokens (in id order) and the WordPiece tokenizer's constructor keywords from a parsed
    ``tokenizer.json`` document. Raises :class:`TokenizerFileError` for another model type,
    unk token, normalizer or pre-tokenizer, and for ids with gaps."""
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
        max_input_chars_per_word=model.get("max_input_chars_per_word", MAX_INPUT_CHARS_PER_WORD),
        model_max_length=trunc.get("max_length"),
    )
    return tokens, kw


def open_bert_file(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any] | None]:
    """The ``vocab.txt`` or ``tokenizer.json`` at ``path`` or in the folder ``path``
    (``tokenizer.json`` preferred), with its parsed document when it is JSON (``None`` for a
    vocabulary file)."""
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
    if not is_json:
        return p, None
    try:
        return p, load_json(p, "tokenizer", expect=None)
    except InputError as e:
        raise TokenizerFileError(str(e)) from None


def config_options(p: Path) -> dict[str, Any]:
    """Constructor options from the ``tokenizer_config.json`` beside ``p`` (if any)."""
    options: dict[str, Any] = {}
    cfg = p.with_name("tokenizer_config.json")
    if cfg.is_file():
        try:
            conf = load_json(cfg, "tokenizer_config.json")
        except InputError as e:
            raise TokenizerFileError(str(e)) from None
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


_register_reader("vocab.txt", f"{__name__}.open_bert_file")
_register_reader("vocab.txt", f"{__name__}.config_options")
_register_reader("vocab.txt", f"{__name__}.read_vocab_txt")
