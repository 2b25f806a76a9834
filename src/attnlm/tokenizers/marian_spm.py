"""The SentencePiece tokenizers of an OPUS-MT (Marian) folder, encoding as
``transformers.MarianTokenizer`` does.

A Marian folder as published (Helsinki-NLP/opus-mt-*) has no ``tokenizer.json``; it has

* ``source.spm`` and ``target.spm``: SentencePiece models (protobuf) that cut the source and the
  target language into pieces (``▁Hel``, ``lo``);
* ``vocab.json``: ``{piece: id}``, the model's vocabulary, one for both sides (the ids are
  *not* the SentencePiece models' own ids);
* ``tokenizer_config.json``: ``unk_token`` / ``eos_token`` / ``pad_token`` (default ``<unk>``,
  ``</s>``, ``<pad>``), ``separate_vocabs`` (a ``target_vocab.json`` for the target side: not
  supported, refused in one line), optionally ``added_tokens_decoder`` and
  ``clean_up_tokenization_spaces``.

Encoding one side (``MarianTokenizer(text)`` and ``MarianTokenizer(text_target=text)`` without
their final ``</s>``, which :class:`~attnlm.data.pairs.PairTokenizers` appends):

1. the special and added token strings (``</s>``, ``<unk>``, ``<pad>``...) are cut out of the
   text whole (longest first) and become their ids; a token marked ``lstrip`` / ``rstrip``
   eats the white space on that side;
2. each remaining chunk that starts with a language code ``>>xxx<<`` gives that code as one
   token (a multilingual model's target language); the rest of the chunk is cut into pieces by
   that side's SentencePiece model;
3. each piece or code becomes its ``vocab.json`` id, the ``<unk>`` id when it has none.

Decoding (``MarianTokenizer.decode(ids, skip_special_tokens=True)``): special ids are dropped,
the others become their pieces, SentencePiece joins them (``▁`` is a space) and the text is
stripped. transformers 5 joins with the *source* model when the vocabulary is shared, and so
do we (the two give the same text for pieces both models know).

The SentencePiece segmentation itself is the ``sentencepiece`` package's.

JSON fields (``to_dict``): ``source_spm`` / ``target_spm`` (the model files' bytes, base64),
``vocab``, ``unk`` / ``eos`` / ``pad``, ``added`` (``{id, content, special, lstrip,
rstrip}``), ``clean_up_tokenization_spaces``: everything a run folder needs to reload it
without the original folder.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.foreign import foreign_reader, load_json
from attnlm.tokenizers.base import (
    MAX_VOCAB_SIZE,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerFileError,
    check_text,
    register_kind,
)

SIDES = ("source", "target")
SPM_FILES = {"source": "source.spm", "target": "target.spm"}
WORD_START = "\u2581"  # SentencePiece's "▁": a piece that starts a word
DEFAULT_SPECIALS = {"unk": "<unk>", "eos": "</s>", "pad": "<pad>"}


def is_marian_folder(folder: Path) -> bool:
    """A folder with Marian's SentencePiece files (``source.spm``, ``vocab.json``)."""
    return (folder / "source.spm").is_file() and (folder / "vocab.json").is_file()


def _processor(data: bytes, where: str) -> Any:
    """A ``sentencepiece.SentencePieceProcessor`` of a model file's bytes."""
    try:
        import sentencepiece
    except ImportError:
        raise InputError(f"{where}: reading SentencePiece models needs the sentencepiece "
                         "package (pip install sentencepiece)") from None  # fmt: skip
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(data)
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise TokenizerFileError(f"{where}: not a SentencePiece model ({first})") from None
    if sp.get_piece_size() < 1:
        raise TokenizerFileError(f"{where}: not a SentencePiece model (no pieces)")
    return sp


def _token_string(value: Any, default: str, where: str) -> str:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content"}``."""
    if value is None:
        return default
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise TokenizerFileError(f"{where}: a special token is {value!r}, not a string")
    return value


