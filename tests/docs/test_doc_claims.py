"""What the README says about commands, checked against the commands: MiniLM served by name
offers no fill-mask (no masked-LM head), and the demo's duration is the same in `--help`
and the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnlm.base.errors import InputError

README = Path(__file__).resolve().parents[2] / "README.md"


def test_serve_minilm_offers_no_fill_mask_and_the_readme_says_so():
    from attnlm.web.service.loading import load_service

    try:
        service = load_service(model="minilm")
    except InputError as e:
        pytest.skip(f"MiniLM wheel not available offline: {e}")
    assert "fill-mask" not in service.capabilities
    assert "embed" in service.capabilities
    # every README paragraph that names `serve --model minilm` says it has no masked-LM head
    for para in README.read_text(encoding="utf-8").split("\n\n"):
        flat = " ".join(para.split())
        if "serve --model minilm" in flat and "fill-mask" in flat:
            assert "no masked-LM head" in flat, flat


def _minutes(text: str) -> set[str]:
    words = {"three": "3", "four": "4", "five": "5", "six": "6"}
    found = re.findall(r"(?:about |~)(\w+)(?: |\s*)min", text)
    return {words.get(w, w) for w in found}


def test_demo_duration_agrees_between_help_and_readme(cli):
    from attnlm.cli import demo

    help_says = _minutes(demo._demo.__doc__ or "")
    readme = README.read_text(encoding="utf-8")
    readme_says = _minutes(" ".join(re.findall(r"`?make demo`?[^.]*", readme)))
    assert help_says and readme_says and help_says == readme_says, (help_says, readme_says)


def _pytest_marks(target: str) -> str:
    """The ``-m`` expression of the pytest line `make -n TARGET` prints ('' for none)."""
    import shlex
    import subprocess

    root = README.parent
    lines = subprocess.run(
        ["make", "-n", "-C", str(root), target, "VENV_OK="], capture_output=True, text=True
    ).stdout.splitlines()
    (line,) = [ln for ln in lines if "-m pytest" in ln]
    words = shlex.split(line)
    return words[words.index("-m", words.index("pytest")) + 1] if words.count("-m") > 1 else ""


def test_make_test_runs_every_quick_doc_block_and_test_full_the_slow_ones_too():
    """`make test` (CI) runs every test and doc block not marked slow; `make test-full` all."""
    from _pytest.mark.expression import Expression
    from test_docs import ALL

    def selected(target: str, marks: set[str]) -> bool:
        expr = _pytest_marks(target)
        return not expr or Expression.compile(expr).evaluate(lambda m: m in marks)

    for b in ALL:
        marks = {"docs", "slow"} if b.mark("slow") else {"docs"}
        assert selected("test", marks) == (not b.mark("slow")), b.id
        assert selected("test-full", marks) and selected("test-docs", marks), b.id
    assert selected("test", set()) and not selected("test", {"slow"})  # the rest of the suite
    assert selected("test-full", {"slow"}) and selected("test-full", set())
    assert "make test" in README.read_text(encoding="utf-8")
