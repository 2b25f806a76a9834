"""The one boundary where files made elsewhere enter attnlm: checked, or refused in one line.

Every reader of a file format attnlm did not just write itself (safetensors, ``config.json``,
``tokenizer.json``, ARPA, ``.npz`` n-gram models, word2vec, JSONL/.gz/.zst, Parquet,
checkpoints, GGUF, ...) runs inside :func:`reading` or is decorated with :func:`foreign_reader`.
Any parse error of the format (a truncated stream, a header that lies, a JSON value of the wrong
type, nesting deep enough to exhaust Python's stack) becomes one :class:`InputError` line that
names the file and the problem, e.g. ``model.safetensors: not a valid safetensors file
(incomplete metadata, file not fully covered)``. Errors that are already one line
(:class:`AttnlmError`) pass through unchanged.

The same module holds the checks every loader shares:

- :func:`check_finite`: NaN or infinite weights and vectors are refused at load;
- :func:`check_fits`: the parameter bytes a config asks for are estimated *before* any tensor
  is allocated, and what cannot fit in memory is refused;
- :func:`load_json`: a JSON file read through the strict text reader, nesting bounded;
- :func:`read_bounded`: at most ``limit`` bytes of a file (a path to ``/dev/zero`` is refused
  after ``limit`` bytes, not after the machine runs out of memory).

:data:`READERS` maps each format to the readers registered for it; the damaged-file test
(``tests/base/test_damaged_files.py``) fails when a reader is not in its table of formats.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from attnlm.base.errors import AttnlmError, InputError, file_read_errors

#: format name -> qualified names of the functions that read it (filled by
#: :func:`foreign_reader`, and by :func:`register` for readers that call :func:`reading`).
READERS: dict[str, set[str]] = {}

#: The deepest JSON nesting accepted. Real configs and tokenizers nest a handful of levels;
#: Python's parser raises RecursionError near 1,000, which must not escape as a traceback.
MAX_JSON_DEPTH = 200

F = TypeVar("F", bound=Callable[..., Any])


def register(fmt: str, qualname: str) -> None:
    """Record that ``qualname`` (``module.function``) reads files of format ``fmt``."""
    READERS.setdefault(fmt, set()).add(qualname)


def _parse_errors() -> tuple[type[BaseException], ...]:
    """The exception types a parser of damaged bytes raises: the builtins, and those of the
    optional libraries that are installed (looked up lazily, never imported just for this)."""
    import sys

    kinds: list[type[BaseException]] = [
        ValueError,  # includes json.JSONDecodeError, UnicodeDecodeError
        KeyError,
        IndexError,
        TypeError,
        EOFError,
        OSError,
        RecursionError,
        OverflowError,
        MemoryError,
        struct.error,
        zlib.error,
        zipfile.BadZipFile,
    ]
    import pickle
    import re

    kinds += [pickle.UnpicklingError, re.error]  # re.error: a bad regex in a tokenizer file
    for module, name in (
        ("safetensors", "SafetensorError"),
        ("zstandard", "ZstdError"),
        ("pyarrow.lib", "ArrowException"),
        ("torch.distributed.checkpoint.api", "CheckpointException"),
        ("lzma", "LZMAError"),
        ("gzip", "BadGzipFile"),
        ("tomllib", "TOMLDecodeError"),
        ("regex", "error"),
    ):
        mod = sys.modules.get(module)
        kind = getattr(mod, name, None) if mod else None
        if isinstance(kind, type) and issubclass(kind, BaseException):
            kinds.append(kind)
    return tuple(kinds)


def _detail(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, MemoryError):
        return "it asks for more memory than there is"
    if isinstance(e, KeyError):
        return f"missing {e.args[0]!r}" if e.args else "a member is missing"
    text = " ".join(str(e).split()) or type(e).__name__
    if type(e).__name__ == "CheckpointException":  # one line per rank: keep the first cause
        text = text.split(" Traceback")[0]
    return text if len(text) <= 300 else text[:297] + "..."


def as_input_error(e: BaseException, path: str | os.PathLike[str], fmt: str) -> InputError:
    """``e`` (a parse error) as one :class:`InputError` line naming ``path`` and ``fmt``."""
    if isinstance(e, FileNotFoundError):
        return InputError(f"{path}: no such file")
    if isinstance(e, IsADirectoryError):
        return InputError(f"{path}: is a folder, expected a {fmt} file")
    return InputError(f"{path}: not a valid {_noun(fmt)} ({_detail(e)})")


def _noun(fmt: str) -> str:
    """``"safetensors file"``; a format already naming what it is (``"... folder"``) as is."""
    return fmt if fmt.endswith(("folder", "file", "shards", "checkpoint")) else f"{fmt} file"


def _with_path(e: AttnlmError, path: str | os.PathLike[str]) -> AttnlmError:
    """``e`` with ``path`` in front of its message (same class where it can be rebuilt)."""
    try:
        return type(e)(f"{path}: {e}")
    except TypeError:  # a subclass with another constructor
        return InputError(f"{path}: {e}")


@contextlib.contextmanager
def reading(path: str | os.PathLike[str], fmt: str) -> Iterator[None]:
    """Run the block that parses ``path`` (a file of format ``fmt``); any parse error of the
    format becomes one :class:`InputError` line naming the file and the problem."""
    try:
        yield
    except AttnlmError as e:
        message = str(e)
        if str(path) in message or Path(path).name in message:
            raise
        raise _with_path(e, path) from None
    except _parse_errors() as e:
        raise as_input_error(e, path, fmt) from None


def foreign_reader(fmt: str, path_arg: int | str = 0) -> Callable[[F], F]:
    """Decorate a function that reads a file of format ``fmt``: it is registered in
    :data:`READERS` and runs inside :func:`reading`; ``path_arg`` names (by position or keyword)
    the argument that holds the path."""

    def wrap(fn: F) -> F:
        register(fmt, f"{fn.__module__}.{fn.__qualname__}")

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if isinstance(path_arg, str):
                path = kwargs.get(path_arg, "?")
            else:
                path = args[path_arg] if len(args) > path_arg else next(iter(kwargs.values()), "?")
            with reading(path if isinstance(path, (str, os.PathLike)) else "?", fmt):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


# ---------------------------------------------------------------- JSON


def json_depth_problem(text: str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """``"nested N levels deep ..."`` when ``text`` (JSON) opens more than ``limit`` brackets
    at once, else None. A linear scan over brackets outside strings, so no parser recursion."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return f"nested more than {limit} levels deep"
        elif ch in "]}":
            depth -= 1
    return None


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def surrogate_problem(text: str, value: Any) -> str | None:
    """``"a string holds a lone surrogate ..."`` when the JSON ``value`` parsed from ``text``
    has a string with a lone surrogate (``"\\ud800"``: valid JSON, not valid text; it crashes
    whatever prints or encodes it later), else None. Only walks ``value`` when ``text`` has
    such an escape at all, so ordinary files cost one regex scan."""
    if not _ESCAPED_SURROGATE.search(text):
        return None
    from attnlm.base.textio import text_problem

    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            problem = text_problem(v, empty_ok=True)
            if problem and "surrogate" in problem:
                return f"a string is {problem}"
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def parse_json(text: str, where: str, fmt: str = "JSON") -> Any:
    """``text`` parsed as JSON; bad JSON, nesting over :data:`MAX_JSON_DEPTH` and lone
    surrogates in strings raise one :class:`InputError` line naming ``where``."""
    problem = json_depth_problem(text)
    if problem:
        raise InputError(f"{where}: not a valid {_noun(fmt)} ({problem})")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise as_input_error(e, where, fmt) from None
    problem = surrogate_problem(text, value)
    if problem:
        raise InputError(f"{where}: not a valid {_noun(fmt)} ({problem})")
    return value


