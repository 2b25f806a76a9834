"""The tokenizers of a translation task: training, special ids, encoding / decoding one side,
and their files.

**Tokenizers** (:func:`train_pair_tokenizers`): one tokenizer shared by both sides or one per
side, of any kind ``attnlm.tokenizers`` can train (``char``, ``bpe``; more kinds plug in by
name). The three sequence-to-sequence special tokens (``<pad>``, ``<s>``, ``</s>`` by default)
take the tokenizer's own ids when it has them as special tokens (BPE is trained with them), or
else the ids right after its vocabulary, in the order pad, bos, eos (:class:`SpecialIds`).
:meth:`PairTokenizers.encode` adds the start / end tokens the :class:`PairTokenizerConfig`
gives each side (:func:`attnlm.data.pairs.encode.encode_pairs` applies it to many pairs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.fileio import atomic_write_text
from attnlm.base.foreign import register as _register_reader
from attnlm.base.validate import non_negative

if TYPE_CHECKING:
    from attnlm.data.pairs.read import Pair
    from attnlm.tokenizers.base import Tokenizer


@dataclass(frozen=True)
class PairTokenizerConfig:
    """How to build and apply the tokenizers of a translation task.

    ``kind``: a tokenizer kind (``char``, ``bpe``, or any kind registered with
    :func:`register_pair_tokenizer_kind` or trainable through ``attnlm.tokenizers``);
    ``shared``: one tokenizer for both sides (trained on sources and targets together) or one
    per side; ``vocab_size``: for trained vocabularies (``bpe``: 256 bytes + merges, the
    special tokens on top), per tokenizer, 0 = sized from the training sentences
    (:func:`attnlm.tokenizers.sizing.vocab_size_for`); ``char`` ignores it and always has
    ``<unk>`` for characters unseen in training. ``pad``, ``bos``, ``eos``: the special token
    strings.
    ``source_bos`` ... ``target_eos``: which sides get a start / end token when encoded
    (default as Marian: the source ends in ``</s>``, the target is ``<s> ... </s>``).
    """

    kind: str = "char"
    shared: bool = True
    vocab_size: int = 1000
    pad: str = "<pad>"
    bos: str = "<s>"
    eos: str = "</s>"
    source_bos: bool = False
    source_eos: bool = True
    target_bos: bool = True
    target_eos: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ConfigError(f"tokenizer kind must be a non-empty string, got {self.kind!r}")
        non_negative(self, "vocab_size", where="")  # 0: sized from the data
        for what in ("pad", "bos", "eos"):
            v = getattr(self, what)
            if not isinstance(v, str) or not v:
                raise ConfigError(f"special token {what} must be a non-empty string, got {v!r}")

    @property
    def specials(self) -> list[str]:
        """The distinct special token strings in the order pad, bos, eos."""
        return list(dict.fromkeys((self.pad, self.bos, self.eos)))


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the sequence-to-sequence special tokens for one tokenizer, and the vocabulary
    size a model needs for it (the tokenizer's ids plus any special ids appended after it)."""

    pad: int
    bos: int
    eos: int
    vocab_size: int

    @property
    def ids(self) -> frozenset[int]:
        return frozenset((self.pad, self.bos, self.eos))


def special_ids(tok: Tokenizer, pad: str, bos: str, eos: str) -> SpecialIds:
    """Look ``pad``/``bos``/``eos`` up in ``tok.special_tokens``; those it lacks get the ids
    ``tok.vocab_size``, ``tok.vocab_size + 1``, ... in the order pad, bos, eos (the same
    string twice gets one id)."""
    own = tok.special_tokens
    ids: dict[str, int] = {}
    nxt = tok.vocab_size
    for s in (pad, bos, eos):
        if s in ids:
            continue
        if s in own:
            ids[s] = own[s]
        else:
            ids[s] = nxt
            nxt += 1
    return SpecialIds(ids[pad], ids[bos], ids[eos], max(nxt, max(ids.values()) + 1))


