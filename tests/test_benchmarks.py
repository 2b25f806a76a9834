"""The benchmark harness (benchmarks/harness.py) on fake timings, and every benchmark script:
it imports, and its ``--quick`` sizes name real options. No benchmark is run here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCH.glob("bench_*.py"))


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCH))  # the scripts import harness (and each other) by name
    try:
        import harness as h

        yield h
    finally:
        sys.path.remove(str(BENCH))


def test_summarize_medians_and_ratios_by_hand(harness):
    S = harness.Sample
    runs = {
        "ours": [S(3.0, 1.0), S(1.0, 2.0), S(2.0, 9.0)],  # medians: wall 2.0, cpu 2.0
        "peer": [S(4.0, 8.0), S(8.0, 4.0), S(5.0, 5.0), S(100.0, 0.5)],  # wall 6.5, cpu 4.5
    }
    out = harness.summarize(runs, "ours", "peer")
    assert out["ours"] == {"wall_s": 2.0, "cpu_s": 2.0}
    assert out["peer"] == {"wall_s": 6.5, "cpu_s": 4.5}
    assert out["time_ratio_wall"] == pytest.approx(2.0 / 6.5)
    assert out["speedup_wall"] == pytest.approx(6.5 / 2.0)
    assert out["time_ratio_cpu"] == pytest.approx(2.0 / 4.5)
    assert out["speedup_cpu"] == pytest.approx(4.5 / 2.0)
    alone = harness.summarize({"ours": runs["ours"]}, "ours")
    assert "time_ratio_wall" not in alone and alone["runs"] == 3


def test_alternate_runs_ours_then_peer_each_round(harness):
    calls = []

    def make(name):
        def run():
            calls.append(name)
            return harness.Sample(len(calls), 0.0)

        return run

    runs = harness.alternate({"ours": make("ours"), "peer": make("peer")}, rounds=3)
    assert calls == ["ours", "peer"] * 3
    assert [s.wall for s in runs["ours"]] == [1, 3, 5]
    assert [s.wall for s in runs["peer"]] == [2, 4, 6]
    calls.clear()
    harness.alternate({"ours": make("ours"), "peer": make("peer")}, rounds=3, swap=True)
    assert calls == ["ours", "peer", "peer", "ours", "ours", "peer"]


def test_report_prints_one_json_line_per_result(harness, capsys):
    import json

    S = harness.Sample
    harness.report("demo", {"a": [S(1.0, 1.0)], "b": [S(4.0, 2.0)]}, "a", "b", "<= 2x", n=3)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(lines) == 1
    assert lines[0]["bench"] == "demo" and lines[0]["n"] == 3 and lines[0]["target"] == "<= 2x"
    assert lines[0]["time_ratio_wall"] == 0.25 and lines[0]["speedup_cpu"] == 2.0


def test_time_process_times_a_child_and_names_a_failure(harness, tmp_path):
    code = "import sys; sys.stdout.write(sys.stdin.read().upper())"
    (tmp_path / "in.txt").write_text("abc")
    s = harness.time_process(
        [sys.executable, "-c", code], stdin=tmp_path / "in.txt", stdout=tmp_path / "out.txt"
    )
    assert (tmp_path / "out.txt").read_text() == "ABC"
    assert s.wall > 0 and s.cpu >= 0
    with pytest.raises(RuntimeError, match="exit 1: boom"):
        harness.time_process([sys.executable, "-c", "import sys; sys.exit('boom') or 3"])
    with pytest.raises(RuntimeError, match="exit 3"):
        harness.time_process([sys.executable, "-c", "raise SystemExit(3)"])


def test_run_process_reports_the_childs_own_peak_rss(harness):
    """The peak RSS is each child's own: a child holding 200 MiB more than this process ever
    did reports at least that, a small one run after it less (getrusage(RUSAGE_CHILDREN)
    would keep the larger). A forked child starts from this process's RSS, hence the
    margin."""
    import resource

    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # MiB
    size = (mine + 200) * 2**20
    big = f"b = bytearray({size}); b[::4096] = b'x' * len(b[::4096]); print('big', len(b))"
    run = harness.run_process([sys.executable, "-c", big])
    assert run.stdout.strip() == f"big {size}"
    assert run.peak_rss_mib >= mine + 200 and run.sample.wall > 0
    small = harness.run_process([sys.executable, "-c", "print('small')"])
    assert small.stdout.strip() == "small" and small.peak_rss_mib < mine + 100
    with pytest.raises(RuntimeError, match="exit 1: boom"):
        harness.run_process([sys.executable, "-c", "import sys; sys.exit('boom')"])


def test_quick_from_flag_or_environment(harness, monkeypatch):
    import argparse

    monkeypatch.delenv(harness.QUICK_ENV, raising=False)
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    assert harness.parse(ap, quick={"rounds": 1}, argv=[]).rounds == 7
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    assert harness.parse(ap, quick={"rounds": 1}, argv=["--quick"]).rounds == 1
    monkeypatch.setenv(harness.QUICK_ENV, "1")
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = harness.parse(ap, quick={"rounds": 1}, argv=["--rounds", "4"])
    assert args.quick and args.rounds == 4  # the command line wins over the quick size


def test_require_skips_a_missing_peer_with_a_line(harness, capsys):
    assert harness.require("demo", "sys")
    assert not harness.require("demo", "no_such_peer_module_xyz")
    assert "skipping no_such_peer_module_xyz" in capsys.readouterr().out


class _Stop(Exception):
    pass


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_imports_and_has_a_quick_mode(harness, script, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports without running (main is behind __main__)
    assert callable(getattr(module, "main", None)), f"{script.name}: no main()"
    seen = {}
    real_parse = harness.parse

    def parse(ap, quick=None, argv=None):  # check the quick sizes, then stop before any work
        dests = {a.dest for a in ap._actions}
        unknown = set(quick or {}) - dests
        assert not unknown, f"{script.name}: --quick sets unknown options {unknown}"
        seen["args"] = real_parse(ap, quick, argv=["--quick"])
        raise _Stop

    monkeypatch.setattr(harness, "parse", parse)
    monkeypatch.setattr(sys, "argv", [str(script), "--quick"])
    with pytest.raises(_Stop):
        module.main()
    assert seen["args"].quick


def test_bench_quick_target_runs_every_script_quick():
    make = (BENCH.parent / "Makefile").read_text()
    assert "bench-quick:" in make and "--quick" in make and "benchmarks/bench_*.py" in make
    out = subprocess.run(
        ["make", "-n", "-f", str(BENCH.parent / "Makefile"), "bench-quick", "VENV_OK="],
        capture_output=True,
        text=True,
        cwd=BENCH.parent,
    )
    assert out.returncode == 0 and "ATTNLM_BENCH_QUICK=1" in out.stdout
