"""How a doc block's shell lines run: ``attnlm ...`` and ``python -c ...`` in this process
(``attnlm.cli.main`` / ``exec`` in the page's folder, with the page's environment, their
output captured), everything else through ``bash``.

Starting Python and importing torch costs seconds a command; a page runs dozens. A script is
planned line by line (:func:`plan`): a line that is a plain command (words, quotes, ``$'...'``,
``;``, ``&&``, a pipe from ordinary shell commands into the last command, a final ``> FILE``)
runs in-process when that command is ``attnlm`` or ``python -c``; consecutive other lines run
together through one ``bash``. A script with anything else (variables, globs, loops, ``cd``,
here-documents, ``torchrun``) runs whole through ``bash``, with ``attnlm`` and ``python`` on
its PATH as the checkout's (the caller's ``bash`` callback). The result is what a shell
would give: the exit status of the first command that failed (``bash -e``), and everything
printed up to there.
"""

from __future__ import annotations

import builtins
import codecs
import io
import os
import shlex
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_SHELL_ONLY = set("*?[]~{}()<`$&!")  # unquoted: a glob, subshell, variable, ... -> bash
# first words that need the script whole in bash: state kept between lines, control flow, and
# programs that run another command
_NEEDS_BASH = {"cd", "export", "source", ".", "set", "unset", "alias", "pushd", "popd", "shopt"}
_NEEDS_BASH |= {"for", "while", "until", "if", "then", "else", "fi", "do", "done", "case", "esac"}
_NEEDS_BASH |= {"function", "time", "exec", "eval", "torchrun", "xargs", "env", "nohup"}


@dataclass
class Ran:
    code: int
    out: str
    err: str


@dataclass
class Step:
    """One thing to run: ``argv`` in this process (stdin from ``feed``, a shell command's
    output; stdout to ``into``), or ``script`` through bash."""

    argv: list[str] | None = None
    feed: str = ""
    into: str = ""
    script: str = ""


def _tokens(line: str) -> list[tuple[str, bool]] | None:
    """``(text, is_operator)`` for each word and each ``;`` ``|`` ``>`` of ``line`` (``&&``
    counts as ``;`` under ``bash -e``); comments dropped; None when the line needs bash."""
    out: list[tuple[str, bool]] = []
    word: list[str] = []
    have = False
    i = 0
    try:
        while i < len(line):
            c = line[i]
            if c in " \t\n":
                if have:
                    out.append(("".join(word), False))
                word, have = [], False
                i += 1
            elif c == "#" and not have:
                break
            elif c == "'":
                j = line.index("'", i + 1)
                word.append(line[i + 1 : j])
                have, i = True, j + 1
            elif line.startswith("$'", i):  # ANSI-C quoting: $'a\nb'
                j = i + 2
                while line[j] != "'":
                    j += 2 if line[j] == "\\" else 1
                raw = line[i + 2 : j]
                if not raw.isascii():
                    return None
                word.append(codecs.decode(raw, "unicode_escape"))
                have, i = True, j + 1
            elif c == '"':
                j = i + 1
                while line[j] != '"':
                    if line[j] in "$`":
                        return None
                    if line[j] == "\\" and line[j + 1] in '"\\$`':
                        j += 1
                    word.append(line[j])
                    j += 1
                have, i = True, j + 1
            elif c == "\\":
                word.append(line[i + 1])
                have, i = True, i + 2
            elif line.startswith("&&", i) or c in ";|>":
                if have:
                    out.append(("".join(word), False))
                word, have = [], False
                op = ";" if c == "&" else c
                if line.startswith(("||", ";;", ">>", ">|"), i):
                    return None
                out.append((op, True))
                i += 2 if c == "&" else 1
            elif c in _SHELL_ONLY:
                return None
            else:
                word.append(c)
                have, i = True, i + 1
    except (IndexError, ValueError):  # an unclosed quote: let bash say so
        return None
    if have:
        out.append(("".join(word), False))
    return out


def _in_process(argv: list[str]) -> bool:
    return argv[:1] == ["attnlm"] or (argv[:1] in (["python"], ["python3"]) and argv[1:2] == ["-c"])