def load_json(
    path: str | os.PathLike[str], fmt: str = "JSON", *, expect: type | None = dict
) -> Any:
    """The JSON value in the file at ``path`` (strict UTF-8 through :mod:`attnlm.base.textio`,
    bounded nesting); ``expect`` (default ``dict``) is the type the top level must have."""
    from attnlm.base.fileio import read_file_text

    text = read_file_text(path, f"{fmt} file")
    value = parse_json(text, str(path), fmt)
    if expect is not None and not isinstance(value, expect):
        kind = "object" if expect is dict else "array" if expect is list else expect.__name__
        raise InputError(f"{path}: not a valid {_noun(fmt)} (expected a JSON {kind})")
    return value


register("JSON", f"{__name__}.load_json")


# ---------------------------------------------------------------- bounded reads


def read_bounded(
    path: str | os.PathLike[str], limit: int, what: str = "file", *, stop_at_nul: bool = True
) -> bytes:
    """At most ``limit`` bytes of ``path``: a longer file (or a device such as ``/dev/zero``)
    is refused after reading ``limit + 1`` bytes, and with ``stop_at_nul`` a NUL byte is refused
    as soon as it is read (a text file has none), so memory stays bounded by ``limit``."""
    p = Path(path)
    chunks: list[bytes] = []
    total = 0
    with file_read_errors(p, what), open(p, "rb") as f:
        while True:
            chunk = f.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            if stop_at_nul and b"\x00" in chunk:
                raise InputError(f"{p}: contains a NUL byte (a binary file?)")
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputError(
                    f"{p}: longer than {limit:,} bytes, the limit for a {what} "
                    "(is it the right file?)"
                )
    return b"".join(chunks)


