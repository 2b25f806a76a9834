"""One validator per kind of value, shared by the library and every command.

Each validator takes the value (a Python value, or the string the user typed) and the name
of the option or field it came from, and returns the checked value, converted (``"3"`` ->
``3``). On bad input it raises a one-line :class:`~attnlm.base.errors.ConfigError` (a setting) or
:class:`~attnlm.base.errors.InputError` (a file, a text) that names the option, e.g.
``--threads must be an integer >= 1, got -1``.

The command line (:mod:`attnlm.cli.common`) turns a validator into an ``argparse``
``type=`` with ``arg(threads)``, so bad values are refused at parse time with one line.

Kinds: :func:`positive_int`, :func:`non_negative_int`, :func:`int_in_range`,
:func:`finite_float` (optionally in a range), :func:`probability`, :func:`seed`,
:func:`threads`, :func:`device`, :func:`existing_file`, :func:`existing_dir`,
:func:`existing_path`, :func:`output_file`, :func:`output_dir`, :func:`name_or_path`,
:func:`non_empty`, :func:`duration`, :func:`memory_size`, :func:`utf8_text` /
:func:`read_stdin_text`.

Config dataclasses check their fields with :func:`positive`, :func:`non_negative`,
:func:`at_least`, :func:`fraction`, :func:`above_zero`, :func:`at_least_zero` and
:func:`one_of` (``model.n_head must be an integer >= 1, got 0``).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from attnlm.base.errors import ConfigError, InputError

SEED_LIMIT = 2**63  # seeds are 0 <= seed < 2**63 (torch and numpy both accept them)
INT_LIMIT = 2**63  # every integer fits in int64, as torch and numpy need
# threads beyond a few per core only slow torch down (and each one costs the process a slot of
# the machine's process limit): 4 per core, never more than 1024; 512 where the count is unknown
MAX_THREADS = min(4 * os.cpu_count(), 1024) if os.cpu_count() else 512
MAX_SECONDS = 366 * 24 * 3600  # a time budget beyond a year is a typo, not a plan
MAX_BYTES = 1 << 50  # a memory size beyond 1 PiB is a typo (and overflows the int64 sizes)
DEVICE_FORMS = "auto, cpu, cuda, cuda:N or mps"
#: decode-time weight formats (:mod:`attnlm.quant`; ``--weights``)
WEIGHT_FORMATS = ("f32", "bf16", "q8", "q4")


def weights_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`WEIGHT_FORMATS`, else a one-line InputError."""
    if fmt not in WEIGHT_FORMATS:
        raise InputError(f"weights format {fmt!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    return fmt


def _what(name: str | None) -> str:
    return f"{name} " if name else ""


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- numbers


# Numbers as a user types them: ASCII digits only, nothing around them (Python's int() and
# float() also take "1_000", " 3" and other scripts' digits, which no option means).
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(
    r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(nan|inf(inity)?)", re.I
)


def _to_int(value: Any, name: str | None, need: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}")
    if isinstance(value, int):
        v = value
    elif isinstance(value, float) and value.is_integer():
        v = int(value)
    elif isinstance(value, str) and _INT_TEXT.fullmatch(value) and len(value) <= 40:
        v = int(value)
    else:
        raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}")
    if not -INT_LIMIT <= v < INT_LIMIT:  # what no tensor size, count or seed can hold
        raise ConfigError(f"{_what(name)}must be {need} (and below 2**63), got {_show(value)}")
    return v


def int_in_range(
    value: Any, name: str | None = None, lo: int | None = None, hi: int | None = None
) -> int:
    """An integer with ``lo <= value <= hi`` (either bound may be None)."""
    if lo is not None and hi is not None:
        need = f"an integer in [{lo}, {hi}]"
    elif lo is not None:
        need = f"an integer >= {lo}"
    elif hi is not None:
        need = f"an integer <= {hi}"
    else:
        need = "an integer"
    v = _to_int(value, name, need)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(f"{_what(name)}must be {need}, got {v}")
    return v


def positive_int(value: Any, name: str | None = None) -> int:
    """An integer >= 1 (sizes, counts, orders)."""
    return int_in_range(value, name, lo=1)


def non_negative_int(value: Any, name: str | None = None) -> int:
    """An integer >= 0."""
    return int_in_range(value, name, lo=0)