@register_kind
class MarianSPMTokenizer(Tokenizer):
    """The source and target SentencePiece tokenizers of an OPUS-MT folder over one
    vocabulary (see the module docstring). ``encode(text)`` is the source side;
    :meth:`encode_side` either side (what :class:`~attnlm.data.pairs.PairTokenizers` calls)."""

    kind = "marian-spm"

    def __init__(
        self,
        source_spm: bytes,
        target_spm: bytes,
        vocab: dict[str, int],
        unk: str = "<unk>",
        eos: str = "</s>",
        pad: str = "<pad>",
        added: list[dict[str, Any]] | None = None,
        clean_up_tokenization_spaces: bool = False,
        where: str | None = None,
    ) -> None:
        def at(file: str, field: str) -> str:  # errors name the folder's file, or the field
            return f"{where}/{file}" if where else field

        self._bytes = {"source": bytes(source_spm), "target": bytes(target_spm)}
        self._spm = {side: _processor(self._bytes[side], at(SPM_FILES[side], f"{side}_spm"))
                     for side in SIDES}  # fmt: skip
        in_vocab = at("vocab.json", "vocab")
        if not isinstance(vocab, dict) or not vocab:
            raise TokenizerFileError(f"{in_vocab}: not a {{piece: id}} object")
        bad = next((p for p, i in vocab.items() if type(i) is not int or not
                    0 <= i < MAX_VOCAB_SIZE), None)  # fmt: skip
        if bad is not None:
            raise TokenizerFileError(f"{in_vocab}: the id of {bad!r} is {vocab[bad]!r}, not an "
                                     f"id below {MAX_VOCAB_SIZE:,}")  # fmt: skip
        self._vocab = dict(vocab)
        self._pieces = {i: p for p, i in self._vocab.items()}  # the last piece of an id wins
        self.unk, self.eos, self.pad = unk, eos, pad
        for name in (unk, eos, pad):
            if name not in self._vocab:
                raise TokenizerFileError(f"{in_vocab}: has no {name!r} token")
        # the added tokens, cut out of the text whole: {content: (id, special, lstrip, rstrip)};
        # the special ones are dropped when decoding
        self._added: dict[str, tuple[int, bool, bool, bool]] = {
            t: (self._vocab[t], True, False, False) for t in (eos, unk, pad)
        }
        config = at("tokenizer_config.json", "added")
        for entry in added or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
                raise TokenizerFileError(f"{config}: added token {entry!r} has no content")
            i, content = entry.get("id"), entry["content"]
            if type(i) is not int or not 0 <= i < MAX_VOCAB_SIZE or not content:
                raise TokenizerFileError(f"{config}: added token {content!r} has id {i!r}")
            if entry.get("single_word"):
                raise TokenizerFileError(f"{config}: added token {content!r}: single_word "
                                         "tokens are not supported")  # fmt: skip
            special = bool(entry.get("special", False)) or content in (eos, unk, pad)
            self._added[content] = (i, special, bool(entry.get("lstrip")),
                                    bool(entry.get("rstrip")))  # fmt: skip
        self._added_ids = {v[0]: t for t, v in self._added.items()}
        self._special_ids = {v[0] for v in self._added.values() if v[1]}
        names = sorted(self._added, key=len, reverse=True)  # the longest of two at one place
        self._cut = re.compile("|".join(re.escape(t) for t in names))
        self.clean_up = bool(clean_up_tokenization_spaces)
        self._size = max(max(self._vocab.values()), *self._added_ids) + 1

    # -- loading a folder -----------------------------------------------------------------

    @classmethod
    def from_folder(cls, folder: str | Path) -> MarianSPMTokenizer:
        """The tokenizer of an OPUS-MT folder (``source.spm``, ``target.spm``, ``vocab.json``,
        ``tokenizer_config.json``); damaged or unsupported files are one line naming them."""
        return read_marian_folder(Path(folder))

    # -- the protocol ---------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def special_tokens(self) -> dict[str, int]:
        return {t: v[0] for t, v in self._added.items() if v[1]}

    def encode(self, text: str) -> list[int]:
        """The source side's ids of ``text`` (no final ``</s>``)."""
        return self.encode_side(text, "source")

    def encode_side(self, text: str, side: str) -> list[int]:
        """The ids of ``text`` on ``side`` (``"source"`` or ``"target"``), no final ``</s>``."""
        check_text(text)
        if side not in SIDES:
            raise InputError(f"side must be 'source' or 'target', got {side!r}")
        sp, unk = self._spm[side], self._vocab[self.unk]
        out: list[int] = []
        for chunk, added in self._chunks(text):
            if added:
                out.append(self._added[chunk][0])
                continue
            if chunk.startswith(">>"):  # a language code: one token, not cut by SentencePiece
                end = chunk.find("<<")
                if end != -1:
                    out.append(self._vocab.get(chunk[: end + 2], unk))
                    chunk = chunk[end + 2 :]
            out += [self._vocab.get(p, unk) for p in sp.encode(chunk, out_type=str)]
        return out

    def _chunks(self, text: str) -> list[tuple[str, bool]]:
        """``text`` cut into ``(chunk, is an added token)``, the white space next to an
        ``lstrip``/``rstrip`` token removed, empty chunks dropped."""
        parts: list[list[Any]] = []
        pos = 0
        for m in self._cut.finditer(text):
            parts += [[text[pos : m.start()], False], [m.group(), True]]
            pos = m.end()
        parts.append([text[pos:], False])
        for k, (chunk, added) in enumerate(parts):
            if not added:
                continue
            _, _, lstrip, rstrip = self._added[chunk]
            if rstrip and k + 1 < len(parts) and not parts[k + 1][1]:
                parts[k + 1][0] = parts[k + 1][0].lstrip()
            if lstrip and k > 0 and not parts[k - 1][1]:
                parts[k - 1][0] = parts[k - 1][0].rstrip()
        return [(c, a) for c, a in parts if c]

    def piece(self, i: int) -> str:
        """The piece (or added token) of id ``i``."""
        if i in self._added_ids:
            return self._added_ids[i]
        if i in self._pieces:
            return self._pieces[i]
        sp = self._spm["source"]  # an id vocab.json lacks: the SentencePiece model's own piece
        if 0 <= i < sp.get_piece_size():
            return sp.id_to_piece(i)
        raise InvalidTokenIdError(f"token id {i} is not in the vocabulary (0..{self._size - 1})")

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens dropped (see the module docstring)."""
        pieces = [self.piece(int(i)) for i in ids if int(i) not in self._special_ids]
        text = self._spm["source"].decode_pieces(pieces) if pieces else ""
        text = text.replace(WORD_START, " ").strip()
        return _clean_up(text) if self.clean_up else text

    def token_text(self, i: int) -> str:
        return self.piece(int(i))

    # -- files ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``source_spm``/``target_spm`` base64, ``vocab``, ``unk``/``eos``/``pad``, ``added``,
        ``clean_up_tokenization_spaces``."""
        added = [{"id": i, "content": t, "special": s, "lstrip": ls, "rstrip": rs}
                 for t, (i, s, ls, rs) in self._added.items()]  # fmt: skip
        return {
            "source_spm": base64.b64encode(self._bytes["source"]).decode("ascii"),
            "target_spm": base64.b64encode(self._bytes["target"]).decode("ascii"),
            "vocab": self._vocab,
            "unk": self.unk,
            "eos": self.eos,
            "pad": self.pad,
            "added": added,
            "clean_up_tokenization_spaces": self.clean_up,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MarianSPMTokenizer:
        models = []
        for side in SIDES:
            raw = data[f"{side}_spm"]
            if not isinstance(raw, str):
                raise TokenizerFileError(f"{side}_spm is not a base64 string")
            try:
                models.append(base64.b64decode(raw.encode("ascii"), validate=True))
            except (ValueError, UnicodeEncodeError):
                raise TokenizerFileError(f"{side}_spm is not valid base64") from None
        specials = {k: _token_string(data.get(k), v, k) for k, v in
                    DEFAULT_SPECIALS.items()}  # fmt: skip
        added = data.get("added") or []
        if not isinstance(added, list):
            raise TokenizerFileError("added is not a list")
        clean_up = bool(data.get("clean_up_tokenization_spaces"))
        return cls(*models, data["vocab"], **specials, added=added,
                   clean_up_tokenization_spaces=clean_up)  # fmt: skip


def _clean_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (spaces before punctuation and English
    contractions), applied when the folder's config asks for it."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                          (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                          (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text


@foreign_reader("SentencePiece model")
def read_marian_folder(folder: Path) -> MarianSPMTokenizer:
    """:meth:`MarianSPMTokenizer.from_folder`."""
    from attnlm.base.fileio import read_file_bytes

    config: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").is_file():
        config = load_json(folder / "tokenizer_config.json", "tokenizer_config.json")
        if not isinstance(config, dict):
            raise TokenizerFileError(f"{folder}/tokenizer_config.json: not a JSON object")
    where = f"{folder}/tokenizer_config.json"
    if config.get("separate_vocabs"):
        raise TokenizerFileError(f"{where}: separate_vocabs (a target_vocab.json for the "
                                 "target side) is not supported")  # fmt: skip
    kwargs = config.get("sp_model_kwargs") or {}
    if isinstance(kwargs, dict) and kwargs.get("enable_sampling"):
        raise TokenizerFileError(f"{where}: sp_model_kwargs.enable_sampling is not supported "
                                 "(encoding would be random)")  # fmt: skip
    specials = {k: _token_string(config.get(f"{k}_token"), v, where) for k, v in
                DEFAULT_SPECIALS.items()}  # fmt: skip
    vocab = load_json(folder / "vocab.json", "vocab.json")
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    extra = [_token_string(t, "", where) for t in (extra if isinstance(extra, list) else [])]
    # transformers drops only the named special tokens when decoding (eos, unk, pad and the
    # additional ones), not every added token marked "special"
    added = []
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for i, t in decoder.items():
            if not isinstance(t, dict) or not str(i).isdigit():
                raise TokenizerFileError(f"{where}: added_tokens_decoder entry {i!r} is damaged")
            added.append({**t, "id": int(i), "special": t.get("content") in extra})
    for t in extra:
        if t not in (e["content"] for e in added):
            if not isinstance(vocab, dict) or t not in vocab:
                raise TokenizerFileError(f"{where}: special token {t!r} is not in vocab.json")
            added.append({"id": vocab[t], "content": t, "special": True})
    models = [read_file_bytes(folder / SPM_FILES[s], "SentencePiece model", TokenizerFileError)
              for s in SIDES]  # fmt: skip
    return MarianSPMTokenizer(*models, vocab, **specials, added=added,
                              clean_up_tokenization_spaces=bool(
                                  config.get("clean_up_tokenization_spaces", False)),
                              where=str(folder))  # fmt: skip