# ---------------------------------------------------------------- weights


def check_finite(tensors: Any, where: str | os.PathLike[str], what: str = "weight") -> None:
    """Refuse NaN or infinite values in ``tensors`` (a dict of name -> tensor/array, or one
    tensor/array) in one line naming ``where`` and the first bad entry. Integer tensors are
    skipped. Costs one pass over the floating-point values."""
    items = tensors.items() if isinstance(tensors, dict) else [(None, tensors)]
    for name, t in items:
        if not _is_finite(t):
            label = f"{what} {name!r}" if name is not None else f"{what}s"
            raise InputError(f"{where}: {label} holds NaN or infinite values")


FINITE_CHUNK = 1 << 20  # elements checked at once by check_finite


def _is_finite(t: Any) -> bool:
    if hasattr(t, "is_floating_point"):  # a torch tensor
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            return True
        if t.device.type == "meta":
            return True
        import torch

        # a slice at a time: isfinite on a whole 100 MB embedding would allocate twice its size
        flat = t.detach().reshape(-1)
        return all(bool(torch.isfinite(c).all()) for c in flat.split(FINITE_CHUNK))
    import numpy as np

    a = np.asarray(t)
    if a.dtype.kind not in "fc" or a.size == 0:
        return True
    return bool(np.isfinite(a).all())


# ---------------------------------------------------------------- memory