def _command(tokens: list[tuple[str, bool]]) -> Step | str | None:
    """One command (no ``;``): a :class:`Step` to run in-process, a shell command line, or
    None when it needs bash as a whole."""
    stages: list[list[str]] = [[]]
    into = ""
    for k, (text, op) in enumerate(tokens):
        if op and text == "|":
            stages.append([])
        elif op and text == ">":  # only a last `> FILE`
            if k != len(tokens) - 2 or tokens[-1][1]:
                return None
            into = tokens[-1][0]
            break
        else:
            stages[-1].append(text)
    if any(not s for s in stages):
        return None
    if any(s[0] in _NEEDS_BASH or "=" in s[0] for s in stages):
        return None
    mine = [_in_process(s) for s in stages]
    if not any(mine):
        if any(w in ("attnlm", "python", "python3") for s in stages for w in s):
            return None  # e.g. `nice attnlm ...`: let bash run it
        line = " | ".join(shlex.join(s) for s in stages)
        return line + (f" > {shlex.quote(into)}" if into else "")
    if mine.index(True) != len(stages) - 1:
        return None  # only the last command of a pipe runs here
    feed = " | ".join(shlex.join(s) for s in stages[:-1])
    return Step(argv=stages[-1], feed=feed, into=into)


def logical_lines(script: str) -> list[str]:
    """The script's lines with backslash continuations joined."""
    return script.replace("\\\n", " ").splitlines()


def plan(script: str) -> list[Step] | None:
    """The steps of ``script``, or None when it must run whole through bash."""
    steps: list[Step] = []
    shell: list[str] = []
    for line in logical_lines(script):
        if "<<" in line:
            return None
        tokens = _tokens(line)
        if tokens is None:
            return None
        command: list[tuple[str, bool]] = []
        for tok in [*tokens, (";", True)]:
            if tok != (";", True):
                command.append(tok)
                continue
            if not command:
                continue
            step = _command(command)
            command = []
            if step is None:
                return None
            if isinstance(step, str):
                shell.append(step)
                continue
            if shell:
                steps.append(Step(script="\n".join(shell)))
                shell = []
            steps.append(step)
    if shell:
        steps.append(Step(script="\n".join(shell)))
    return steps


# -- running --------------------------------------------------------------------------------


class TimedOut(BaseException):
    """An in-process command ran past its time (BaseException: no handler of the program's
    catches it)."""


def bash_runner(cwd: Path, env: dict[str, str], timeout: int | None = None):
    """``run(script, stdin) -> Ran``: shell text through ``bash -e -o pipefail`` in ``cwd``
    (the ``bash`` that :func:`run_script` takes)."""

    def run(script: str, stdin: str) -> Ran:
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
        )
        return Ran(proc.returncode, proc.stdout, proc.stderr)

    return run


def run_script(
    script: str,
    cwd: Path,
    env: dict[str, str],
    timeout: int,
    capfd,
    bash: Callable[[str, str], Ran],
) -> Ran:
    """Run ``script`` as ``bash -e`` would; ``bash(script, stdin)`` runs shell text."""
    steps = plan(script)
    if steps is None:
        return bash(script, "")
    out, err = "", ""
    for step in steps:
        if step.argv is None:
            r = bash(step.script, "")
        else:
            stdin = ""
            if step.feed:
                fed = bash(step.feed, "")
                if fed.code:
                    return Ran(fed.code, out + fed.out, err + fed.err)
                stdin = fed.out
            r = run_here(step.argv, stdin, cwd, env, timeout, capfd)
            if step.into:
                if step.into != "/dev/null":
                    (cwd / step.into).write_text(r.out, encoding="utf-8")
                r = Ran(r.code, "", r.err)
        out, err = out + r.out, err + r.err
        if r.code:
            return Ran(r.code, out, err)
    return Ran(0, out, err)


def run_here(argv: list[str], stdin: str, cwd: Path, env: dict, timeout: int, capfd) -> Ran:
    """``argv`` (``attnlm ...`` or ``python -c CODE ...``) in this process, in ``cwd`` with
    ``env``, reading ``stdin``; what it printed and its exit status, as a process would
    give them (a traceback and 1 for an uncaught exception)."""
    import torch

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_stdin, saved_argv, threads = sys.stdin, sys.argv, torch.get_num_threads()
    old_alarm = signal.signal(signal.SIGALRM, _timed_out)
    capfd.readouterr()
    code = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
        torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 gives a new process
        signal.alarm(timeout)
        try:
            if argv[0] == "attnlm":
                from attnlm.cli import main

                code = main(argv[1:])
            else:
                sys.argv = ["-c", *argv[3:]]
                exec(
                    compile(argv[2], "<string>", "exec"),
                    {"__name__": "__main__", "__builtins__": builtins},
                )
        except SystemExit as e:
            code = _exit_code(e)
        except TimedOut:
            print(f"timed out after {timeout} s", file=sys.stderr)
            code = 124
        except Exception:
            traceback.print_exc()
            code = 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_alarm)
        sys.stdout.flush()
        sys.stderr.flush()
        captured = capfd.readouterr()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.stdin, sys.argv = saved_stdin, saved_argv
        torch.set_num_threads(threads)
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
    return Ran(int(code or 0), captured.out, captured.err)


def _exit_code(e: SystemExit) -> int:
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def _timed_out(signum, frame):
    raise TimedOut()
