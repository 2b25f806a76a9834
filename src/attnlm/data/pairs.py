"""Parallel data: sentence pairs read from tab-separated files, split, filtered and tokenized.

File format (the Tatoeba / manythings.org layout)::

    source<TAB>target[<TAB>anything else]      one pair per line, UTF-8

How each irregularity is handled (``strict=False`` is the default):

=====================  ====================================  ==============================
case                   lenient (default)                     ``strict=True``
=====================  ====================================  ==============================
CRLF / CR line ends    read as line ends                     same
UTF-8 byte order mark  removed                               same
header line            dropped when ``header=True``, or      same
                       with ``"auto"`` when the first
                       non-blank line's first two fields
                       are column names (``source``,
                       ``target``, ``en``, ``English``, ...)
blank line             skipped, counted as ``blank``         same (never an error)
missing tab            skipped, counted as ``no_tab``        ``InputError`` ``FILE:LINE: ...``
empty source / target  skipped, ``empty_source`` /           ``InputError`` ``FILE:LINE: ...``
                       ``empty_target``
third and later        ignored (counted in                   same
columns                ``extra_columns``)
spaces around a side   removed                               same
non-UTF-8 bytes        ``InputError`` naming line and byte   same
no pair left           ``InputError`` with the skip counts   same
=====================  ====================================  ==============================

Every skip is reported in a :class:`PairsReport` (lines read, pairs kept, skips by reason with
the first few line numbers), so nothing disappears silently.

**Split** (:func:`split_pairs`): deterministic and independent of file order and Python
version. Pairs are grouped by source sentence (all translations of one sentence land in the
same split, so a test sentence is never seen in training with another translation); groups are
ordered by a keyed BLAKE2b hash of ``(seed, source)`` and taken, in that order, into test until
it holds ``test`` of the pairs, then into validation, the rest being training. Each split keeps
the original order of its pairs.

**Tokenizers** (:func:`train_pair_tokenizers`): one tokenizer shared by both sides or one per
side, of any kind ``attnlm.tokenizers`` can train (``char``, ``bpe``; more kinds plug in by
name). The three sequence-to-sequence special tokens (``<pad>``, ``<s>``, ``</s>`` by default)
take the tokenizer's own ids when it has them as special tokens (BPE is trained with them), or
else the ids right after its vocabulary, in the order pad, bos, eos (:class:`SpecialIds`).
:func:`encode_pairs` turns pairs into token-id lists with start / end tokens as the
:class:`PairTokenizerConfig` says.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from attnlm.errors import ConfigError, InputError
from attnlm.fileio import atomic_write_text

if TYPE_CHECKING:
    from attnlm.tokenizers.base import Tokenizer

SKIP_REASONS = ("blank", "no_tab", "empty_source", "empty_target")
FIRST_LINES = 5  # line numbers remembered per skip reason
HEADER_NAMES = frozenset(
    "source target src tgt input output text translation english french german "
    "en fr de eng fra fre deu ger".split()
)
HeaderMode = bool | Literal["auto"]


class Pair(NamedTuple):
    """One sentence pair: the ``source`` text and its translation ``target`` (both stripped,
    non-empty, without tabs or line breaks)."""

    source: str
    target: str


# --------------------------------------------------------------------------- reading


@dataclass
class PairsReport:
    """What reading a pairs file did.

    ``lines``: physical lines in the file (blank and header lines included, a final line end
    not counted as an extra line); ``kept``: pairs returned; ``skipped``: count per reason (see
    :data:`SKIP_REASONS`); ``first_lines``: the first few line numbers (1-based) per reason;
    ``header_line``: the line dropped as a header, if any; ``extra_columns``: kept lines that
    had a third or later column (ignored); ``crlf``: lines that ended in CR LF or CR;
    ``bom``: whether a UTF-8 byte order mark was removed.
    """

    source: str
    lines: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    first_lines: dict[str, list[int]] = field(default_factory=dict)
    header_line: int | None = None
    extra_columns: int = 0
    crlf: int = 0
    bom: bool = False

    @property
    def n_skipped(self) -> int:
        """Lines skipped for any reason (blank lines included)."""
        return sum(self.skipped.values())

    def _skip(self, reason: str, line: int) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        first = self.first_lines.setdefault(reason, [])
        if len(first) < FIRST_LINES:
            first.append(line)

    def describe_skips(self, reasons: Iterable[str] = SKIP_REASONS) -> str:
        """``2 no_tab (lines 4, 9), 1 empty_target (line 7)``; empty when nothing matched."""
        parts = []
        for r in reasons:
            n = self.skipped.get(r, 0)
            if n:
                lines = self.first_lines.get(r, [])
                where = ", ".join(map(str, lines)) + (", ..." if n > len(lines) else "")
                parts.append(f"{n} {r} (line{'s' if len(lines) > 1 else ''} {where})")
        return ", ".join(parts)

    def warning(self) -> str | None:
        """One line for stderr when pairs were dropped (blank lines alone are not worth it)."""
        dropped = [r for r in SKIP_REASONS if r != "blank" and self.skipped.get(r)]
        if not dropped:
            return None
        n = sum(self.skipped[r] for r in dropped)
        return f"{self.source}: skipped {n} malformed line(s): {self.describe_skips(dropped)}"

    def format(self) -> str:
        """A few lines for ``attnlm data pairs``."""
        out = [f"pairs: {self.kept:,} kept of {self.lines:,} lines"]
        skips = self.describe_skips()
        out.append(f"skipped: {skips or 'none'}")
        notes = []
        if self.header_line is not None:
            notes.append(f"header on line {self.header_line}")
        if self.extra_columns:
            notes.append(f"{self.extra_columns:,} line(s) with extra columns (ignored)")
        if self.crlf:
            notes.append(f"{self.crlf:,} CRLF/CR line ends")
        if self.bom:
            notes.append("byte order mark removed")
        if notes:
            out.append("notes: " + "; ".join(notes))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "lines": self.lines,
            "kept": self.kept,
            "skipped": dict(self.skipped),
            "first_lines": {k: list(v) for k, v in self.first_lines.items()},
            "header_line": self.header_line,
            "extra_columns": self.extra_columns,
            "crlf": self.crlf,
            "bom": self.bom,
        }


def looks_like_header(fields: Sequence[str]) -> bool:
    """Whether the first two fields of a line are both column names such as ``source`` /
    ``target`` or ``English`` / ``French`` (case-insensitive, see :data:`HEADER_NAMES`)."""
    if len(fields) < 2:
        return False
    a, b = fields[0].strip().lower(), fields[1].strip().lower()
    return a != b and a in HEADER_NAMES and b in HEADER_NAMES


def parse_pairs(
    text: str,
    *,
    name: str = "<text>",
    strict: bool = False,
    header: HeaderMode = "auto",
    reverse: bool = False,
) -> tuple[list[Pair], PairsReport]:
    """Parse tab-separated pairs from a string (see the module docstring for each case).

    ``name`` prefixes error messages (a file name); ``header``: ``True`` drops the first
    non-blank line, ``False`` never drops one, ``"auto"`` drops it when it
    :func:`looks_like_header`; ``reverse`` swaps the columns (target first). Returns the pairs
    and a :class:`PairsReport`; raises :class:`InputError` for a malformed line when ``strict``
    and when no pair is left.
    """
    if header not in (True, False, "auto"):
        raise ConfigError(f"header must be True, False or 'auto', got {header!r}")
    report = PairsReport(source=name)
    if text.startswith("\ufeff"):
        text = text[1:]
        report.bom = True
    if "\r" in text:
        report.crlf = text.count("\r")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line end
    report.lines = len(lines)
    pairs: list[Pair] = []
    first_content = True
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            report._skip("blank", lineno)
            continue
        fields = line.split("\t")
        if first_content:
            first_content = False
            if header is True or (header == "auto" and looks_like_header(fields)):
                report.header_line = lineno
                continue
        if len(fields) < 2:
            if strict:
                raise InputError(
                    f"{name}:{lineno}: no tab between source and target "
                    f"(expected source<TAB>target): {_preview(line)}"
                )
            report._skip("no_tab", lineno)
            continue
        src, tgt = fields[0].strip(), fields[1].strip()
        if reverse:
            src, tgt = tgt, src
        if not src or not tgt:
            side = "source" if not src else "target"
            if strict:
                raise InputError(f"{name}:{lineno}: empty {side} sentence: {_preview(line)}")
            report._skip(f"empty_{side}", lineno)
            continue
        if len(fields) > 2:
            report.extra_columns += 1
        pairs.append(Pair(src, tgt))
    report.kept = len(pairs)
    if not pairs:
        skips = report.describe_skips()
        raise InputError(f"{name}: no sentence pairs found" + (f" ({skips})" if skips else ""))
    return pairs, report


def _preview(line: str, n: int = 60) -> str:
    return repr(line if len(line) <= n else line[:n] + "...")


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text, or an :class:`InputError` naming the line and byte position."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise InputError(
                f"{name}: looks like UTF-16 (byte order mark {data[:2].hex()}); save it as UTF-8"
            ) from None
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(
            f"{name}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at byte {col} of the "
            "line); save the file as UTF-8"
        ) from None


def read_pairs(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    header: HeaderMode = "auto",
    reverse: bool = False,
) -> tuple[list[Pair], PairsReport]:
    """Read a tab-separated pairs file (see :func:`parse_pairs` and the module docstring)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{p}: is a folder; --pairs needs one tab-separated file")
    from attnlm.fileio import read_file_bytes

    data = read_file_bytes(p)
    return parse_pairs(
        decode_utf8(data, str(p)), name=str(p), strict=strict, header=header, reverse=reverse
    )


