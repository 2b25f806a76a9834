"""Bounds on what rendering a chat template may cost: a template is code from a file a user
downloaded, and a loop that never ends or a string that doubles on every line must stop in one
line, not after minutes and gigabytes.

A render (:func:`bounded_render`) stops with :class:`TemplateBudgetError` when

* it runs longer than :data:`MAX_SECONDS` or takes more than :data:`MAX_STEPS` steps: a step is
  a line of the template's compiled code or a Python call made while rendering, counted by a
  trace function set on this thread for the render alone (loops, macros, filters written in
  Python);
* the process's peak memory grows by more than :data:`MAX_MEMORY` bytes (checked every few
  hundred steps and after every operation whose result is large);
* its output reaches :data:`MAX_OUTPUT` characters (counted as the pieces are produced);
* one operation would build a string, list or number past the limits before it is built:
  ``*`` and ``+`` on sequences, ``**`` and ``*`` on integers, ``~`` concatenation, ``%`` and
  ``format`` with a huge field width, ``replace`` that would grow past the limit, and any call
  or filter given an integer argument above :data:`MAX_ARGUMENT` (``center(10**9)``,
  ``indent``, ``wordwrap``, ``slice``, ``lipsum``; jinja2's sandbox already caps ``range`` at
  100,000 items).

Real templates (ChatML, Llama 3, Gemma, Qwen2.5 with tools) render in a few hundred steps
and stay far inside every bound; their output is unchanged.
"""

from __future__ import annotations

import functools
import re
import resource
import sys
import threading
import time
from typing import Any

MAX_SECONDS = 3.0  # of rendering one conversation (real templates: about a millisecond)
MAX_STEPS = 5_000_000  # lines of template code and Python calls
MAX_MEMORY = 150 * 2**20  # growth of the process's peak resident memory, bytes
MAX_OUTPUT = 16 * 2**20  # characters of rendered text (more when the conversation is longer)
MAX_LENGTH = 16 * 2**20  # characters of one string, items of one list built by the template
MAX_INT_BITS = 1 << 16  # an integer the template computes
MAX_ARGUMENT = 100_000  # a width or count given to a call or filter (as range()'s cap)
LARGE = 1 << 20  # a result this long has memory checked at once

# a field width or precision of a million or more: printf-style, then str.format's
_WIDTH = re.compile(r"%[-#0 +]*(\d{7,}|\d*\.\d{7,})|\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")
# a width or precision given as an argument: printf's ``*``, str.format's nested ``{:{w}}``
_STAR = re.compile(r"%[-#0 +]*(\*|\d*\.\*)")
_NESTED = re.compile(r"\{[^{}]*:[^{}]*\{")
_local = threading.local()


class TemplateBudgetError(Exception):
    """A render went past one of the bounds (the message says which)."""


