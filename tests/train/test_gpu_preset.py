"""The GPU preset: nanoGPT's shakespeare_char recipe with bf16 autocast and torch.compile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnlm.models import registry
from attnlm.train.config import load_spec
from support import SRC

# nanoGPT config/train_shakespeare_char.py, written out by hand
NANOGPT = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "dropout": 0.2}
NANOGPT_TRAIN = {"batch_size": 64, "lr": 1e-3, "min_lr": 1e-4, "max_iters": 5000,
                 "warmup_iters": 100, "beta2": 0.99, "eval_interval": 250,
                 "eval_iters": 200}  # fmt: skip


def test_gpu_preset_is_nanogpts_recipe_with_bf16_and_compile():
    spec = load_spec("shakespeare-char-gpu")
    family, cfg = registry.make_config({**spec.model, "vocab_size": 65})
    assert family.type == "gpt"
    assert {k: getattr(cfg, k) for k in NANOGPT} == NANOGPT
    train = spec.train
    assert {k: getattr(train, k) for k in NANOGPT_TRAIN} == NANOGPT_TRAIN
    assert (train.dtype, train.compile, train.device) == ("bfloat16", True, "cuda")
    assert train.fused
    assert "shakespeare-char-gpu" in registry.presets_of("gpt")


@pytest.mark.slow
def test_bench_gpu_smoke_runs_on_the_cpu_and_writes_json(tmp_path):
    out = tmp_path / "gpu.json"
    script = SRC.parent / "benchmarks" / "bench_gpu.py"
    argv = [sys.executable, str(script), "--device", "cpu", "--smoke", "--json", str(out)]
    subprocess.run(argv + ["--preset-seconds", "2"], check=True, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())["rows"]
    assert {r["row"] for r in rows} == {"decode", "train", "preset"}
    assert {(r["batch"], r["path"]) for r in rows if r["row"] == "decode"} >= {
        (1, "ours_plain"), (1, "ours_compiled"), (16, "hf_dynamic")}  # fmt: skip
    assert all(r["step_ms"] > 0 for r in rows if r["row"] == "train")