def available_memory() -> int:
    """Bytes this process may still allocate: the smaller of the free physical memory
    (``MemAvailable``) and the address-space limit (``ulimit -v``); a large default where the
    platform tells neither."""
    limits = []
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            limits.append(int(soft))
    if not limits:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return min(limits) if limits else 1 << 40


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest unit that keeps one digit before the point (``3.2 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover - the loop returns


def check_fits(
    n_params: int | float, where: str, *, bytes_per_param: int = 4, available: int | None = None
) -> None:
    """Refuse, before anything is allocated, a model of ``n_params`` parameters
    (``bytes_per_param`` each) that cannot fit in :func:`available_memory`; ``where`` names the
    config it came from."""
    need = float(n_params) * bytes_per_param
    have = available_memory() if available is None else available
    if need > have:
        raise InputError(
            f"{where}: the model would need about {format_bytes(need)} for its "
            f"{float(n_params):,.0f} parameters, more than the {format_bytes(have)} "
            "of memory available"
        )


def estimate_params(
    *,
    vocab: int,
    width: int,
    layers: int,
    ffn: int | None = None,
    positions: int = 0,
    decoder_layers: int = 0,
    extra: int = 0,
) -> int:
    """A close upper estimate of a transformer's parameter count from its sizes: embeddings
    (``vocab * width``, plus ``positions * width`` for learned positions), per layer the four
    attention projections (``4 * width**2``) and the feed-forward (``3 * width * ffn``, enough
    for a gated SwiGLU), and cross-attention for ``decoder_layers``. Python integers, so an
    absurd config gives an absurd number rather than an overflow."""
    vals = dict(
        vocab=vocab, width=width, layers=layers, positions=positions, decoder_layers=decoder_layers
    )
    for name, v in vals.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{name} must be a non-negative integer, got {v!r}")
    f = 4 * width if ffn is None else int(ffn)
    per_layer = 4 * width * width + 3 * width * f + 4 * width
    total = vocab * width + positions * width + layers * per_layer
    total += decoder_layers * (per_layer + 4 * width * width)
    return total + int(extra)


def tensor_bytes(shapes: Any, bytes_per_value: int = 4) -> int:
    """The bytes of tensors of the given shapes (an iterable of tuples of ints)."""
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total * bytes_per_value


def _int_field(config: Any, *names: str) -> int:
    for name in names:
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def config_params(config: Any) -> int:
    """An upper estimate of the parameters a model config (any family's dataclass) asks for,
    from the sizes it names: vocabularies, width, layers, feed-forward width, positions, HMM
    states, n-gram order. Cheap (no tensor is made), so it runs before any is."""
    vocab = _int_field(config, "vocab_size") + _int_field(config, "src_vocab_size")
    width = _int_field(config, "n_embd", "d_model", "d_hidden")
    emb = _int_field(config, "d_emb") + _int_field(config, "d_enc")
    layers = sum(_int_field(config, n) for n in ("n_layer", "n_encoder_layers", "n_decoder_layers"))
    ffn = _int_field(config, "d_ff", "n_hidden") or 4 * width
    positions = _int_field(config, "block_size", "max_position_embeddings")
    states = _int_field(config, "n_states")
    order = _int_field(config, "order")
    experts = _int_field(config, "n_expert")  # a mixture of experts: each its own feed-forward
    total = 2 * vocab * (width + emb)  # embeddings and an untied output layer
    total += positions * width
    total += layers * (4 * width * width + 3 * width * ffn * max(experts, 1) + experts * width
                       + 2 * emb * width + 4 * emb * emb)  # fmt: skip
    total += states * (states + vocab + 2)  # transitions, emissions, start and end
    if order:  # a feed-forward n-gram model: context -> hidden -> vocabulary, and direct links
        context = order * _int_field(config, "n_embd")
        total += context * (ffn + vocab) + ffn * vocab
    return total


_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("shapes_only", default=False)

#: What a model built for its shapes only (on the meta device) may ask for: no memory is
#: allocated, but building still takes a step per layer, so absurd sizes are refused all the same.
SHAPES_ONLY_BYTES = 1 << 50


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Configs made inside are built on the meta device (counted, never allocated): they are
    checked against :data:`SHAPES_ONLY_BYTES` rather than the memory available."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def check_config_fits(config: Any, where: str = "model") -> None:
    """Refuse a config whose parameters (:func:`config_params`, 4 bytes each, as built) cannot
    fit in the memory available, before a single layer is built (inside :func:`shapes_only`:
    more than :data:`SHAPES_ONLY_BYTES`)."""
    n = config_params(config)
    if n * 4 > (1 << 28):  # below 256 MiB there is nothing to check: skip reading /proc
        check_fits(n, where, available=SHAPES_ONLY_BYTES if _SHAPES_ONLY.get() else None)