def write_pairs(
    path: str | os.PathLike[str],
    pairs: Iterable[Sequence[str]],
) -> int:
    """Write pairs (or longer rows: source, target, extra columns) as UTF-8 TSV with LF line
    ends; returns the number of rows. A field containing a tab or line break is an
    :class:`InputError` (the format has no quoting)."""
    rows = []
    for i, row in enumerate(pairs):
        for f in row:
            if any(c in f for c in "\t\r\n"):
                raise InputError(f"pair {i}: field {f!r} contains a tab or line break")
        rows.append("\t".join(row) + "\n")
    atomic_write_text(Path(path), "".join(rows))  # one-line InputError on failure
    return len(rows)


def group_references(pairs: Sequence[Pair]) -> tuple[list[str], list[list[str]]]:
    """Distinct sources in first-seen order, each with all its targets (for multi-reference
    BLEU: Tatoeba has several translations of many sentences)."""
    refs: dict[str, list[str]] = {}
    for src, tgt in pairs:
        refs.setdefault(src, []).append(tgt)
    return list(refs), list(refs.values())


# --------------------------------------------------------------------------- split

RUN_SPLIT_SEED = 0  # the split seed of training runs (``attnlm train``/``eval``): fixed, so
RUN_PAIRS_DIR = "pairs"  # the test split never moves with the training seed; the run folder's
# sub-folder holding a run's tokenizers and train/valid/test TSV files


