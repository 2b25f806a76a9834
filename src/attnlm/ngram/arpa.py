"""ARPA back-off language model files: reading (plain or gzip); the writer is
:mod:`attnlm.ngram.arpa_write` (re-exported here).

Format (as SRILM and KenLM write it)::

    \\data\\
    ngram 1=7559
    ngram 2=40668

    \\1-grams:
    -4.636964<TAB><unk><TAB>0
    ...
    \\2-grams:
    -1.4813321<TAB>the </s>
    ...
    \\end\\

Each entry is ``log10 p<TAB>w1 .. wk[<TAB>log10 back-off]``; the highest order has no back-off
weight, log10(0) is written -99. We write what KenLM ``lmplz`` writes: ``\\data\\`` first,
tab-separated fields, ``<unk>`` present, a back-off weight on every entry below the highest
order, numbers in the shortest form that round-trips a 32-bit float (KenLM stores floats).

The reader accepts tabs or spaces between fields, adds ``<unk>`` with log10 p = -100 when it
is missing (as KenLM does), and adds an entry for every missing prefix of an n-gram (its
probability by back-off, back-off weight 0), which leaves every query unchanged. Errors name
the file and the line.
"""

from __future__ import annotations

import gzip
import io
import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.foreign import foreign_reader
from attnlm.base.foreign import register as _register_reader
from attnlm.ngram.arpa_write import ngram_word_ids, write_arpa
from attnlm.ngram.counts import BOS, EOS, UNK, Vocabulary, lookup
from attnlm.ngram.model import BackoffModel

__all__ = ["ngram_word_ids", "read_arpa", "write_arpa"]

UNK_MISSING_LOGP = -100.0
_NGRAM_LINE = re.compile(r"^ngram\s+(\d+)\s*=\s*(\d+)\s*$")
_SECTION = re.compile(r"^\\(\d+)-grams:\s*$")


