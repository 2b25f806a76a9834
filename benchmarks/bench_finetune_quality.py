"""Fine-tuning quality at equal wall-clock: attnlm's default ``--lora`` against peft's documented
recipe, both given the same seconds on the same Shakespeare, scored on a later slice.

Final run (a quiet machine; about 2 x 300 s of training plus four evaluations of a
135M model on 20,000 characters and an export, ~15 minutes on 2 cores)::

    .venv/bin/python benchmarks/bench_finetune_quality.py --seconds 300 --threads 2
    .venv/bin/python benchmarks/bench_finetune_quality.py --seconds 300 --simulate avx512
    .venv/bin/python benchmarks/bench_finetune_quality.py --quick   # a 20 s smoke run

``--full`` measures the other row of the defaults (``attnlm train`` without ``--lora``; with
``--skip-peft``, as peft has no full-fine-tuning recipe here).

Data: the built-in Shakespeare (``attnlm.data.corpus.load_text``, the plays as one text):
the last ``--val-chars`` characters are the held-out slice, the ``--train-chars`` before it
the training text (2 MB as in the issue). Nothing of the slice is trained on.

Contenders, each one whole process with ``--seconds`` of wall-clock from its start to its
saved result, its own evaluation included:

* ``attnlm``: ``attnlm train --init-from smollm2-135m-instruct --text train.txt --lora
  --time-budget S`` and nothing else: this machine class's defaults (``attnlm train
  --show-defaults``); its first lines, which say the class and recipe, are kept in the output
  (``--attnlm-flags "..."`` adds flags: a candidate recipe measured before it goes into
  ``attnlm/train/defaults.py``);
* ``peft``: transformers + peft on the same base (``attnlm export --out``: the GGUF file's
  weights dequantized to float32, the same numbers attnlm trains) with peft's documented
  recipe: ``LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj",
  "v_proj"])``, ``torch.optim.AdamW(lr=2e-4)`` at a constant rate, random windows of the
  training text (``--peft-batch`` x ``--peft-seq`` tokens, attnlm's pre-table values); it
  evaluates itself on its own validation split (the last tenth of the training text, as attnlm
  holds out) before training to know how long that takes, trains until the seconds left cover
  that evaluation and the adapter's save, then evaluates and saves (this script's
  ``--peft-worker`` mode).

Scores: ``attnlm eval --model BASE --model RUN ... --text val.txt --json`` (one command, the
models side by side): bits per character on the held-out slice, for the base (GGUF), the
exported base (peft's starting point: the same weights, its own tokenizer files), the attnlm
run and peft's merged model. Each contender's change is against its own starting point.

``--simulate avx512`` / ``avx2`` restricts oneDNN and PyTorch as the issue's 2-core Xeon
(``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: AVX-512F without bfloat16 or AMX; ``AVX2`` adds
``ATEN_CPU_CAPABILITY=avx2``) for both contenders.

Target (issue 49): attnlm's change <= -3% and below peft's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: JSON lines, machine header

os.environ.setdefault("TQDM_DISABLE", "1")
NAME = "smollm2-135m-instruct"


def run(cmd: list[str], env: dict[str, str]) -> tuple[str, float]:
    """Run ``cmd`` as a whole process; its stdout and wall seconds (one line if it failed)."""
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, **env})  # fmt: skip
    wall = time.perf_counter() - t
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{' '.join(cmd[2:5])} ... failed: {last}")
    return done.stdout, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--seconds",
        type=float,
        default=300.0,
        help="wall-clock per contender, its evaluation and save included",
    )
    ap.add_argument("--val-chars", type=int, default=20_000)
    ap.add_argument("--train-chars", type=int, default=2_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--peft-batch", type=int, default=8)
    ap.add_argument("--peft-seq", type=int, default=256)
    harness.add_simulate_argument(ap)
    ap.add_argument("--skip-peft", action="store_true", help="the attnlm row only")
    ap.add_argument("--full", action="store_true", help="attnlm's full fine-tuning (no --lora)")
    ap.add_argument("--attnlm-flags", default="",
                    help="more `attnlm train` flags, to measure a candidate recipe before it "
                    'goes into the table, e.g. "--lora-targets all --lr 1e-3"')  # fmt: skip
    ap.add_argument("--peft-worker", default=None, help=argparse.SUPPRESS)  # JSON settings
    args = harness.parse(ap, quick={"seconds": 20.0, "val_chars": 2000, "train_chars": 100_000,
                                    "eval_batch": 1, "peft_batch": 2})  # fmt: skip
    if args.peft_worker:
        return peft_worker(json.loads(args.peft_worker))
    env = {**harness.SIMULATE[args.simulate], "OMP_NUM_THREADS": str(args.threads)}
    harness.header("finetune_quality", seconds=args.seconds, threads=args.threads,
                   simulate=args.simulate)  # fmt: skip
    from attnlm.data.corpus import load_text

    text = load_text(None)
    val = text[-args.val_chars :]
    train = text[-(args.val_chars + args.train_chars) : -args.val_chars]
    with tempfile.TemporaryDirectory(prefix="attnlm-ftq-") as tmp:
        work = Path(tmp)
        (work / "train.txt").write_text(train, encoding="utf-8")
        (work / "val.txt").write_text(val, encoding="utf-8")
        attnlm = harness.attnlm_command
        run(attnlm("export", "--model", NAME, "--out", str(work / "base-hf")), env)
        out, wall = run(attnlm("train", "--init-from", NAME, "--text", str(work / "train.txt"),
                               *(() if args.full else ("--lora",)),
                               "--time-budget", f"{args.seconds:g}s", "--out",
                               str(work / "attnlm"), "--threads", str(args.threads),
                               "--no-progress", *shlex.split(args.attnlm_flags)), env)  # fmt: skip
        said = [line for line in out.splitlines() if line.startswith(("defaults:", "held-out"))]
        walls, steps = {"attnlm": wall}, {"attnlm": _step(work / "attnlm")}
        models = [NAME, str(work / "base-hf"), str(work / "attnlm")]
        if not args.skip_peft and harness.require("finetune_quality", "peft", "transformers"):
            settings = {"base": str(work / "base-hf"), "train": str(work / "train.txt"),
                        "out": str(work / "peft"), "seconds": args.seconds,
                        "threads": args.threads, "batch": args.peft_batch,
                        "seq": args.peft_seq}  # fmt: skip
            worker = [sys.executable, __file__, "--peft-worker", json.dumps(settings)]
            out, walls["peft"] = run(worker, env)
            steps["peft"] = json.loads(out.strip().splitlines()[-1])["steps"]
            models.append(str(work / "peft" / "merged"))
        cmd = ["eval"] + [a for m in models for a in ("--model", m)]
        cmd += ["--text", str(work / "val.txt"), "--json", "--threads", str(args.threads)]
        out, _ = run(attnlm(*cmd, "--batch-size", str(args.eval_batch)), env)
        bpc = [r["bpc"] for r in json.loads(out)["results"]]
    rows = {"base": bpc[0], "base (exported)": bpc[1],
            "attnlm full" if args.full else "attnlm --lora": bpc[2]}  # fmt: skip
    change = {"attnlm": 100 * (bpc[2] - bpc[0]) / bpc[0]}
    if len(bpc) > 3:
        rows["peft r8 q,v"] = bpc[3]
        change["peft"] = 100 * (bpc[3] - bpc[1]) / bpc[1]
    for line in said:
        print(f"  attnlm said: {line}")
    for name, value in rows.items():
        print(f"  {name:<20} {value:.4f} bits/char")
    for name, value in change.items():
        print(f"  {name:<20} {value:+.2f}% in {walls[name]:.0f} s wall, {steps[name]} steps")
    harness.emit({"bench": "finetune_quality", "bpc": rows, "change_percent": change,
                  "wall_s": walls, "steps": steps, "seconds": args.seconds,
                  "simulate": args.simulate, "val_chars": len(val), "train_chars": len(train),
                  "attnlm_said": said, "attnlm_flags": args.attnlm_flags, "full": args.full,
                  "target": "attnlm change <= -3% and below peft's"})  # fmt: skip


def _step(run_dir: Path) -> int:
    return int(json.loads((run_dir / "checkpoint" / "config.json").read_text())["step"])


def peft_worker(s: dict) -> None:
    """peft's recipe in this process (see the module docstring); prints one JSON line."""
    t0 = time.perf_counter()  # the budget starts with the process's work
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(s["threads"])
    torch.manual_seed(0)
    tok = transformers.AutoTokenizer.from_pretrained(s["base"])
    model = transformers.AutoModelForCausalLM.from_pretrained(s["base"], dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "v_proj"])  # fmt: skip
    model = get_peft_model(model, config)
    text = Path(s["train"]).read_text(encoding="utf-8")
    cut = int(len(text) * 0.9)
    train = torch.tensor(tok(text[:cut])["input_ids"])
    held = torch.tensor(tok(text[cut:])["input_ids"])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    gen = torch.Generator().manual_seed(0)
    B, T = s["batch"], s["seq"]

    def batch(ids: torch.Tensor) -> torch.Tensor:
        starts = torch.randint(len(ids) - T - 1, (B,), generator=gen)
        return torch.stack([ids[i : i + T] for i in starts.tolist()])

    eval_gen_state = torch.Generator().manual_seed(1).get_state()

    def evaluate() -> float:
        gen_state = gen.get_state()
        gen.set_state(eval_gen_state)
        model.eval()
        with torch.no_grad():
            losses = [
                float(model(input_ids=x, labels=x).loss) for x in (batch(held) for _ in range(10))
            ]
        model.train()
        gen.set_state(gen_state)
        return sum(losses) / len(losses)

    t = time.perf_counter()
    before = evaluate()
    reserve = (time.perf_counter() - t) + 1.0  # the final evaluation and the adapter's save
    steps, step_s = 0, 0.0
    while time.perf_counter() - t0 + step_s / 2 + reserve < s["seconds"] or steps == 0:
        ts = time.perf_counter()
        x = batch(train)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        step_s = time.perf_counter() - ts
    after = evaluate()
    out = Path(s["out"])
    model.save_pretrained(out / "adapter")
    wall = time.perf_counter() - t0
    merged = model.merge_and_unload()  # for scoring by attnlm eval (after the clock)
    merged.save_pretrained(out / "merged")
    for f in Path(s["base"]).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(f, out / "merged" / f.name)
    print(json.dumps({"steps": steps, "wall_s": wall, "val_loss_before": before,
                      "val_loss_after": after}))  # fmt: skip


if __name__ == "__main__":
    main()