@dataclass(frozen=True)
class PairSplits:
    """Training, validation and test pairs (see :func:`split_pairs`)."""

    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "valid": len(self.valid), "test": len(self.test)}


def stable_hash(text: str, seed: int) -> int:
    """A 64-bit keyed BLAKE2b hash of ``text``: the same on every machine and Python version
    (unlike ``hash``, which is salted per process)."""
    key = str(int(seed)).encode("ascii")
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).digest())


def split_pairs(
    pairs: Sequence[Pair],
    *,
    valid: float = 0.1,
    test: float = 0.1,
    seed: int = 0,
    by_source: bool = True,
) -> PairSplits:
    """Deterministic train / validation / test split (see the module docstring).

    ``valid`` and ``test`` are fractions of the pairs (each split gets at least that share,
    exceeding it by less than one group); ``by_source=False`` groups identical pairs only.
    Raises :class:`ConfigError` for fractions outside [0, 1) or summing to 1 or more, and
    :class:`InputError` when no training pair would be left.
    """
    for what, f in (("valid", valid), ("test", test)):
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0.0 <= f < 1.0:
            raise ConfigError(f"split fraction {what} must be in [0, 1), got {f!r}")
    if valid + test >= 1.0:
        raise ConfigError(f"valid + test fractions must be below 1, got {valid} + {test}")
    groups: dict[str, list[int]] = {}
    for i, (src, tgt) in enumerate(pairs):
        groups.setdefault(src if by_source else f"{src}\t{tgt}", []).append(i)
    order = sorted(groups, key=lambda k: (stable_hash(k, seed), k))
    n = len(pairs)
    want = {"test": test * n, "valid": valid * n}
    got = {"test": 0, "valid": 0}
    where: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for k in order:
        members = groups[k]
        name = next((s for s in ("test", "valid") if got[s] < want[s]), "train")
        if name != "train":
            got[name] += len(members)
        where[name].extend(members)
    if not where["train"]:
        raise InputError(
            f"too few pairs to split: {n} pair(s) in {len(groups)} group(s) leave no training "
            "pair; lower the valid/test fractions"
        )
    pick = {s: [pairs[i] for i in sorted(idx)] for s, idx in where.items()}
    return PairSplits(train=pick["train"], valid=pick["valid"], test=pick["test"])


