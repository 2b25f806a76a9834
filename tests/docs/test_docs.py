"""Docs that run: every ``bash``/``python`` block and ``$`` transcript of README.md and
docs/*.md is executed, in page order, in one temporary folder per page (later blocks use what
earlier ones wrote), with ``ATTNLM_DOCS_BUDGET`` set so that training commands stop after a few
steps. Transcripts are compared in shape with what the commands print (mdblocks.same_shape).
Markers and their meaning: mdblocks.py. New pages are picked up by the glob below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mdblocks import Block, blocks, same_shape

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BUDGET = "3"  # optimizer steps / epochs / EM iterations / seconds each training command gets
# blocks marked `skip` in all pages together: a ratchet at today's count (each with its reason;
# make targets, servers, torchrun, files a user brings); converting them lowers it
MAX_SKIPPED = 21
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


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, (
        f"{what} exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-3000:]}"
    )


@pytest.mark.parametrize("block", [_param(b) for b in ALL])
def test_block(block: Block, page_dirs):
    if block.mark("skip"):
        pytest.skip(block.mark("skip"))
    if block.mark("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
    cwd = page_dirs(block.page)
    env = _env(page_dirs.shims)
    timeout = SLOW_TIMEOUT if block.mark("slow") else FAST_TIMEOUT
    if block.setup:
        _check(_run(["bash", "-e", "-c", block.setup], cwd, env, timeout), "setup")
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
        _check(_run([sys.executable, "-c", code], cwd, env, timeout), block.id)
    elif block.kind == "bash":
        _check(
            _run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd, env, timeout), block.id
        )
    else:
        for cmd, shown in block.shown:
            proc = _run(["bash", "-e", "-o", "pipefail", "-c", cmd], cwd, env, timeout)
            if not any("error:" in line for line in shown):
                _check(proc, f"{block.id}: $ {cmd}")
            diff = same_shape(
                shown, proc.stdout + proc.stderr, block.tolerance, bool(block.mark("lines"))
            )
            assert not diff, f"{block.id}: $ {cmd}\n{diff}"


def test_skips_stay_the_exception():
    skipped = [b.id for b in ALL if b.mark("skip")]
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} blocks marked skip: {skipped}"


def test_collector_finds_blocks():
    """Every page with a fenced bash/python block or a transcript is collected."""
    kinds = {b.kind for b in ALL}
    assert {"bash", "python", "transcript"} <= kinds
    assert any(b.page == "README.md" for b in ALL)
