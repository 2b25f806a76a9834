"""The C step on every CPU and compiler a user may have (docs/reliability.md, "CPU matrix"):
built for the baseline x86-64-v2 as well as for this CPU, it gives the forward's logits; a
compiler without OpenMP (Apple's clang, simulated by a ``cc`` that rejects ``-fopenmp``) builds
it on POSIX threads, silently, with the OpenMP build's numbers; no compiler at all, or a
build that fails, takes PyTorch's path with one line saying why. The whole equivalence suite
under x86-64-v2 is a run of .ci/run. The tests that build the step for another CPU or compiler
(half a minute each on 2 cores) are marked ``slow``: .ci/run runs them after ``make test``."""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

import support_runtime
from attnlm import native
from attnlm.nn.cache import KVCache
from attnlm.runtime import cstep as ns
from attnlm.runtime.planner import runner_for

V = 300
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
REAL_CC = native._compiler()
needs_cc = pytest.mark.skipif(REAL_CC is None, reason="no C compiler (cc)")
#: a build of its own (another CPU, another compiler): not in make test, run by .ci/run
own_build = pytest.mark.slow


@pytest.fixture()
def fresh(monkeypatch, tmp_path):
    """A process that has not tried the library yet, with its own cache folder (so each build
    here is a real one); the module's state comes back afterwards."""
    for name, value in (("_TRIED", False), ("_LIBRARY", None), ("why_not", ""),
                        ("built", None)):  # fmt: skip
        monkeypatch.setattr(native, name, value)
    monkeypatch.setattr(ns, "_NOTED", [False])
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNLM_NATIVE", "1")
    for name in ("CC", native.MARCH_ENV, native.CFLAGS_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def fake_cc(folder, body: str) -> str:
    """A ``cc`` script: ``body`` (shell) runs first, then the real compiler; every call is
    logged to ``calls`` beside it."""
    path = folder / "cc"
    log = folder / "calls"
    path.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n{body}\nexec {REAL_CC} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# Apple's clang without libomp: every command line with -fopenmp is refused
CLANG_WITHOUT_OPENMP = """for a in "$@"; do case "$a" in -fopenmp*)
  echo "clang: error: unsupported option '-fopenmp'" >&2; exit 1;; esac; done"""


def calls(folder) -> list[str]:
    log = folder / "calls"
    return log.read_text().splitlines() if log.exists() else []


def c_equals_forward(fmt: str) -> None:
    """A GQA llama in ``fmt`` through the C step: a prompt, then single tokens, each within
    1e-4 of the float32 forward holding the same weights."""
    model, reference = support_runtime.with_reference(
        support_runtime.llama(V, n_head=6, n_kv_head=2, n_embd=96, d_ff=160), fmt
    )
    torch.manual_seed(5)
    ids = torch.randint(V, (2, 9))
    feeds = [ids[:, :2], *(ids[:, t : t + 1] for t in range(2, 9))]
    with torch.inference_mode():
        runner, ref, ours = ns.CStepRunner(model), KVCache(2), KVCache(2)
        for x in feeds:
            assert runner.covers(x, ours)
            want = reference(x, cache=ref).logits
            torch.testing.assert_close(runner.step(x, ours), want, atol=1e-4, rtol=1e-4)


@needs_cc
@own_build
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86-64 target")
def test_the_baseline_x86_64_v2_build_gives_the_forwards_logits(fresh, monkeypatch, capsys):
    monkeypatch.setenv(native.MARCH_ENV, "x86-64-v2")
    assert native.library() is not None, native.why_not
    assert native.built.name.startswith("decode_step-x86-64-v2-"), native.built
    assert "-march=x86-64-v2" in native.build_flags()
    assert native.features() == {"openmp"}  # no FMA, F16C, AVX2 or AVX-512 in the baseline
    for fmt in ("q4", "q8", "f32"):
        c_equals_forward(fmt)
    monkeypatch.delenv(native.MARCH_ENV)  # this CPU's build: a file of its own
    mine = native._cached(REAL_CC, native.build_flags())
    assert mine.name.startswith("decode_step-native-") and mine.parent == native.built.parent
    assert capsys.readouterr().err == ""


#: fixtures of tests/fixtures/gguf_arch/ (llama.cpp's logits, recorded) that take every
#: product kind of the C step: Q4_K's repacked rows and Q6_K (Q4_K_M), Q5_K and Q8_0's pairs of
#: rows, Q4_0's repacked rows, Q5_0 (Gemma 3's rows of 640: Q4_K_M falls back), Gemma 3's
#: attention of 4 heads of 256 per key/value head
AVX2_FIXTURES = (("qwen2", "Q4_K_M"), ("llama", "Q5_K_M"), ("phi3", "Q8_0"), ("llama", "Q4_0"),
                 ("gemma3", "Q4_K_M"), ("gemma3-gqa4", "Q8_0"))  # fmt: skip


@needs_cc
@own_build
@pytest.mark.skipif(
    not {"avx2", "fma", "f16c"} <= set(native._cpu_flags().split()),
    reason="a CPU with AVX2, FMA and F16C to run an x86-64-v3 build",
)
def test_the_avx2_build_gives_llama_cpps_logits(fresh, monkeypatch):
    """Built for x86-64-v3 (AVX2, FMA and F16C without AVX-512: most laptops), the C step's
    8-lane kernels give llama.cpp's logits on the fixtures as the AVX-512 build does: every
    prompt position within 1e-5 of llama.cpp's logit range (its recorded 4 decimals)."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.runtime.engine_gguf import open_engine

    monkeypatch.setenv(native.MARCH_ENV, "x86-64-v3")
    monkeypatch.delenv("ATTNLM_GGML_ACTIVATIONS", raising=False)
    assert native.library() is not None, native.why_not
    assert {"avx2", "fma", "f16c"} <= native.features() and "avx512f" not in native.features()
    doc = json.loads((FIXTURES / "llamacpp.json").read_text(encoding="utf-8"))
    for arch, kind in AVX2_FIXTURES:
        rec = doc["archs"][arch][kind]
        engine = open_engine(GGUFFile(FIXTURES / f"{arch}-{kind}.gguf"), None, 2)
        engine.reset(1)
        got = engine.feed(np.asarray([rec["prompt"]]))[0]
        want = np.asarray(rec["logits"], dtype=np.float32)
        off = np.abs(got - want).max() / (want.max() - want.min())
        assert off < 1e-5, f"{arch} {kind}: {off:.2e} of the logit range"


def _engine_logits(threads: int) -> np.ndarray:
    """A Gemma 3 fixture's prompt logits through the C engine on ``threads`` threads (every
    product kind and a final soft-cap: barriers between all of them)."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.runtime.engine_gguf import open_engine

    rec = json.loads((FIXTURES / "llamacpp.json").read_text(encoding="utf-8"))
    engine = open_engine(GGUFFile(FIXTURES / "gemma3-Q4_K_M.gguf"), None, threads)
    engine.reset(1)
    return engine.feed(np.asarray([rec["archs"]["gemma3"]["Q4_K_M"]["prompt"]]))[0]