# --------------------------------------------------------------------------- length filter


def filter_pairs(
    pairs: Sequence[Pair],
    *,
    max_chars: int | None = None,
    max_tokens: int | None = None,
    tokenizers: PairTokenizers | None = None,
) -> tuple[list[Pair], int]:
    """Keep pairs whose sides both have at most ``max_chars`` characters and (with
    ``tokenizers``) at most ``max_tokens`` tokens, start / end tokens not counted.
    Returns the kept pairs (in order) and the number dropped."""
    for what, v in (("max_chars", max_chars), ("max_tokens", max_tokens)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{what} must be a positive integer, got {v!r}")
    if max_tokens is not None and tokenizers is None:
        raise ConfigError("max_tokens needs the pair tokenizers to count tokens")
    kept = []
    for pair in pairs:
        if max_chars is not None and max(len(pair.source), len(pair.target)) > max_chars:
            continue
        if max_tokens is not None:
            assert tokenizers is not None
            if len(tokenizers.tokens(pair.source, "source")) > max_tokens:
                continue
            if len(tokenizers.tokens(pair.target, "target")) > max_tokens:
                continue
        kept.append(pair)
    return kept, len(pairs) - len(kept)


# --------------------------------------------------------------------------- tokenizers


@dataclass(frozen=True)
class PairTokenizerConfig:
    """How to build and apply the tokenizers of a translation task.

    ``kind``: a tokenizer kind (``char``, ``bpe``, or any kind registered with
    :func:`register_pair_tokenizer_kind` or trainable through ``attnlm.tokenizers``);
    ``shared``: one tokenizer for both sides (trained on sources and targets together) or one
    per side; ``vocab_size``: for trained vocabularies (``bpe``: 256 bytes + merges, the
    special tokens on top), per tokenizer; ``char`` ignores it and always has ``<unk>`` for
    characters unseen in training. ``pad``, ``bos``, ``eos``: the special token strings.
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
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ConfigError(f"vocab_size must be a positive integer, got {self.vocab_size!r}")
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
        strings in the text are ordinary text."""
        tok = self._side(side)[0]
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
        from attnlm.config import to_dict

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
        from attnlm.config import from_dict

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
    trainer = _trainer_for(config.kind)
    specials = config.specials
    sources = [p.source for p in pairs]
    targets = [p.target for p in pairs]
    if config.shared:
        tok = trainer(sources + targets, config.vocab_size, specials)
        return PairTokenizers(tok, tok, replace(config, shared=True))
    src = trainer(sources, config.vocab_size, specials)
    tgt = trainer(targets, config.vocab_size, specials)
    return PairTokenizers(src, tgt, config)


# --------------------------------------------------------------------------- encoding


@dataclass(frozen=True)
class EncodedPairs:
    """Token ids of pairs, ready to batch: ``source[i]`` and ``target[i]`` are the ids of pair
    ``i`` with start / end tokens as the tokenizer config says; ``source_pad`` /
    ``target_pad`` are the padding ids and ``source_vocab_size`` / ``target_vocab_size`` the
    embedding sizes a model needs."""

    source: list[list[int]]
    target: list[list[int]]
    source_pad: int
    target_pad: int
    source_vocab_size: int
    target_vocab_size: int

    def __len__(self) -> int:
        return len(self.source)

    def n_tokens(self) -> tuple[int, int]:
        """Total (source, target) tokens."""
        return sum(map(len, self.source)), sum(map(len, self.target))


def encode_pairs(pairs: Sequence[Pair], tokenizers: PairTokenizers) -> EncodedPairs:
    """Encode both sides of every pair with :meth:`PairTokenizers.encode`. A character a
    tokenizer cannot encode raises :class:`InputError` naming the pair."""
    from attnlm.errors import AttnlmError

    src: list[list[int]] = []
    tgt: list[list[int]] = []
    for i, (s, t) in enumerate(pairs):
        try:
            src.append(tokenizers.encode(s, "source"))
            tgt.append(tokenizers.encode(t, "target"))
        except AttnlmError as e:
            raise InputError(f"pair {i} ({s!r} -> {t!r}): {e}") from None
    return EncodedPairs(
        source=src,
        target=tgt,
        source_pad=tokenizers.source_ids.pad,
        target_pad=tokenizers.target_ids.pad,
        source_vocab_size=tokenizers.source_ids.vocab_size,
        target_vocab_size=tokenizers.target_ids.vocab_size,
    )