def _open_text(p: Path) -> io.TextIOBase:
    with open(p, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if gz:
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8")
    return open(p, encoding="utf-8")


@foreign_reader("ARPA")
def read_arpa(path: str | Path) -> BackoffModel:
    """Read an ARPA file (plain or gzip) into a :class:`BackoffModel` that scores as KenLM's
    ``query`` does. Raises :class:`InputError` with the line number on malformed input."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    try:
        model = _parse_fast(p)
        if model is not None:
            return model
        with _open_text(p) as f:
            return _parse(p, f)
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not valid UTF-8 ({e.reason})") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise InputError(f"{p}: cannot read ({e})") from None


def _parse_fast(p: Path) -> BackoffModel | None:
    """Whole sections at a time (split, bulk float parsing, one dict lookup per word) for a
    file laid out as KenLM and :func:`write_arpa` write it; ``None`` when anything is off the
    regular form (a blank or spaced line, a bad number, an unknown word...): then the careful
    line-by-line parser reads it and reports the line."""
    with open(p, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    data.decode("utf-8")  # UnicodeDecodeError: refused by read_arpa
    head, sep, rest = data.partition(b"\n\n")
    sizes = _fast_header(head) if sep else None
    if sizes is None:
        return None
    sections = rest.split(b"\n\n")
    if len(sections) != len(sizes) + 1 or sections[-1].rstrip(b"\n") != b"\\end\\":
        return None
    parsed = _fast_sections(sections, sizes)
    if parsed is None:
        return None
    texts, probs, backs = parsed
    words = [w.decode("utf-8") for w in texts[0]]
    if any(" " in w or not w for w in words):
        return None
    by_bytes: dict[bytes, int] = {}

    def ids(k: int, index: dict[str, int]) -> np.ndarray:
        if not by_bytes:
            by_bytes.update((w.encode("utf-8"), i) for w, i in index.items())
        tokens = b" ".join(texts[k - 1]).split(b" ")
        if len(tokens) != k * sizes[k - 1]:
            raise _Irregular
        get = by_bytes.__getitem__
        return np.fromiter(map(get, tokens), np.int64, len(tokens)).reshape(-1, k)

    try:
        return _build(p, words, probs, backs, ids)
    except (_Irregular, KeyError, InputError):
        return None


def _fast_header(head: bytes) -> list[int] | None:
    """The n-gram counts of a regular ``\\data\\`` block, lowest order first (None if not
    regular)."""
    header = head.decode("ascii", errors="replace").split("\n")
    if header[0] != "\\data\\" or len(header) < 2:
        return None
    sizes = []
    for k, line in enumerate(header[1:], 1):
        m = _NGRAM_LINE.match(line)
        if not m or int(m.group(1)) != k:
            return None
        sizes.append(int(m.group(2)))
    return sizes


def _fast_sections(
    sections: list[bytes], sizes: list[int]
) -> tuple[list[list[bytes]], list[np.ndarray], list[np.ndarray]] | None:
    """``(texts, probs, backs)`` per order from regular sections, each parsed whole: the
    n-grams' word fields (bytes) and their log10 probabilities and back-off weights (None as
    soon as a section is not regular)."""
    N = len(sizes)
    texts: list[list[bytes]] = []
    probs, backs = [], []
    for k in range(1, N + 1):
        title, _, body = sections[k - 1].partition(b"\n")
        if title != f"\\{k}-grams:".encode() or not body:
            return None
        n_fields = 3 if k < N else 2
        fields = body.replace(b"\n", b"\t").split(b"\t")
        if len(fields) != n_fields * sizes[k - 1]:
            return None
        try:
            lp = np.array(fields[0::n_fields]).astype(np.float64)
            bo = np.array(fields[2::3]).astype(np.float64) if k < N else np.zeros(len(lp))
        except ValueError:
            return None
        if not (np.isfinite(lp).all() and (lp <= 0).all() and np.isfinite(bo).all()):
            return None
        probs.append(lp)
        backs.append(bo)
        texts.append(fields[1::n_fields])
    return texts, probs, backs


class _Irregular(Exception):
    pass


class _Lines:
    """The non-blank lines of a file, stripped; ``lineno`` is the number of the last line read
    (blank ones counted). Iterating again continues where the last loop stopped."""

    def __init__(self, f: io.TextIOBase) -> None:
        self.f = f
        self.lineno = 0

    def __iter__(self):
        for line in self.f:
            self.lineno += 1
            s = line.strip()
            if s:
                yield s


def _read_header(
    lines: _Lines, p: Path, err: Callable[[str], InputError]
) -> tuple[list[int], str | None]:
    """``(sizes, section_line)``: the n-gram counts of the ``\\data\\`` block, lowest order
    first, and the first line after them (None at the end of the file)."""
    for s in lines:
        if s == "\\data\\":
            break
        raise err("expected \\data\\ (not an ARPA file)")
    else:
        raise InputError(f"{p}: empty file or no \\data\\ header (not an ARPA file)")
    sizes: list[int] = []
    section_line = None
    for s in lines:
        m = _NGRAM_LINE.match(s)
        if m:
            if int(m.group(1)) != len(sizes) + 1:
                raise err(f"expected 'ngram {len(sizes) + 1}=COUNT', got {s!r}")
            sizes.append(int(m.group(2)))
            continue
        section_line = s
        break
    if not sizes:
        raise err("no 'ngram N=COUNT' lines after \\data\\")
    return sizes, section_line


def _read_section(
    lines: _Lines, k: int, N: int, err: Callable[[str], InputError]
) -> tuple[list[float], list[float], list[str], str | None]:
    """``(logp, backoff, grams, next_line)``: the entries of the ``k``-grams section (of ``N``
    orders), line by line, and the next section's line (None at the end of the file)."""
    lp: list[float] = []
    bo: list[float] = []
    gr: list[str] = []
    section_line = None
    for s in lines:
        if s.startswith("\\"):
            section_line = s
            break
        parts = s.split("\t") if "\t" in s else None
        if parts is None or len(parts) not in (2, 3) or len(parts[1].split()) != k:
            ws = s.split()
            if len(ws) == k + 1:
                parts = [ws[0], " ".join(ws[1:])]
            elif len(ws) == k + 2 and k < N:
                parts = [ws[0], " ".join(ws[1:-1]), ws[-1]]
            else:
                raise err(
                    f"expected a log10 probability, {k} word(s) and an optional "
                    f"back-off weight, got {s!r}"
                )
        try:
            logp = float(parts[0])
            back = float(parts[2]) if len(parts) == 3 else 0.0
        except ValueError:
            raise err(f"not a number in {s!r}") from None
        if not (math.isfinite(logp) and logp <= 0.0):
            raise err(f"log10 probability must be finite and <= 0 (-99 for zero), got {s!r}")
        if not math.isfinite(back):
            raise err(f"back-off weight must be finite (-99 for zero), got {s!r}")
        lp.append(logp)
        bo.append(back)
        if len(parts) == 3 and k == N:
            raise err(f"highest-order entry with a back-off weight: {s!r}")
        gr.append(parts[1] if "\t" not in s else " ".join(parts[1].split()))
    return lp, bo, gr, section_line


