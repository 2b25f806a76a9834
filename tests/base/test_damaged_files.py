"""Every file format attnlm reads, damaged on purpose: each mutation (cut at several points,
flipped bytes, JSON values of the wrong type, NaN/inf, sizes that lie, missing members) must be
refused with one line naming the file (an :class:`~attnlm.base.errors.AttnlmError`, exit 2 on the
command line) or load into a sane result: never a traceback, never a silent wrong number.

``FORMATS`` (in ``damaged_formats.py``) is the table. Each row builds a good file, reads it
with the reader the commands call, and says what a sane result is. The readers register
themselves in :data:`attnlm.base.foreign.READERS` (``@foreign_reader`` or ``register``); a
registered format that is not in the table fails :func:`test_every_reader_is_in_the_table`,
and a function that calls a parser (``json.loads``, ``np.load``, ``safetensors``,
``torch.load``, ``tomllib``, Parquet, ``dcp.load``) without being registered or listed in
``NOT_FOREIGN`` fails :func:`test_every_parser_call_is_a_registered_reader`. Mutations use a
fixed seed; more of them run under ``-m slow``.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from damaged_formats import COVERED_ELSEWHERE, FORMATS, Format

import attnlm
from attnlm.base.errors import AttnlmError
from attnlm.base.foreign import READERS

SRC = Path(attnlm.__file__).parent


# ------------------------------------------------------------------ mutations

WRONG_VALUES = ["x", [], {}, None, -1, 0, 1e308, 10**12, True]


def _seed(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode())


def mutations(fmt: Format, good: bytes, slow: bool) -> list[tuple[str, Callable[[], bytes]]]:
    """``(name, make damaged bytes)`` for one format; a fixed seed per format."""
    rng = random.Random(_seed(fmt.name))
    n = len(good)
    cuts = sorted({0, 1, n // 3, n // 2, n - 1} | ({rng.randrange(n) for _ in range(6)} if slow
                                                    else set()))  # fmt: skip
    out: list[tuple[str, Callable[[], bytes]]] = [
        (f"cut at {c}", lambda c=c: good[:c]) for c in cuts if c < n
    ]
    for _ in range(8 if slow else 2):
        at = rng.randrange(n)

        def flip(at: int = at) -> bytes:
            b = bytearray(good)
            b[at] ^= 0xFF
            return bytes(b)

        out.append((f"flip byte {at}", flip))
    if fmt.json:
        doc = json.loads(good)
        keys = list(doc)[: (len(doc) if slow else 6)] if isinstance(doc, dict) else []
        for key in keys:
            out.append((f"drop {key}", lambda key=key: _json_without(doc, key)))
            values = WRONG_VALUES if slow else WRONG_VALUES[::3]
            for v in values:
                out.append((f"{key}={v!r}"[:60], lambda key=key, v=v: _json_with(doc, key, v)))
        out.append(("nested 100000 deep", lambda: b"[" * 100_000 + b"]" * 100_000))
        out.append(("not an object", lambda: b"[1, 2, 3]"))
        out.append(("nan", lambda: good.replace(b"1", b"NaN", 1)))
    for name, f in fmt.extra.items():
        out.append((name, lambda f=f: f(good)))
    return out


def _json_without(doc: dict, key: str) -> bytes:
    return json.dumps({k: v for k, v in doc.items() if k != key}).encode()


def _json_with(doc: dict, key: str, value: Any) -> bytes:
    return json.dumps({**doc, key: value}).encode()


def check_damaged(fmt: Format, tmp: Path, slow: bool) -> dict[str, str]:
    """Feed every mutation of ``fmt`` to its reader; returns ``{mutation: outcome}``. A
    traceback (any non-AttnlmError), a message over one line, a message not naming the file, or
    an insane result fails the test with the mutation's name."""
    good_path = fmt.build(tmp)
    good = good_path.read_bytes()
    fmt.sane(fmt.load(fmt.target(good_path)))  # the good file loads and is sane
    outcomes = {}
    for name, make in mutations(fmt, good, slow):
        good_path.write_bytes(make())
        try:
            result = fmt.load(fmt.target(good_path))
        except AttnlmError as e:
            message = str(e)
            assert "\n" not in message.strip(), f"{fmt.name} / {name}: {message!r}"
            named = {good_path.name, good_path.parent.name, good_path.parents[1].name, *fmt.names}
            assert any(n in message for n in named) or "tokenizer" in message, (
                f"{fmt.name} / {name}: the error does not name the file: {message}"
            )
            outcomes[name] = "refused"
        except Exception as e:  # noqa: BLE001 - the failure this test exists to catch
            raise AssertionError(f"{fmt.name} / {name}: {type(e).__name__}: {e}") from e
        else:
            try:
                fmt.sane(result)
            except AttnlmError as e:  # refused when used, in one line: not silently wrong
                assert "\n" not in str(e).strip(), f"{fmt.name} / {name}: {e!r}"
                outcomes[name] = "refused when used"
                continue
            except Exception as e:  # noqa: BLE001
                raise AssertionError(f"{fmt.name} / {name}: loaded but wrong: {e}") from e
            outcomes[name] = "loaded"
        finally:
            good_path.write_bytes(good)
    return outcomes


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_damaged_file_is_refused_or_loads_sane(fmt, tmp_path):
    outcomes = check_damaged(fmt, tmp_path, slow=False)
    if not fmt.empty_ok:
        assert outcomes["cut at 0"].startswith("refused"), f"{fmt.name}: an empty file loaded"
    for name in fmt.extra:  # each names a damage that must not load
        if not (fmt.name.endswith("--skip-bad") and name in ("deep", "surrogate")):
            assert outcomes[name].startswith("refused"), f"{fmt.name} / {name} was accepted"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_damaged_file_more_mutations(fmt, tmp_path):
    check_damaged(fmt, tmp_path, slow=True)


