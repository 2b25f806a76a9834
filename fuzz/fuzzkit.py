"""What every fuzz target shares (docs/reliability.md, "Fuzzing"): the exception policy, a
scratch file for readers that take a path, and the two ways to run a target.

The policy: a target gets arbitrary bytes. Refusing them with
:class:`attnlm.base.errors.InputError` (a one-line message, exit 2 on the CLI) is the expected
answer; any other exception, a signal, a hang past ``-timeout`` or memory past
``-rss_limit_mb`` is a crash, and atheris (libFuzzer) writes the input that caused it.

Running a target (``fuzz/fuzz_NAME.py``)::

    python fuzz/fuzz_gguf.py --replay fuzz/corpus/gguf     # each input once, no atheris needed
    python fuzz/fuzz_gguf.py WORK fuzz/corpus/gguf -max_total_time=60   # coverage-guided

The second form is libFuzzer's command line (atheris passes it on): new inputs go to the first
folder, ``make fuzz`` gives it a scratch one under ``build/fuzz`` so the committed corpus stays
as it is. This module imports nothing of attnlm at its top, so a target imports attnlm inside
:func:`instrumented` and atheris sees every line it runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

#: fuzzing (atheris) or replaying (``--replay``; the corpus test sets it False before importing
#: a target)
FUZZING = "--replay" not in sys.argv
_SCRATCH: list[Path] = []


_PACKAGES = ["attnlm"]


def instrumented(*packages: str) -> contextlib.AbstractContextManager:
    """A block whose imports atheris instruments for coverage (``attnlm`` and ``packages``);
    a plain block when replaying. :func:`main` opens it again around a first pass over the
    seeds, so modules a target imports on first use are instrumented too."""
    _PACKAGES.extend(p for p in packages if p not in _PACKAGES)
    if FUZZING:
        import atheris

        return atheris.instrument_imports(include=list(_PACKAGES))
    return contextlib.nullcontext()


def scratch(name: str, data: bytes) -> Path:
    """``data`` written to ``name`` in this process's scratch folder (in memory where the
    system has ``/dev/shm``), for readers that take a path; the same path each call."""
    if not _SCRATCH:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="attnlm-fuzz-", dir=base)))
    path = _SCRATCH[0] / name
    path.write_bytes(data)  # the fuzzer's own scratch file, not a file attnlm writes
    return path


def _cleanup() -> None:
    import shutil

    for folder in _SCRATCH:
        shutil.rmtree(folder, ignore_errors=True)


def one(target: Callable[[bytes], None], data: bytes) -> bool:
    """Run ``target`` on ``data`` under the policy: True if it accepted the input, False if it
    refused it with an InputError; anything else propagates (a crash)."""
    from attnlm.base.errors import InputError

    try:
        target(data)
    except InputError as e:
        message = str(e)
        if len(message.splitlines()) != 1 or not message.strip():
            raise AssertionError(f"an InputError of {len(message.splitlines())} lines") from e
        return False
    return True


def inputs(paths: list[str]) -> Iterator[Path]:
    """Every file under ``paths`` (files or folders), sorted."""
    for p in map(Path, paths):
        yield from sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]


def main(target: Callable[[bytes], None]) -> int:
    """The command line of a target (see the module docstring)."""
    import atexit

    atexit.register(_cleanup)
    if not FUZZING:
        args = [a for a in sys.argv[1:] if a != "--replay"]
        accepted = refused = 0
        for path in inputs(args):
            if one(target, path.read_bytes()):
                accepted += 1
            else:
                refused += 1
        print(f"{Path(sys.argv[0]).stem}: {accepted} accepted, {refused} refused in one line")
        return 0
    import atheris

    with instrumented():  # the first use's imports (jinja2 inside the chat template's compile)
        for path in inputs([a for a in sys.argv[1:] if not a.startswith("-") and Path(a).is_dir()]):
            with contextlib.suppress(Exception):
                target(path.read_bytes())
    atheris.Setup(sys.argv, lambda data: one(target, data))
    atheris.Fuzz()
    return 0
