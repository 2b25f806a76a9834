"""Decoding outputs against the committed table ``tests/fixtures/outputs/decode_outputs.json``
(made by ``tests/fixtures/outputs/make_outputs.py`` from a clean checkout): every family that
decodes, f32 / q8 / q4 weights, every backend (PyTorch eager, the C step, torch.compile, the C
engine), greedy, lookahead drafts, prompts of different lengths, past the window, seeded
sampling, beams, and ``attnlm generate --json`` on a GGUF file. The models and cases are in
``tests/support_outputs.py``; how a backend is chosen is :func:`run_on_backend` alone.

A row that differs means the decoding runtime changed what it decodes. Greedy picks have a
top-1 / top-2 logit margin above 1e-3 at every step (the script asserts it), so rounding
differences between backends cannot explain a greedy difference.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from support import FIXTURES
from support_outputs import (
    Case,
    Row,
    asked_weights,
    environment,
    load_gguf,
    load_table,
    rows,
    run_case,
    run_cli,
    source,
)

BACKENDS = {"eager": "eager", "cstep": "c-step", "compiled": "compiled", "engine": "c-engine"}


def run_on_backend(name: str, model: object, case: Case) -> list | dict:
    """``case`` decoded by ``model`` (a PyTorch model, or the path of a GGUF file) on backend
    ``name`` (:mod:`attnlm.runtime`): ``eager`` (PyTorch), ``cstep`` (the C step inside the
    PyTorch model, the CPU default), ``compiled`` (``compile=True``, its prompt eager),
    ``engine`` (the C engine without PyTorch, GGUF files only). ``attnlm generate`` cases run
    the command with ``ATTNLM_NATIVE`` / ``ATTNLM_ENGINE`` steering the planner, and check
    that ``--json`` names the backend."""
    from attnlm.runtime.planner import runner_for

    env = {"ATTNLM_NATIVE": "0" if name in ("eager", "compiled") else "1",
           "ATTNLM_ENGINE": "1" if name == "engine" else "0"}  # fmt: skip
    with environment(env):
        if case.kind == "cli":
            said: list = []
            out = run_cli(model, case, said)
            assert said == [BACKENDS[name]], said
            return out
        if name == "engine":
            from attnlm.base.ggufio import GGUFFile
            from attnlm.generate import engine_decode
            from attnlm.runtime.engine_gguf import open_engine

            engine = open_engine(GGUFFile(model), asked_weights(model), 1)
            assert engine is not None, f"{model}: not a file the engine decodes"
            prompts = [list(p) for p in case.prompts]
            return engine_decode.decode(engine, prompts, case.sampling(), lookahead=case.lookahead)
        if isinstance(model, Path):
            model = load_gguf(model)
        if case.kind != "decode":  # translation: every family but gpt and llama is eager
            return run_case(model, case, compile=name == "compiled")
        runner = runner_for(model, backend=BACKENDS[name])
        assert runner.name == BACKENDS[name], runner.reason
        return run_case(model, case, runner=runner)


TABLE_PATH = FIXTURES / "outputs" / "decode_outputs.json"
ROWS = rows()


@functools.cache
def table() -> dict:
    return load_table(TABLE_PATH)


def _param(row: Row):
    marks = [pytest.mark.slow] if row.slow else []
    return pytest.param(row, id=row.key, marks=marks)


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def no_c():
    """Why the C step and the C engine are unavailable here (no C compiler, ...), or None."""
    from attnlm import native

    return None if native.library() is not None else native.why_not or "no C step"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_row_equals_the_table(row, gguf_dir, no_c):
    if row.needs_c and no_c:
        pytest.skip(f"the C step and the C engine are unavailable: {no_c}")
    assert row.key in table()["rows"], f"{row.key} is not in the table: run make_outputs.py"
    got = run_on_backend(row.backend, source(row, gguf_dir), row.case)
    assert got == table()["rows"][row.key]


def test_the_table_has_every_row_and_no_other():
    assert sorted(table()["rows"]) == sorted(r.key for r in ROWS)


def test_every_backend_gives_the_same_greedy_output():
    """Within one family, weights and greedy case, the table's rows of all backends agree
    (with the checks above, every backend gives these outputs today)."""
    groups: dict[str, dict[str, object]] = {}
    for row in ROWS:
        if row.case.greedy and row.case.kind != "beam":
            groups.setdefault(row.group, {})[row.backend] = table()["rows"][row.key]
    several = {g: by for g, by in groups.items() if len(by) > 1}
    assert len(several) >= 20
    for group, by in several.items():
        first = next(iter(by.values()))
        assert all(v == first for v in by.values()), (group, by)


def test_the_greedy_margins_were_clear():
    margins = table()["margins"]
    assert margins and min(margins.values()) > 1e-3
