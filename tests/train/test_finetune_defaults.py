"""Fine-tuning defaults per machine class (``attnlm.train.defaults``) and the time budget that
reserves the final evaluation and save (``attnlm.train.budget``): the class decided from
hand-written flags, capabilities and oneDNN caps; the table a bare ``--lora`` takes; the
run's first lines saying what was chosen; ``--show-defaults``; held-out bits/char before and
after; and a budgeted run that ends within its budget, the final evaluation and save included."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from attnlm.train import budget as budget_module
from attnlm.train import defaults
from attnlm.train.budget import Budget, estimated_save_s
from support import attnlm_process, run_cli
from support_lora import TEXT, make_base

pytestmark = pytest.mark.usefixtures("one_thread")
SPR = {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}  # a Sapphire Rapids


@pytest.mark.parametrize(
    "flags, capability, isa, bf16, want",
    [
        (SPR, "AVX512", "", True, "cpu-amx"),
        (SPR, "AVX512", "AVX512_CORE_BF16", True, "cpu-avx512-bf16"),  # AMX capped off
        (SPR, "AVX512", "AVX512_CORE", True, "cpu-avx512"),  # the simulated Xeon
        (SPR, "AVX2", "AVX2", True, "cpu-avx2"),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX512", "", True, "cpu-avx512-bf16"),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX512", "", False, "cpu-avx512"),  # not run
        ({"avx2", "avx512f"}, "AVX512", "", False, "cpu-avx512"),
        ({"avx2"}, "AVX2", "", False, "cpu-avx2"),
        (set(), "DEFAULT", "", False, "cpu"),
    ],
)
def test_machine_class_from_flags_capability_and_caps(flags, capability, isa, bf16, want):
    got = defaults.cpu_class(flags, capability, isa, bf16)
    assert got.name == want
    assert capability in got.why and (isa in got.why)


def test_every_class_has_both_recipes_and_a_bare_lora_takes_the_rank():
    for name in defaults.CLASSES:
        for kind in defaults.KINDS:
            r = defaults.recipe(name, kind)
            assert r.lr > 0 and r.block_size > 0 and r.batch_size > 0
            assert (r.rank > 0) == (kind == "lora")
    table = defaults.chosen_train_table("cpu-avx512", -1)
    lora = defaults.recipe("cpu-avx512", "lora")
    assert table["lora"] == lora.rank and table["lora_targets"] == lora.targets
    assert table["lr"] == lora.lr and "block_size" not in table  # the window caps in start_from
    assert "lora" not in defaults.chosen_train_table("cpu-avx512", None)


def test_budget_reserves_measured_evaluation_and_save():
    b = Budget(100.0, time.perf_counter(), eval_iters=10, micro=2)
    b.save_estimate = estimated_save_s(25_000_000)  # 25M float32 values + AdamW: 300 MB
    assert b.save_estimate == pytest.approx(0.5 + 1.5)
    b.took_step(4.0)
    # estimated from the step; the save's estimate and the loss curve's 0.5 s
    assert b.reserve() == pytest.approx(4.0 * 10 / 2 / 2 + 2.0 + 0.5)
    b.eval_s, b.save_s = 7.0, 1.0
    assert b.reserve() == 8.5 and b.loop_seconds() == 91.5
    b.origin = time.perf_counter() - 90.0  # 90 s spent: the next step (4 s) would end past it
    assert b.fraction() == 1.0
    b.origin = time.perf_counter() - 50.0
    assert b.fraction() == pytest.approx(54.0 / 91.5, abs=0.01)  # the next step counted
    assert Budget(None, 0.0).fraction() == 0.0


def test_process_seconds_count_from_the_process_start(monkeypatch):
    """What ``attnlm train`` adds to its budget's clock: the seconds since its process started
    (a fresh interpreter that slept 1 s says about 1 s, not 0), and a run's clock starts there
    once counted."""
    code = "import time; time.sleep(1); import attnlm.train.budget as b; print(b.process_seconds())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 1.0 <= float(out.stdout) < 30.0
    monkeypatch.setattr(budget_module, "PROCESS_ORIGIN", None)
    assert abs(budget_module.run_origin() - time.perf_counter()) < 1.0  # not counted: now
    budget_module.count_from_process_start()
    assert budget_module.run_origin() <= time.perf_counter() - budget_module.process_seconds() + 0.1


def test_show_defaults_prints_the_table_with_this_machine_marked(capsys):
    got = run_cli(capsys, "train", "--show-defaults")
    assert got.code == 0, got.err
    lines = got.out.splitlines()
    assert lines[0].startswith("machine class: ")
    marked = [line for line in lines if line.startswith("*")]
    here = lines[0].split()[2]
    assert len(marked) == 2 and all(here in line for line in marked)
    assert len(lines) == 1 + 2 * len(defaults.CLASSES) and "UNMEASURED" in got.out


def test_bare_lora_run_says_its_defaults_and_bits_per_char_before_and_after(tmp_path, capsys):
    base = make_base(tmp_path)
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 60, encoding="utf-8")
    run = tmp_path / "run"
    got = run_cli(capsys, "train", "--init-from", base, "--lora", "--text", text, "--out", run,
                  "--max-iters", "6", "--eval-iters", "2", "--batch-size", "2", "--lr", "1e-2",
                  "--no-progress")  # fmt: skip
    assert got.code == 0, got.err
    lines = got.out.splitlines()
    assert lines[0].startswith("defaults: machine class cpu")
    lora = defaults.recipe(defaults.machine_class("cpu").name, "lora")
    assert lines[1].startswith("defaults: lora fine-tuning recipe")
    assert f"({lora.measured}): {lora.summary()}" in lines[1]
    assert lines[2] == "defaults: given instead: batch_size 2, eval_iters 2, lr 0.01"
    config = json.loads((run / "checkpoint" / "config.json").read_text())
    assert config["lora"]["r"] == lora.rank and config["train"]["block_size"] == 64  # context
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], [r for r in records if "val_bpc" in r][-1]
    assert first["step"] == 0 and "val_bpc" in first and last["step"] == 6
    before = next(x for x in lines if x.startswith("before training:"))
    assert f"{first['val_bpc']:.4f} bits/char" in before
    summary = f"held-out bits/char: {first['val_bpc']:.4f} before, {last['val_bpc']:.4f} after"
    assert summary in got.out and (run / "loss_curve.png").is_file()


@pytest.mark.parametrize(
    "how", ["in-process", pytest.param("whole process", marks=pytest.mark.slow)]
)  # (the command in a process of its own, its imports counted: 16 s, in the full suite)
def test_time_budget_includes_the_final_evaluation_and_save(tmp_path, capsys, how):
    """A fine-tune whose evaluation takes a large share of its budget (hundreds of evaluation
    batches) ends within the budget: the loop stops early enough for the final evaluation,
    save and loss curve, whose time the evaluation before training measured. As a command
    (``python -m attnlm train``, timed from before its process starts), its imports count too.
    (Skipped when the machine is so loaded that one evaluation takes over a third of the
    budget.)"""
    import re

    base = make_base(tmp_path)
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 200, encoding="utf-8")
    budget = 6.0
    args = ["train", "--init-from", base, "--lora", "4", "--text", text, "--out",
            tmp_path / "run", "--max-iters", "1000000", "--time-budget", f"{budget:g}s",
            "--eval-iters", "500", "--eval-interval", "1000000", "--batch-size", "4",
            "--no-progress"]  # fmt: skip
    t = time.perf_counter()
    if how == "in-process":
        got = run_cli(capsys, *args)
        code, out, err = got.code, got.out, got.err
    else:
        done = attnlm_process(*args, "--threads", "1", timeout=120)
        code, out, err = done.returncode, done.stdout, done.stderr
    wall = time.perf_counter() - t
    assert code == 0, err
    assert "time_budget" in out and "reserved for the final evaluation (measured)" in out
    evaluation = float(re.search(r"before training: .*\((\d+\.\d) s\)", out).group(1))
    if evaluation > budget / 3:
        pytest.skip(f"one evaluation took {evaluation} s of a {budget:g} s budget (loaded)")
    # the last record is the final evaluation; its elapsed is taken after the save
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] > 1 and "val_loss" in records[-1]
    # without the reserve the run would take the budget plus one evaluation; allow a tenth of
    # the budget for the process's own end (and, in-process, what the command did not count)
    assert wall < budget * 1.1 + 0.5, out