PairTrainer = Callable[[list[str], int, list[str]], "Tokenizer"]
"""``trainer(texts, vocab_size, specials) -> Tokenizer``: train one tokenizer on ``texts``."""


_PAIR_TRAINERS: dict[str, PairTrainer] = {}


def register_pair_tokenizer_kind(kind: str, trainer: PairTrainer) -> None:
    """Make ``kind`` usable in :class:`PairTokenizerConfig` with ``trainer(texts, vocab_size,
    specials)`` instead of the tokenizer factory (:func:`attnlm.tokenizers.train_tokenizer`)."""
    _PAIR_TRAINERS[kind] = trainer


def _trainer_for(kind: str) -> PairTrainer:
    """How to train a ``kind`` tokenizer on sentences: a registered trainer, else the one
    tokenizer factory (char with ``<unk>`` for unseen characters; bpe with the special
    tokens; other kinds with their own specials)."""
    if kind in _PAIR_TRAINERS:
        return _PAIR_TRAINERS[kind]
    from attnlm.tokenizers.factory import TRAINABLE_KINDS, train_tokenizer

    if kind not in TRAINABLE_KINDS:
        known = ", ".join(sorted(set(_PAIR_TRAINERS) | set(TRAINABLE_KINDS)))
        raise ConfigError(f"unknown tokenizer kind {kind!r} for pairs (known: {known})")

    def train(texts: list[str], vocab_size: int, specials: list[str]) -> Tokenizer:
        if kind == "char":
            return train_tokenizer("char", "".join(texts), unk=True)
        return train_tokenizer(
            kind,
            "\n".join(texts),
            vocab_size,
            special_tokens=specials if kind == "bpe" else None,
            lowercase=False,  # wordpiece: cased, accents kept (a translation keeps both)
        )

    return train