def _parse(p: Path, f: io.TextIOBase) -> BackoffModel:
    """The careful line-by-line reader: any layout the format allows, errors naming the line."""
    lines = _Lines(f)

    def err(msg: str) -> InputError:
        return InputError(f"{p}: line {lines.lineno}: {msg}")

    sizes, section_line = _read_header(lines, p, err)
    N = len(sizes)
    probs: list[list[float]] = []
    backs: list[list[float]] = []
    grams: list[list[str]] = []
    for k in range(1, N + 1):
        if section_line is None:
            raise err(f"file ends before the {k}-grams section")
        m = _SECTION.match(section_line)
        if not m or int(m.group(1)) != k:
            raise err(f"expected \\{k}-grams:, got {section_line!r}")
        lp, bo, gr, section_line = _read_section(lines, k, N, err)
        if len(gr) != sizes[k - 1]:
            raise err(f"the header announces {sizes[k - 1]} {k}-grams, the section has {len(gr)}")
        probs.append(lp)
        backs.append(bo)
        grams.append(gr)
    if section_line != "\\end\\":
        if section_line is None:
            raise err("missing \\end\\")
        raise err(f"expected \\end\\, got {section_line!r}")

    def ids(k: int, index: dict[str, int]) -> np.ndarray:
        try:
            row = [index[w] for g in grams[k - 1] for w in g.split()]
        except KeyError as e:
            raise InputError(f"{p}: {k}-gram with a word that is not a unigram: {e}") from None
        return np.asarray(row, dtype=np.int64).reshape(-1, k)

    return _build(p, grams[0], probs, backs, ids)


def _build(p: Path, words: list[str], probs: list, backs: list, gram_ids) -> BackoffModel:
    """The model from unigram ``words``, per-order numbers and ``gram_ids(k, index)``, the
    (n_k, k) word ids of the order-k entries in file order."""
    lp1 = np.asarray(probs[0], dtype=np.float64)
    bo1 = np.asarray(backs[0], dtype=np.float64)
    for special in (BOS, EOS):
        if special not in words:
            raise InputError(f"{p}: the unigrams lack {special}")
    if UNK not in words:
        warnings.warn(
            f"{p}: no <unk> unigram; using log10 p(<unk>) = {UNK_MISSING_LOGP} as KenLM does",
            stacklevel=3,
        )
        words = words + [UNK]
        lp1 = np.append(lp1, UNK_MISSING_LOGP)
        bo1 = np.append(bo1, 0.0)
    try:
        vocab = Vocabulary(words)
    except InputError as e:
        raise InputError(f"{p}: {e}") from None
    V, N = len(vocab), len(probs)
    index = vocab.index
    rows = [np.arange(V, dtype=np.int64)[:, None]]
    logp = [lp1]
    bo = [bo1]
    added = [np.zeros(V, dtype=bool)]  # entries the reader adds (missing prefixes)
    for k in range(2, N + 1):
        rows.append(gram_ids(k, index))
        logp.append(np.asarray(probs[k - 1], dtype=np.float64))
        bo.append(np.asarray(backs[k - 1], dtype=np.float64))
        added.append(np.zeros(len(rows[-1]), dtype=bool))
    try:
        keys = _tables(rows, logp, bo, V, added)
    except _MissingPrefix:
        _close_prefixes(rows, logp, bo, added)
        keys = _tables(rows, logp, bo, V, added)
    except _Duplicate as e:
        raise InputError(f"{p}: a {e.args[0]}-gram appears twice") from None
    model = BackoffModel(
        vocab,
        keys,
        logp,
        bo,
        smoothing="arpa",
        pad="kenlm",
        normalized=True,
        meta={"source": str(p)},
    )
    _fill_added(model, added)
    return model