def finite_float(
    value: Any,
    name: str | None = None,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """A finite float (no NaN, no infinity) in the range given by ``lo``/``hi``; ``lo_open``
    and ``hi_open`` exclude the bound itself (``lo=0, lo_open=True``: strictly positive)."""
    need = _float_need(lo, hi, lo_open, hi_open)
    if isinstance(value, bool) or (isinstance(value, str) and not _FLOAT_TEXT.fullmatch(value)):
        raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}") from None
    if not math.isfinite(v):
        raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}")
    bad_lo = lo is not None and (v <= lo if lo_open else v < lo)
    bad_hi = hi is not None and (v >= hi if hi_open else v > hi)
    if bad_lo or bad_hi:
        raise ConfigError(f"{_what(name)}must be {need}, got {v:g}")
    return v


def _float_need(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    bounds = []
    if lo is not None:
        bounds.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        bounds.append(f"{'<' if hi_open else '<='} {hi:g}")
    return " ".join(["a finite number", " and ".join(bounds)]).strip()


def positive_float(value: Any, name: str | None = None) -> float:
    """A finite float > 0 (temperatures, rates, smoothing constants)."""
    return finite_float(value, name, lo=0.0, lo_open=True)


def probability(value: Any, name: str | None = None) -> float:
    """A finite float in [0, 1]."""
    return finite_float(value, name, lo=0.0, hi=1.0)


def seed(value: Any, name: str | None = "seed") -> int:
    """A random seed: an integer with 0 <= seed < 2**63."""
    return int_in_range(value, name, lo=0, hi=SEED_LIMIT - 1)


def threads(value: Any, name: str | None = "threads") -> int:
    """A thread count: an integer from 1 to :data:`MAX_THREADS` (4 per core)."""
    return int_in_range(value, name, lo=1, hi=MAX_THREADS)


_DURATION_TEXT = re.compile(r"([0-9]+(?:\.[0-9]+)?)(s|sec|m|min|h)?")
_DURATION_SCALE = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def duration(value: Any, name: str | None = None, *, zero_ok: bool = False) -> str:
    """A wall-clock budget as typed, ``120s``, ``2m``, ``1.5h`` or a number of seconds: more
    than 0 (``zero_ok``: or 0, "skip") and at most a year. Returned as given (configs keep
    the text)."""
    need = "a time budget such as 120s, 2m or 1h" + (" (0: skip)" if zero_ok else "")
    m = _DURATION_TEXT.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}")
    seconds = float(m.group(1)) * _DURATION_SCALE[m.group(2)]
    if not (seconds > 0 or (zero_ok and seconds == 0)) or seconds > MAX_SECONDS:
        raise ConfigError(f"{_what(name)}must be {need}, at most a year, got {_show(value)}")
    return value


_SIZE_TEXT = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGT]?)(?:i?B)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_size(value: Any, name: str | None = None, lo: int = 1 << 10) -> int:
    """Bytes of a size: an integer, or a number with a K, M, G or T suffix (powers of 1024:
    ``2G``, ``512M``, ``1.5G``; ``B``/``iB`` after it allowed), from ``lo`` to 1 PiB."""
    need = "a size such as 2G, 512M or 100K"
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _SIZE_TEXT.fullmatch(value) if isinstance(value, str) else None
        if m is None:
            raise ConfigError(f"{_what(name)}must be {need}, got {_show(value)}")
        number = float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
        n = int(number) if math.isfinite(number) else MAX_BYTES + 1
    if not lo <= n <= MAX_BYTES:
        limits = f"from {lo:,} bytes to 1P"
        raise ConfigError(f"{_what(name)}must be {need}, {limits}, got {_show(value)}")
    return n


# ---------------------------------------------------------------- config fields
# A config dataclass checks its fields in ``__post_init__`` with these, one line per rule:
# ``positive(self, "n_layer", "n_head")`` (a function checks its keywords as a dict). Each
# names the field as ``table.field`` (``where="model"``: ``model.n_head``) in the words of the
# validators above, and is
# strict about types: a field from a TOML or JSON file is already a number, so a string or a
# bool there is a mistake, not something to convert.


def _field_values(config: Any, names: tuple[str, ...], where: str, optional: bool):
    for field in names:
        value = config[field] if isinstance(config, dict) else getattr(config, field)
        if not (optional and value is None):
            yield f"{where}.{field}" if where else field, value


