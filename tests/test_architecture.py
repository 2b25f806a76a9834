"""The package's import structure: no import cycles (counting imports inside functions and under
``if TYPE_CHECKING:`` too) and no upward imports across layers (docs/architecture.md):

    base (errors, textio, fileio, config, device, validate)
      -> tokenizers, data, nn, quant -> models, ngram, word2vec
      -> model sources (models.hf, models.gguf: adapters import the models, never the reverse)
      -> runtime (the backends a model runs on, and the planner that picks one)
      -> loading/ (sources, weights, checkpoint, objectives, evaluation), lora.run, inspect,
         generate (decoding)
      -> train, lora.training, apps/ (demo, compare) -> web -> cli (the command line, the only
      place argparse appears)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "attnlm"

# Lowest layer first. A module may import its own layer or any layer below it.
LAYERS = {
    "attnlm": 0,
    "attnlm._lazy": 0,
    "attnlm.base": 0,  # errors, config, device, validate; file formats read safely: fileio,
    # textio, foreign (parse errors -> one line, size checks), ggufio (the one GGUF reader)
    "attnlm.native": 0,  # the C decode step's build and loading (no model code)
    "attnlm.tokenizers": 1,
    "attnlm.data": 1,
    "attnlm.nn": 1,
    "attnlm.quant": 1,  # quantization's one home: block formats (numpy), quantized layers
    "attnlm.lora": 1,  # LoRA's one home: the adapter layers here, its run and training below
    "attnlm.tasks": 1,  # task files, built-in tasks, few-shot prompts, metrics (no torch)
    "attnlm.tasks.score": 5,  # log-likelihoods with the model (torch)
    "attnlm.tasks.run": 5,  # one model on one task: scoring, generation
    "attnlm.models": 2,
    "attnlm.ngram": 2,
    "attnlm.word2vec": 2,
    "attnlm.models.hf": 3,  # model sources: file formats, adapters over the models
    "attnlm.models.gguf": 3,
    "attnlm.runtime": 4,  # the backends: eager, compiled, the C step, the C engine (planner)
    "attnlm.loading": 5,  # --model SPEC, weights formats, runs and checkpoints, objectives,
    # evaluation and its scores
    "attnlm.lora.run": 5,  # a LoRA run: adapters, base SPEC and fingerprint
    "attnlm.inspect": 5,
    "attnlm.generate": 5,
    "attnlm.train": 6,
    "attnlm.lora.training": 6,  # the training run's two LoRA calls
    "attnlm.apps": 6,  # the demo and compare
    "attnlm.web": 7,
    "attnlm.api": 7,  # serve --api: the OpenAI-compatible server (beside the explorer)
    "attnlm.cli": 8,
    "attnlm.__main__": 8,
}


def module_name(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"{module} has no layer in LAYERS: add it (and to docs/architecture.md)")


def imports_of(path: Path, modules: set[str], src: Path = SRC) -> set[str]:
    """attnlm modules imported anywhere in ``path`` (module level, inside functions, or under
    ``if TYPE_CHECKING:``)."""
    me = module_name(path, src)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):  # under `if TYPE_CHECKING:` too: an annotation is an arrow
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            # "from pkg import mod" imports the submodule when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]  # fmt: skip
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    modules = set(files)
    return {m: imports_of(p, modules) for m, p in files.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            # a package __init__ importing its own submodules (re-exports) is not a cycle edge
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _without_package_reexports(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop edges from a package's ``__init__`` to its own submodules: importing
    ``attnlm.x.y`` runs ``attnlm.x`` first, but ``attnlm.x`` re-exporting ``y``'s names is the
    package's public face, not a dependency of ``y`` on anything."""
    out = {}
    for m, deps in g.items():
        is_pkg = m == "attnlm" or (PKG / Path(*m.split(".")[1:]) / "__init__.py").is_file()
        out[m] = {d for d in deps if not (is_pkg and d.startswith(m + "."))}
    return out


def test_no_import_cycles():
    found = cycles(_without_package_reexports(graph()))
    assert not found, f"import cycles: {found}"


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_upward_imports():
    bad = []
    for m, deps in graph().items():
        for d in deps:
            if d == "attnlm" or d.startswith(m + "."):
                continue
            if layer(d) > layer(m):
                bad.append(f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})")
    assert not bad, "\n".join(sorted(bad))