def _peak_bytes() -> int:
    """The process's peak resident memory so far (bytes; Linux counts kilobytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class Budget:
    """The steps, time and memory one render may use (counted by :meth:`trace`)."""

    CHECK_EVERY = 255  # a mask: the clock and the memory are checked every 256 steps

    def __init__(self) -> None:
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        self.memory_limit = _peak_bytes() + MAX_MEMORY

    def check(self) -> None:
        """Raise when the steps, the time or the memory are spent."""
        if self.steps > MAX_STEPS:
            raise TemplateBudgetError(f"it took more than {MAX_STEPS:,} steps")
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(f"it ran for more than {MAX_SECONDS:g} s")
        self.check_memory()

    def check_memory(self) -> None:
        if _peak_bytes() > self.memory_limit:
            raise TemplateBudgetError(f"it used more than {MAX_MEMORY // 2**20} MB of memory")

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        """``sys.settrace``'s function: every call is a step, and every line of template
        code (:meth:`_line`)."""
        self.steps += 1
        if not self.steps & self.CHECK_EVERY:
            self.check()
        return self._line if frame.f_code.co_filename == "<template>" else None

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.steps += 1
            if not self.steps & self.CHECK_EVERY:
                self.check()
        return self._line


def _large(size: int) -> None:
    """A result of ``size`` characters or items was built: check memory now if it is large."""
    budget = getattr(_local, "budget", None)
    if budget is not None and size >= LARGE:
        budget.check_memory()


def check_length(size: int, what: str) -> None:
    if size > MAX_LENGTH:
        raise TemplateBudgetError(f"{what} would be {size:,} long (at most {MAX_LENGTH:,})")
    _large(size)


def _sized(x: Any) -> bool:
    return isinstance(x, (str, list, tuple, bytes))


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``left operator right`` before it builds something past the limits."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*" and _sized(left) and isinstance(right, int):
        check_length(len(left) * right, "a repeated sequence")
    elif operator == "*" and _sized(right) and isinstance(left, int):
        check_length(len(right) * left, "a repeated sequence")
    elif operator == "*" and ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise TemplateBudgetError("an integer product too large")
    elif operator == "**" and ints and right > 0 and left not in (0, 1, -1):
        if right * max(1, abs(left).bit_length() - 1) > MAX_INT_BITS:
            raise TemplateBudgetError("a power too large")
    elif operator == "+" and _sized(left) and _sized(right):
        check_length(len(left) + len(right), "a concatenation")
    elif operator == "%" and isinstance(left, str):
        check_format(left, right if isinstance(right, tuple) else (right,))


def check_format(text: str, values: tuple = ()) -> None:
    """Refuse a format whose field width or precision is a million or more: written in it
    (``%1000000d``, ``{:1000000}``) or a ``*`` taken from ``values``."""
    star = (_STAR.search(text) or _NESTED.search(text)) and any(_big(v) for v in values)
    if star or _WIDTH.search(text):
        raise TemplateBudgetError("a format with a field width of a million or more")


def _big(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) > MAX_ARGUMENT


# calls whose integer arguments size their result (filters: after the value filtered)
SIZING = {"do_center", "do_indent", "do_wordwrap", "do_slice", "do_batch", "do_truncate",
          "generate_lorem_ipsum", "center", "ljust", "rjust", "zfill", "expandtabs"}  # fmt: skip


def check_arguments(fn: Any, args: tuple, kwargs: dict) -> None:
    """Refuse, before it runs, a call or filter that would build too much: a width or count
    above :data:`MAX_ARGUMENT`, a format with a huge field, a ``replace``, ``join`` or
    ``indent`` whose result would be too long."""
    name = getattr(fn, "__name__", "")
    owner = getattr(getattr(fn, "__wrapped__", fn), "__self__", None)  # str.format: wrapped
    if name in SIZING:
        sizes = args[1:] if name.startswith("do_") else args
        for a in (*sizes, *kwargs.values()):
            if _big(a):
                raise TemplateBudgetError(f"{name}() given {a:,} (at most {MAX_ARGUMENT:,})")
    if isinstance(owner, str) and name in ("format", "format_map"):
        check_format(owner, (*args, *kwargs.values()))
    elif name == "do_format" and args and isinstance(args[0], str):
        check_format(args[0], (*args[1:], *kwargs.values()))
    elif isinstance(owner, str) and name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1])
    elif name == "do_replace" and len(args) >= 4:  # the filter: (eval_ctx, s, old, new)
        _check_replace(args[1], args[2], args[3])
    elif name == "do_join" and len(args) >= 3 and _sized(args[1]) and isinstance(args[2], str):
        check_length(len(args[2]) * len(args[1]), "a joined string")  # (eval_ctx, value, d)
    elif name == "do_indent" and len(args) >= 2 and isinstance(args[0], str):
        width = args[1] if isinstance(args[1], (int, str)) and not isinstance(args[1], bool) else 0
        each = width if isinstance(width, int) else len(width)
        check_length(len(args[0]) + each * (args[0].count("\n") + 1), "an indented string")


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        n = len(text) + 1 if not old else text.count(old)
        check_length(len(text) + n * (len(new) - len(old)), "a replaced string")


def bounded_filter(fn: Any) -> Any:
    """``fn`` (a jinja2 filter) with :func:`check_arguments` first (jinja2's pass_context
    markers kept)."""

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_arguments(fn, args, kwargs)
        out = fn(*args, **kwargs)
        if _sized(out):
            check_length(len(out), f"the {fn.__name__.removeprefix('do_')} filter's result")
        return out

    return checked


def concat_checked(text: str) -> str:
    """A ``~`` concatenation's result, checked (the code generator routes every one here)."""
    check_length(len(text), "a concatenation")
    return text


def bounded_render(template: Any, extra_output: int, **context: Any) -> str:
    """``template.render(**context)`` within the bounds above (its output may be
    ``extra_output`` characters longer than :data:`MAX_OUTPUT`: the conversation's own
    length); raises :class:`TemplateBudgetError`."""
    budget = Budget()
    limit = MAX_OUTPUT + extra_output
    before = sys.gettrace()
    _local.budget = budget
    sys.settrace(budget.trace)
    try:
        pieces: list[str] = []
        size = 0
        for piece in template.generate(**context):
            size += len(piece)
            if size > limit:
                raise TemplateBudgetError(f"its output passed {limit:,} characters")
            pieces.append(piece)
        _large(size)
        return "".join(pieces)
    finally:
        sys.settrace(before)
        _local.budget = None


@functools.lru_cache(maxsize=1)
def bounded_sandbox() -> type:
    """jinja2's ``ImmutableSandboxedEnvironment`` with the checks above on every call, the
    operators ``*``, ``**``, ``+`` and ``%``, and every ``~`` concatenation (its code
    generator routes each through :func:`concat_checked`)."""
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.concat_checked(")
            super().visit_Concat(node, frame)
            self.write(")")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})
        code_generator_class = Generator
        concat_checked = staticmethod(concat_checked)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            check_arguments(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    return BoundedSandbox