class _MissingPrefix(Exception):
    pass


class _Duplicate(Exception):
    pass


def _tables(rows: list, logp: list, bo: list, V: int, added: list) -> list[np.ndarray]:
    """Sorted packed keys per order; reorders ``rows``, ``logp``, ``bo``, ``added`` in place
    to match."""
    keys = [np.arange(V, dtype=np.int64)]
    for k in range(2, len(rows) + 1):
        pref = _prefix_ids(keys, rows[k - 1][:, :-1], V)
        if (pref < 0).any():
            raise _MissingPrefix(k)
        key = pref * V + rows[k - 1][:, -1]
        order = np.argsort(key, kind="stable")
        key = key[order]
        if len(key) > 1 and np.any(key[1:] == key[:-1]):
            raise _Duplicate(k)
        rows[k - 1] = rows[k - 1][order]
        logp[k - 1] = logp[k - 1][order]
        bo[k - 1] = bo[k - 1][order]
        added[k - 1] = added[k - 1][order]
        keys.append(key)
    return keys


def _prefix_ids(keys: list[np.ndarray], cols: np.ndarray, V: int) -> np.ndarray:
    """Id of the n-gram formed by each row of ``cols`` (n, m), -1 where absent."""
    cur = cols[:, 0].copy()
    for m in range(2, cols.shape[1] + 1):
        cur = lookup(keys[m - 1], np.where(cur >= 0, cur * V + cols[:, m - 1], -1))
    return cur


def _close_prefixes(rows: list, logp: list, bo: list, added: list) -> None:
    """Add every absent prefix of an n-gram (highest order first, so added entries get their
    own prefixes too), flagged in ``added`` (their log10 p is filled in by
    :func:`_fill_added`; no value read from the file is ever used as a marker), back-off 0."""
    for k in range(len(rows), 2, -1):
        have = set(map(tuple, rows[k - 2].tolist()))
        need = sorted(set(map(tuple, rows[k - 1][:, :-1].tolist())) - have)
        if need:
            rows[k - 2] = np.concatenate([rows[k - 2], np.asarray(need, dtype=np.int64)])
            logp[k - 2] = np.concatenate([logp[k - 2], np.zeros(len(need))])
            bo[k - 2] = np.concatenate([bo[k - 2], np.zeros(len(need))])
            added[k - 2] = np.concatenate([added[k - 2], np.ones(len(need), dtype=bool)])


def _fill_added(model: BackoffModel, added: list[np.ndarray]) -> None:
    """Probability of each added entry w1..wm: what the model without it gives, i.e.
    bo(w1..wm-1) + log10 p(wm | w2..wm-1) (lower orders are complete, lowest first)."""
    for m in range(2, model.order + 1):
        todo = np.flatnonzero(added[m - 1])
        if len(todo) == 0:
            continue
        rows = ngram_word_ids(model, m)[todo]
        ctx_bo = model.bo[m - 2][model.keys[m - 1][todo] // model.V]
        sub = BackoffModel(model.vocab, model.keys[: m - 1], model.logp[: m - 1], model.bo[: m - 1])
        tokens = rows[:, 1:].reshape(-1)
        pos = np.tile(np.arange(m - 1), len(rows))
        lp = sub._logprob_positions(tokens, pos).reshape(-1, m - 1)[:, -1]
        model.logp[m - 1][todo] = lp + ctx_bo


_register_reader("ARPA", f"{__name__}._parse_fast")