@needs_cc
@own_build
def test_a_compiler_without_openmp_builds_on_posix_threads(fresh, monkeypatch, capsys):
    assert native.library() is not None and "openmp" in native.features(), native.why_not
    with_omp = {n: _engine_logits(n) for n in (1, 2, 3)}  # 3: more threads than these cores
    native._TRIED = False
    cc = fake_cc(fresh, CLANG_WITHOUT_OPENMP)
    monkeypatch.setenv("CC", cc)
    assert native.library() is not None, native.why_not
    assert native.library() is not None  # once per process: no second build
    assert len(calls(fresh)) == 2 and "-fopenmp" not in calls(fresh)[1]
    assert "-pthread" in calls(fresh)[1].split()
    assert native.built.name.startswith("decode_step-native-pt-")
    assert "openmp" not in native.features()
    for n, want in with_omp.items():  # the same shares of the work: the same numbers
        np.testing.assert_array_equal(_engine_logits(n), want)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the step on 2 threads through PyTorch's glue
    try:
        c_equals_forward("q4")
        c_equals_forward("f32")
    finally:
        torch.set_num_threads(threads)
    assert capsys.readouterr().err == ""  # nothing is lost: nothing to say
    # the next process finds the POSIX-threads build without trying OpenMP again
    native._TRIED = False
    assert native.library() is not None and len(calls(fresh)) == 2