def at_least(
    config: Any, lo: int, *names: str, where: str = "model", optional: bool = False
) -> None:
    """Each named field an integer >= ``lo`` (``optional``: or None)."""
    for label, value in _field_values(config, names, where, optional):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{label} must be an integer >= {lo}, got {_show(value)}")
        int_in_range(value, label, lo=lo)


def positive(config: Any, *names: str, where: str = "model", optional: bool = False) -> None:
    """Each named field an integer >= 1 (sizes, counts; ``optional``: or None)."""
    at_least(config, 1, *names, where=where, optional=optional)


def non_negative(config: Any, *names: str, where: str = "model", optional: bool = False) -> None:
    """Each named field an integer >= 0 (token ids, counts where 0 means "none")."""
    at_least(config, 0, *names, where=where, optional=optional)


def _numbers(config: Any, names: tuple[str, ...], where: str, **bounds: Any) -> None:
    for label, value in _field_values(config, names, where, False):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            need = _float_need(bounds.get("lo"), bounds.get("hi"), **_opens(bounds))
            raise ConfigError(f"{label} must be {need}, got {_show(value)}")
        finite_float(value, label, **bounds)


def _opens(bounds: dict[str, Any]) -> dict[str, bool]:
    return {k: bounds.get(k, False) for k in ("lo_open", "hi_open")}


def fraction(config: Any, *names: str, where: str = "model") -> None:
    """Each named field a number in [0, 1) (dropout, smoothing, held-out shares)."""
    _numbers(config, names, where, lo=0.0, hi=1.0, hi_open=True)


def above_zero(config: Any, *names: str, where: str = "model") -> None:
    """Each named field a finite number > 0 (epsilons, rates, init scales)."""
    _numbers(config, names, where, lo=0.0, lo_open=True)


def at_least_zero(config: Any, *names: str, where: str = "model") -> None:
    """Each named field a finite number >= 0 (pseudocounts, weight decay)."""
    _numbers(config, names, where, lo=0.0)


def one_of(config: Any, field: str, known: Any, where: str = "model") -> None:
    """The field is one of ``known`` (a sequence or a dict of names)."""
    value = config[field] if isinstance(config, dict) else getattr(config, field)
    if isinstance(value, str) and value in known:
        return
    label = f"{where}.{field}" if where else field
    raise ConfigError(f"{label} must be one of {', '.join(known)}, got {_show(value)}")


# ---------------------------------------------------------------- devices

_DEVICE = re.compile(r"(auto|cpu|mps|cuda)(?::(\d+))?")
#: The device names a config accepts (:mod:`attnlm.base.device` re-exports them) and the numeric
#: modes; kept here, without torch, so that reading a config does not import torch.
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"
DTYPES = ("float32", "bfloat16")


def device(value: Any, name: str | None = "device", *, check_available: bool = True) -> str:
    """A torch device string: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, returned
    lower-cased. With ``check_available`` a CUDA/MPS device must exist on this machine
    (``auto`` always passes: it means the best available one)."""
    text = str(value).strip().lower() if isinstance(value, str) else None
    m = _DEVICE.fullmatch(text or "")
    if m is None or (m.group(2) is not None and m.group(1) != "cuda"):
        raise ConfigError(f"{_what(name)}must be one of {DEVICE_FORMS}, got {_show(value)}")
    kind, index = m.group(1), m.group(2)
    if check_available and kind in ("cuda", "mps"):
        import torch

        if kind == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0:
                raise ConfigError(f"{_what(name)}{text}: CUDA is not available on this machine")
            if index is not None and int(index) >= count:
                raise ConfigError(
                    f"{_what(name)}{text}: no such GPU (this machine has {count}: "
                    f"cuda:0..cuda:{count - 1})"
                )
        elif not torch.backends.mps.is_available():
            raise ConfigError(f"{_what(name)}mps: Apple MPS is not available on this machine")
    return text  # type: ignore[return-value]


# ---------------------------------------------------------------- paths and text


def _path(value: Any, name: str | None) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise InputError(f"{_what(name)}must be a path, got {_show(value)}")
    return Path(value).expanduser()