# ------------------------------------------------------------------ discovery


def _import_all() -> None:
    for info in pkgutil.walk_packages([str(SRC)], "attnlm."):
        if ".cli" in info.name or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional dependency is missing: its readers are skipped
            pass


def test_every_reader_is_in_the_table():
    _import_all()
    tabled = {r for f in FORMATS for r in f.readers} | set(COVERED_ELSEWHERE)
    missing = sorted(set(READERS) - tabled)
    assert not missing, f"add a row to FORMATS for these registered formats: {missing}"


# Functions that call a parser on something that is not a foreign file, with why.
NOT_FOREIGN = {
    "attnlm.api.app.Api.body": "an HTTP request body of serve --api, not a file: a body that "
    "is not JSON is a 400 in OpenAI's error shape (tests/serve_api/test_api_errors.py)",
    "attnlm.api.protocol._call_for_template": "a tool call's arguments string inside a chat "
    "request: not JSON is a 400 naming the field (tests/serve_api/test_api_tools.py)",
    "attnlm.api.tools.parse_call": "the model's own reply text, read for tool calls: text that "
    "is not a call stays content (tests/serve_api/test_api_tools.py)",
    "attnlm.lora.run.fingerprint": "a JSON round trip of the in-memory [model] table (tuples "
    "compare as lists), no file",
    "attnlm.tokenizers.chat_template._json_data": "a JSON round trip of in-memory messages and "
    "tools (what a template may see), no file",
    "attnlm.tasks.files._read_lines": "one line of an eval --task file, parsed by "
    "foreign.parse_json (tests/tasks/test_task_files.py: every bad line is one line naming "
    "FILE:LINE)",
    "attnlm.tasks.files._folder_header": "a task folder's task.json, parsed by "
    "foreign.parse_json (tests/tasks/test_task_files.py)",
    "attnlm.data.chat._record": "one line of a --chat-data file, parsed by foreign.parse_json "
    "(tests/train/test_chat_finetune.py: every bad record is one line naming FILE:LINE)",
    "attnlm.lora.run.read_adapters": "a LoRA run's adapters: attnlm's own checkpoint file, "
    "safetensors errors and NaN refused in one line like load_weights",
    "attnlm.cli.ngram._load": "calls attnlm.ngram.files.load_model (a registered reader)",
    "attnlm.cli.chat.scripted_messages": "a --messages file, parsed by foreign.parse_json",
    "attnlm.base.config.parse_override": "a --set argument, not a file",
    "attnlm.data.stream._init_worker": "pickled arguments between attnlm's own processes",
    "attnlm.base.foreign.parse_json": "the boundary itself",
    "attnlm.web.server.Handler._post": "an HTTP body: depth-checked, 400 on any parse error",
    "attnlm.apps.compare.run_neural": "attnlm's own run bookkeeping (outputs, another invariant)",
    "attnlm.apps.compare._load_done": "attnlm's own run bookkeeping (outputs, another invariant)",
    "attnlm.data.windows.read_token_file": "attnlm's own prepared token files",
    "attnlm.train.pair_data.prepare_pairs": "attnlm's own prepared-data signature",
    "attnlm.train.run_files.may_reuse": "attnlm's own prepared-data signature",
    "attnlm.train.run_files.reuse_run_data": "attnlm's own prepared-data signature",
    "attnlm.train.job.MetricsLog.__init__": "attnlm's own metrics.jsonl (resume)",
    "attnlm.ngram.arpa_write.write_sections.gz": "a writer",
    "attnlm.models.hf.folder._read_json": "goes through foreign.load_json",
}
PARSERS = {"loads", "load", "load_file", "safe_open", "ParquetFile", "stream_reader",
           "decompressobj", "GzipFile", "decompress"}  # fmt: skip
PARSER_MODULES = {"json", "np", "numpy", "torch", "dcp", "tomllib", "pq", "gzip", "zstandard",
                  "pickle"}  # fmt: skip


def parser_calls() -> dict[str, int]:
    """``{module.function: line}`` of every function in ``src/attnlm`` that calls a parser."""
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)

        def visit(node: ast.AST, stack: list[str], module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    visit(child, [*stack, child.name])
                    continue
                if isinstance(child, ast.Call) and stack:
                    f = child.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                    base = getattr(f.value, "id", None) if isinstance(f, ast.Attribute) else None
                    direct = base is None and name in {"load_file", "safe_open"}
                    if name in PARSERS and (base in PARSER_MODULES or direct):
                        found.setdefault(f"{module}.{'.'.join(stack)}", child.lineno)
                visit(child, stack)

        visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return found


def test_every_parser_call_is_a_registered_reader():
    _import_all()
    registered = {q for names in READERS.values() for q in names}
    loose = sorted(q for q in parser_calls() if q not in registered and q not in NOT_FOREIGN)
    assert not loose, (
        "these functions parse files: register them "
        "(attnlm.base.foreign.foreign_reader / register) "
        f"and add their format to FORMATS, or list them in NOT_FOREIGN with why: {loose}"
    )