def eager_with_one_line(capsys, why: str) -> None:
    """Decoding takes the PyTorch path, says ``why`` once, and gives the forward's logits."""
    model = support_runtime.llama(V, n_head=6, n_embd=96, d_ff=160)
    ids = torch.randint(V, (1, 5))
    with torch.inference_mode():
        first, second = runner_for(model), runner_for(model)
        assert first.name == second.name == "eager" and why in first.reason
        got = first.step(ids, KVCache(2))
        torch.testing.assert_close(got, model(ids).logits)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and why in err[0] and err[0].endswith("the slower eager path"), err


def test_no_compiler_on_the_path_says_so_and_takes_pytorch(fresh, monkeypatch, capsys):
    (fresh / "bin").mkdir()
    monkeypatch.setenv("PATH", str(fresh / "bin"))
    assert shutil.which("cc") is None
    eager_with_one_line(capsys, "no C compiler found")


def test_cc_naming_a_missing_program_says_so_and_takes_pytorch(fresh, monkeypatch, capsys):
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    eager_with_one_line(capsys, "CC names")
    assert "no-such-cc" in native.why_not


@needs_cc
def test_a_build_that_fails_says_the_compilers_error_and_takes_pytorch(fresh, monkeypatch,
                                                                       capsys):  # fmt: skip
    """A compiler that fails with and without OpenMP: its first error line, no one-thread
    build in the cache."""
    cc = fake_cc(fresh, 'echo "decode_step.c:1:1: error: this compiler is broken" >&2; exit 1')
    monkeypatch.setenv("CC", cc)
    eager_with_one_line(capsys, "could not be built: cc failed: decode_step.c:1:1: error: this")
    assert len(calls(fresh)) == 2
    assert not list((fresh / "cache" / "native").glob("*.so"))


@needs_cc
def test_an_unknown_target_cpu_says_so_and_takes_pytorch(fresh, monkeypatch, capsys):
    monkeypatch.setenv(native.MARCH_ENV, "no-such-cpu")
    eager_with_one_line(capsys, "could not be built")
    assert "no-such-cpu" in native.why_not


@needs_cc
def test_this_cpus_build_has_the_instructions_the_cpu_lists():
    """``native.features()`` reads the build's own macros: a native build on a CPU listing FMA,
    F16C, AVX2 and AVX-512F in /proc/cpuinfo has them all (the build every other test uses,
    cached: none of its own)."""
    cpu = set(native._cpu_flags().split())
    if platform.machine() not in ("x86_64", "AMD64") or not cpu:
        pytest.skip("an x86-64 CPU's flags to compare with")
    if any(os.environ.get(v) for v in ("CC", native.MARCH_ENV, native.CFLAGS_ENV)):
        pytest.skip("this run builds the step for another CPU or with other flags")
    assert native.library() is not None, native.why_not
    want = {name for name in ("fma", "f16c", "avx2", "avx512f") if name in cpu}
    assert want and want <= native.features(), (want, native.features())


def test_the_build_key_covers_every_header_the_source_includes():
    """A header left out of ``native.HEADERS`` would leave stale cached builds in use after
    it changes: every ``#include "..."`` of the sources is in it, and nothing else."""
    import re

    included = set()
    for path in (native.SOURCE, *native.HEADERS):
        included |= set(re.findall(r'#include "([^"]+)"', path.read_text(encoding="utf-8")))
    assert included == {h.name for h in native.HEADERS}
    assert all(h.is_file() for h in native.HEADERS)