@dataclass(frozen=True)
class PairTokenizers:
    """The source and target tokenizers of a translation task (the same object when shared),
    their special ids, and the start / end token rules of ``config``."""

    source: Tokenizer
    target: Tokenizer
    config: PairTokenizerConfig = PairTokenizerConfig()
    source_ids: SpecialIds = field(init=False)
    target_ids: SpecialIds = field(init=False)

    def __post_init__(self) -> None:
        c = self.config
        object.__setattr__(self, "source_ids", special_ids(self.source, c.pad, c.bos, c.eos))
        object.__setattr__(self, "target_ids", special_ids(self.target, c.pad, c.bos, c.eos))

    @classmethod
    def from_tokenizers(
        cls, source: Tokenizer, target: Tokenizer | None = None, **config: Any
    ) -> PairTokenizers:
        """Wrap existing tokenizers (``target=None``: share ``source``); ``config`` keywords
        override :class:`PairTokenizerConfig` fields (special token strings, start / end)."""
        base = PairTokenizerConfig(
            kind=source.kind or type(source).__name__,
            shared=target is None or target is source,
            vocab_size=source.vocab_size,
        )
        return cls(source, source if target is None else target, replace(base, **config))

    @property
    def shared(self) -> bool:
        return self.source is self.target

    def _side(self, side: str) -> tuple[Tokenizer, SpecialIds, bool, bool]:
        c = self.config
        if side == "source":
            return self.source, self.source_ids, c.source_bos, c.source_eos
        if side == "target":
            return self.target, self.target_ids, c.target_bos, c.target_eos
        raise ConfigError(f"side must be 'source' or 'target', got {side!r}")

    def tokens(self, text: str, side: str) -> list[int]:
        """Token ids of ``text`` on ``side`` without start / end tokens; special token
        strings in the text are ordinary text. A tokenizer that cuts each side its own way
        over one vocabulary (an OPUS-MT folder's) encodes through its ``encode_side``, and
        there special token strings are its ids, as in ``transformers.MarianTokenizer``."""
        tok = self._side(side)[0]
        by_side = getattr(tok, "encode_side", None)
        if by_side is not None:
            return list(by_side(text, side))
        enc = getattr(tok, "encode_ordinary", None)
        return list(enc(text) if enc is not None else tok.encode(text))

    def encode(self, text: str, side: str) -> list[int]:
        """Token ids of ``text`` with the start / end tokens the config gives ``side``."""
        _, ids, bos, eos = self._side(side)
        return [ids.bos] * bos + self.tokens(text, side) + [ids.eos] * eos

    def encode_source(self, text: str) -> list[int]:
        return self.encode(text, "source")

    def encode_target(self, text: str) -> list[int]:
        return self.encode(text, "target")

    def decode(self, ids: Iterable[int], side: str = "target") -> str:
        """Text of ``ids``: leading start and padding tokens are dropped, decoding stops at the
        first end token (a model's output can be passed as is)."""
        tok, sp, _, _ = self._side(side)
        out: list[int] = []
        started = False
        for i in ids:
            i = int(i)
            if not started and (i == sp.pad or i == sp.bos):
                continue
            if i == sp.eos:
                break
            started = True
            if i != sp.pad and i != sp.bos:
                out.append(i)
        if getattr(tok, "kind", None) == "wordpiece":  # "J ' ai" -> "J'ai"
            return tok.decode(out, clean_up_tokenization_spaces=True)
        return tok.decode(out)

    def decode_target(self, ids: Iterable[int]) -> str:
        return self.decode(ids, "target")

    # Files: a folder with tokenizer.json (shared) or source_tokenizer.json and
    # target_tokenizer.json, and pair_tokenizers.json holding the config.

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write the tokenizers and config into ``folder`` (see :meth:`load`)."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        from attnlm.base.config import to_dict

        doc = {"format": "attnlm-pair-tokenizers", "version": 1, "shared": self.shared}
        doc["config"] = to_dict(self.config)
        if self.shared:
            self.source.save(d / "tokenizer.json")
        else:
            self.source.save(d / "source_tokenizer.json")
            self.target.save(d / "target_tokenizer.json")
        atomic_write_text(d / "pair_tokenizers.json", json.dumps(doc, indent=1))

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> PairTokenizers:
        """Read what :meth:`save` wrote."""
        from attnlm import tokenizers
        from attnlm.base.config import from_dict

        d = Path(folder)
        meta = d / "pair_tokenizers.json"
        try:
            doc = json.loads(meta.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"{meta}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{meta}: cannot read pair tokenizer settings ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != "attnlm-pair-tokenizers":
            raise InputError(f"{meta}: not an attnlm pair tokenizer file")
        config = from_dict(PairTokenizerConfig, doc.get("config", {}), where="pair_tokenizers")
        if doc.get("shared"):
            src = tgt = tokenizers.load(d / "tokenizer.json")
        else:
            src = tokenizers.load(d / "source_tokenizer.json")
            tgt = tokenizers.load(d / "target_tokenizer.json")
        return cls(src, tgt, config)


def train_pair_tokenizers(
    pairs: Sequence[Pair], config: PairTokenizerConfig = PairTokenizerConfig()
) -> PairTokenizers:
    """Train the tokenizers for ``pairs`` (normally the training split): one on sources and
    targets together when ``config.shared``, else one per side."""
    if not pairs:
        raise InputError("no pairs to train tokenizers on")
    from attnlm.tokenizers.sizing import vocab_size_for

    trainer = _trainer_for(config.kind)
    specials = config.specials

    def train(texts: list[str]) -> Tokenizer:
        size = config.vocab_size or (1 if config.kind == "char" else vocab_size_for(texts))
        return trainer(texts, size, specials)

    sources = [p.source for p in pairs]
    targets = [p.target for p in pairs]
    if config.shared:
        tok = train(sources + targets)
        return PairTokenizers(tok, tok, replace(config, shared=True))
    return PairTokenizers(train(sources), train(targets), config)


_register_reader("attnlm checkpoint", f"{__name__}.PairTokenizers.load")
