"""Docs that run: every ``bash``/``python`` block and ``$`` transcript of README.md and
docs/*.md is executed, in page order, in one temporary folder per page (later blocks use what
earlier ones wrote), with ``ATTNLM_DOCS_BUDGET`` set so that training commands stop after a few
steps. Transcripts are compared in shape with what the commands print (mdblocks.same_shape).
Markers and their meaning: mdblocks.py. New pages are picked up by the glob below.

``attnlm`` and ``python -c`` lines and python blocks run in this process (shell.py: no
interpreter start-up and torch import per command); other lines, and whole scripts that need a
shell, run through bash with ``attnlm``/``python`` shims. A setup marker that several blocks
share runs once (its files are copied into the next page's folder). Blocks marked ``slow`` run
in ``make test-docs`` / ``make test-full``; the others also in ``make test``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from mdblocks import Block, blocks, same_shape
from shell import Ran, bash_runner, run_here, run_script

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BUDGET = "3"  # optimizer steps / epochs / EM iterations / seconds each training command gets
# blocks marked `skip` in all pages together: a ratchet at today's count (each with its reason:
# make targets, servers, torchrun, GPT-2-sized training, sketches); converting them lowers it.
# A usage synopsis with [optional] flags is not a command: it is a ```text block.
MAX_SKIPPED = 11
FAST_TIMEOUT, SLOW_TIMEOUT = 240, 480

ALL = [b for page in PAGES for b in blocks(page, page.relative_to(REPO).as_posix())]


def _param(b: Block):
    marks = [pytest.mark.docs]
    if b.mark("slow"):
        marks.append(pytest.mark.slow)
    return pytest.param(b, id=b.id, marks=marks)


@pytest.fixture(scope="session")
def page_dirs(tmp_path_factory):
    """One folder per page, with `attnlm` and `python` shims that run this checkout."""
    shims = tmp_path_factory.mktemp("bin")
    for name, cmd in (("attnlm", f'"{sys.executable}" -m attnlm'), ("python", sys.executable)):
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec {cmd} "$@"\n')
        shim.chmod(0o755)
    made: dict[str, Path] = {}

    def folder(page: str) -> Path:
        if page not in made:
            made[page] = tmp_path_factory.mktemp(page.replace("/", "_").replace(".md", ""))
        return made[page]

    folder.shims = shims  # type: ignore[attr-defined]
    return folder


def _env(shims: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env.update(
        ATTNLM_DOCS_BUDGET=BUDGET,
        ATTNLM_DOCS_REPO=str(REPO),  # setup markers copy fixtures from here
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MPLBACKEND="Agg",
        COLUMNS="100",
    )
    return env


def _check(ran: Ran, what: str) -> None:
    assert ran.code == 0, (
        f"{what} exited {ran.code}\n--- stdout\n{ran.out[-3000:]}\n--- stderr\n{ran.err[-3000:]}"
    )


def _files(folder: Path) -> dict[Path, int]:
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


# a setup marker used by several blocks (e.g. one tiny trained run) runs once; later blocks get
# a copy of the files it wrote
SHARED_SETUPS = {s for s, n in Counter(s for b in ALL for s in b.setups).items() if n > 1}


@pytest.fixture(scope="session")
def setup_cache() -> dict[str, Path]:
    """Setup text -> a folder holding the files that setup wrote."""
    return {}


def _setup(block: Block, cwd: Path, run, setup_cache: dict[str, Path], tmp_path_factory) -> None:
    for setup in block.setups:
        if setup in setup_cache:
            shutil.copytree(setup_cache[setup], cwd, dirs_exist_ok=True)
            continue
        before = _files(cwd)
        _check(run(setup), "setup")
        after = _files(cwd)
        if setup in SHARED_SETUPS and set(before) <= set(after):
            cache = tmp_path_factory.mktemp("setup")
            for rel, mtime in after.items():
                if before.get(rel) != mtime:
                    (cache / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(cwd / rel, cache / rel)
            setup_cache[setup] = cache


@pytest.mark.parametrize("block", [_param(b) for b in ALL])
def test_block(block: Block, page_dirs, setup_cache, tmp_path_factory, capfd):
    if block.mark("skip"):
        pytest.skip(block.mark("skip"))
    if block.mark("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
    if block.mark("bf16"):
        from attnlm.nn.fused import bf16_backward_support

        if (why := bf16_backward_support()) is not None:
            pytest.skip(f"needs bfloat16 products: {why}")
    cwd = page_dirs(block.page)
    env = _env(page_dirs.shims)
    timeout = SLOW_TIMEOUT if block.mark("slow") else FAST_TIMEOUT
    bash = bash_runner(cwd, env, timeout)

    def run(script: str) -> Ran:
        if block.mark("process"):
            return bash(script, "")
        return run_script(script, cwd, env, timeout, capfd, bash)

    _setup(block, cwd, run, setup_cache, tmp_path_factory)
    if block.kind == "python":
        code = block.code
        if block.mark("continues"):
            earlier = [
                b.code
                for b in ALL
                if b.page == block.page and b.kind == "python" and b.line < block.line
                and not b.mark("skip")
            ]  # fmt: skip
            code = "\n".join([*earlier, code])
        code = block.given + code
        _check(run_here(["python", "-c", code], "", cwd, env, timeout, capfd), block.id)
    elif block.kind == "bash":
        _check(run(block.code), block.id)
    else:
        for cmd, shown in block.shown:
            ran = run(cmd)
            if not any("error:" in line for line in shown):
                _check(ran, f"{block.id}: $ {cmd}")
            diff = same_shape(shown, ran.out + ran.err, block.tolerance, block.free(cmd))
            assert not diff, f"{block.id}: $ {cmd}\n{diff}"


def test_skips_stay_the_exception():
    skipped = [b.id for b in ALL if b.mark("skip")]
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} blocks marked skip: {skipped}"


def test_collector_finds_blocks():
    """Every page with a fenced bash/python block or a transcript is collected."""
    kinds = {b.kind for b in ALL}
    assert {"bash", "python", "transcript"} <= kinds
    assert any(b.page == "README.md" for b in ALL)


# -- shown outputs are compared -------------------------------------------------------------

SHOWN = [
    pytest.param(b, cmd, shown, id=f"{b.id}:{k}")
    for b in ALL
    if b.kind == "transcript" and not b.mark("skip")
    for k, (cmd, shown) in enumerate(b.shown)
    if shown
]
# transcripts of generated text (`lines`: only that the command printed), a ratchet
MAX_FREE = 7


def _mutations(shown: list[str]):
    """The shown output with one column less, one more, or one word changed, in each line
    (lines with `...` stand for any words and are left alone)."""
    for i, line in enumerate(shown):
        words = line.split()
        if not words or "..." in words:
            continue
        if len(words) > 1:
            yield i, [*shown[:i], " ".join(words[:-1]), *shown[i + 1 :]]
        yield i, [*shown[:i], line + " extra", *shown[i + 1 :]]
        if any(not w[0].isdigit() for w in words):
            k = next(k for k, w in enumerate(words) if not w[0].isdigit())
            changed = " ".join([*words[:k], words[k] + "_x", *words[k + 1 :]])
            yield i, [*shown[:i], changed, *shown[i + 1 :]]


@pytest.mark.parametrize(("block", "cmd", "shown"), SHOWN)
def test_every_shown_output_is_compared_in_shape(block: Block, cmd: str, shown: list[str]):
    """What the page shows agrees with itself, and a printed output that differs from it in
    one column (a word less, a word more, another word) fails the doc test."""
    tol, free = block.tolerance, block.free(cmd)
    printed = "\n".join(shown)
    assert same_shape(shown, printed, tol, free) == ""
    if free:
        return
    for i, mutated in _mutations(shown):
        assert same_shape(shown, "\n".join(mutated), tol) != "", (block.id, cmd, shown[i])
        assert same_shape(mutated, printed, tol) != "", (block.id, cmd, shown[i])


def test_free_text_transcripts_stay_the_exception():
    free = [b.id for b in ALL if b.kind == "transcript" and b.mark("lines")]
    assert len(free) <= MAX_FREE, f"{len(free)} transcripts marked lines: {free}"


def test_a_changed_column_fails_the_doc_test(page_dirs, setup_cache, tmp_path_factory, capfd):
    """End to end: `attnlm models` as docs/architecture.md shows it, with one column of one
    line changed, fails test_block."""
    block = next(b for b in ALL if b.kind == "transcript" and b.code == "attnlm models\n")
    (cmd, shown), = block.shown  # fmt: skip
    test_block(block, page_dirs, setup_cache, tmp_path_factory, capfd)  # as shown: passes
    for _, mutated in list(_mutations(shown))[:3]:
        changed = dataclasses.replace(block, shown=[(cmd, mutated)])
        with pytest.raises(AssertionError, match="shown"):
            test_block(changed, page_dirs, setup_cache, tmp_path_factory, capfd)