def test_model_files_know_no_file_format():
    """Arrows run from the adapters (``attnlm.models.hf``, ``attnlm.models.gguf``) to the
    models, never back: no model module imports one, even for annotations."""
    sources = tuple(m for m, n in LAYERS.items() if m.startswith("attnlm.models.") and n == 3)
    bad = sorted(
        f"{m} imports {d}"
        for m, deps in graph().items()
        if layer(m) == LAYERS["attnlm.models"] and m != "attnlm.models"
        for d in deps
        if d.startswith(sources)
    )
    assert not bad, "\n".join(bad)


def test_type_checking_imports_are_counted(tmp_path):
    pkg = tmp_path / "attnlm"
    pkg.mkdir()
    f = pkg / "m.py"
    f.write_text("if TYPE_CHECKING:\n    from attnlm.x import Y\n")
    assert imports_of(f, {"attnlm.m", "attnlm.x"}, src=tmp_path) == {"attnlm.x"}


def test_argparse_only_in_the_command_line():
    """Library packages parse no arguments: ``argparse`` is imported only under ``attnlm/cli/``."""
    cli = PKG / "cli"
    users = sorted(
        module_name(p)
        for p in PKG.rglob("*.py")
        if cli not in p.parents and "argparse" in _imported_names(p)
    )
    assert not users, f"argparse outside attnlm.cli: {users}"


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_argparse_check_sees_an_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from argparse import ArgumentParser\n")
    assert "argparse" in _imported_names(f)


def test_library_imports_nothing_from_cli_or_web():
    bad = sorted(
        f"{m} imports {d}"
        for m, deps in graph().items()
        if not m.startswith(("attnlm.cli", "attnlm.web", "attnlm.__main__"))
        for d in deps
        if d.startswith(("attnlm.cli", "attnlm.web"))
    )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module",
    [
        "attnlm.cli.generate",
        "attnlm.loading.checkpoint",
        "attnlm.loading.evaluation",
        "attnlm.inspect",
    ],
)
def test_loading_and_using_models_does_not_import_training(module):
    code = f"import {module}, sys; print([m for m in sys.modules if m.startswith('attnlm.train')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


HIDDEN_STATE = {
    "__class__ =": "a class swapped after construction",
    "registration_hook": "a process-wide module/parameter/buffer hook",
    "__dict__[": "state kept in an object's __dict__ from outside",
}


def test_no_hidden_state_in_the_sources():
    """No process-wide hooks, no class swapping after construction, no attributes kept in
    another object's ``__dict__`` (docs/architecture.md, "The runtime"): a backend owns its
    own description of a model."""
    found = [
        f"{path.relative_to(SRC)}:{i}: {why}"
        for path in sorted(PKG.rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for needle, why in HIDDEN_STATE.items()
        if needle in line
    ]
    assert not found, found


def test_the_model_files_know_no_backend():
    """The runtime imports the models, never the reverse (docs/architecture.md)."""
    edges = graph()
    found = [(a, b) for a, deps in edges.items() if a.startswith("attnlm.models")
             for b in deps if b.startswith("attnlm.runtime")]  # fmt: skip
    assert not found, found


def _followed_files() -> list[list[tuple[str, str]]]:
    """The numbered lists of docs/architecture.md's "Following `attnlm generate`" section: per
    list, ``(path under src/attnlm, the first name it mentions)``."""
    import re

    page = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("### Following `attnlm generate", 1)[1].split("\n## ", 1)[0]
    lists, current = [], []
    for line in section.splitlines():
        m = re.match(r"\d+\. `([^`]+)`: `([A-Za-z_]\w*)", line)
        if m:
            current.append((m.group(1), m.group(2)))
        elif current and not line.startswith("   "):
            lists.append(current)
            current = []
    return lists + ([current] if current else [])


def test_the_generate_command_is_followed_through_at_most_eight_files():
    """docs/architecture.md's claim: a newcomer follows ``attnlm generate`` (the C engine and
    the PyTorch path) through at most eight files; each named file exists and defines the
    name the page gives it."""
    lists = _followed_files()
    assert len(lists) == 2, lists
    for steps in lists:
        assert 0 < len(steps) <= 8, steps
        for path, name in steps:
            text = (PKG / path).read_text(encoding="utf-8")
            defined = (f"def {name}(", f"class {name}", f"{name}(")
            assert any(d in text for d in defined), f"{path} does not define {name}"