def non_empty(value: Any, name: str | None = None) -> str:
    """A setting given as text (a field name, a pattern, ``KEY=VALUE``, a stop string, a host):
    anything but empty, which no such option means (blanks can: a stop string ``"\\n\\n"``)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{_what(name)}must not be empty, got {_show(value)}")
    return value


def name_or_path(value: Any, name: str | None = None) -> str:
    """A name or a path, left as given for the command to resolve (``--model SPEC``,
    ``--tokenizer char|FILE``): not empty, not blank (an empty path would mean the current
    folder)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{_what(name)}must be a name or a path, got {_show(value)}")
    return value


def output_file_or_stdout(value: Any, name: str | None = None) -> Path | str:
    """``-`` (standard output) or an :func:`output_file` path."""
    return value if value == "-" else output_file(value, name)


def existing_file(value: Any, name: str | None = None) -> Path:
    """A path to an existing, readable regular file."""
    p = _path(value, name)
    if not p.exists():
        raise InputError(f"{_what(name)}{p}: no such file")
    if not p.is_file():
        raise InputError(f"{_what(name)}{p}: not a file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{_what(name)}{p}: not readable (permission denied)")
    return p


def existing_dir(value: Any, name: str | None = None) -> Path:
    """A path to an existing, readable folder."""
    p = _path(value, name)
    if not p.is_dir():
        raise InputError(f"{_what(name)}{p}: no such folder")
    if not os.access(p, os.R_OK | os.X_OK):
        raise InputError(f"{_what(name)}{p}: not readable (permission denied)")
    return p


def existing_path(value: Any, name: str | None = None) -> Path:
    """A path to an existing readable file or folder (e.g. ``--text``)."""
    p = _path(value, name)
    if p.is_dir():
        return existing_dir(p, name)
    if not p.exists():
        raise InputError(f"{_what(name)}{p}: no such file or folder")
    return existing_file(p, name)


def output_file(value: Any, name: str | None = None) -> Path:
    """A path a file can be written to: not a folder, and no part of its parent is a file.
    (Missing parent folders are created by the writer.)"""
    p = _path(value, name)
    if p.is_dir():
        raise InputError(f"{_what(name)}{p}: is a folder, expected a file name")
    if p.exists() and not p.is_file():  # a device or a pipe: the atomic rename would replace it
        raise InputError(f"{_what(name)}{p}: not a regular file (a device or a pipe?)")
    return _creatable(p, name)


def output_dir(value: Any, name: str | None = None) -> Path:
    """A folder to write into: an existing folder, or a path that can become one (not a
    file, and no part of its parent is a file). Missing folders are created by the writer."""
    p = _path(value, name)
    if p.exists() and not p.is_dir():
        raise InputError(f"{_what(name)}{p}: is a file, expected a folder")
    return _creatable(p, name)


def _creatable(p: Path, name: str | None) -> Path:
    """``p`` if its nearest existing parent is a folder (so the writer can create the rest)."""
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{_what(name)}{p}: {parent} is not a folder")
            break
    return p


def utf8_text(data: bytes, where: str = "input") -> str:
    """``data`` as text, read by the one strict reader (:func:`attnlm.base.textio.decode_text`:
    strict UTF-8, byte-order mark dropped, no NUL, no huge line); may be empty."""
    from attnlm.base.textio import decode_text

    return decode_text(data, where, empty_ok=True, name_line=False)


def read_stdin_text(where: str = "stdin") -> str:
    """All of standard input, read by the one strict reader (:func:`attnlm.base.textio.read_stdin`);
    empty input is an error naming ``where``."""
    from attnlm.base.textio import read_stdin

    return read_stdin(where)


DOCS_BUDGET_ENV = "ATTNLM_DOCS_BUDGET"


def docs_budget() -> int | None:
    """``$ATTNLM_DOCS_BUDGET`` as a positive integer N, or None when unset or empty.

    Set, it caps every training loop at N: optimizer steps, evaluation batches and interval,
    warm-up steps (``train``, ``compare``, ``hmm fit``), word2vec epochs at 1, and what
    ``attnlm eval`` scores of a text at N x 1,000 tokens. It is how the
    doc tests run the README's commands in seconds; a user never needs it."""
    raw = os.environ.get(DOCS_BUDGET_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{DOCS_BUDGET_ENV} must be an integer >= 1, got {raw!r}")
    return int(raw)
