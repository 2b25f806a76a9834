"""Five minutes of LoRA fine-tuning on a text the model has not seen: SmolLM2-135M on the
built-in Shakespeare, against the base model and a from-scratch ``llama`` trained as long.

Final run (quiet machine; about 15 minutes on 2 cores: two 300 s trainings, three
evaluations of SmolLM2-sized models on 20,000 characters)::

    .venv/bin/python benchmarks/bench_finetune_shakespeare.py --budget 300
    .venv/bin/python benchmarks/bench_finetune_shakespeare.py --quick   # checks it runs (~3 min)

Validation text: the last ``--val-chars`` characters of the built-in corpus; nothing of it is
trained on. Every row is what a user runs: ``attnlm train`` for ``--budget`` seconds
(``--time-budget``) on the text before it, then ``attnlm eval --model ... --text val.txt``
(bits per character over the whole text, in windows of the model's context):

* ``smollm2 base``: the GGUF dequantized to float32, as it is;
* ``smollm2 + LoRA``: ``--init-from smollm2-135m-instruct --lora R --lora-targets all``
  (alpha 2R, lr ``--lr``, batch ``--batch`` windows of ``--seq`` tokens), once per
  ``--backward-precision`` value (``float32 bfloat16``: both, the same text and time);
* ``llama from scratch``: ``--preset llama-char`` on the same text for the same time.

Target (issue of record): the fine-tuned model clearly below the base and below the
from-scratch model. Run: ``.venv/bin/python benchmarks/bench_finetune_shakespeare.py
[--budget 300] [--threads 2]``; ``--quick`` checks that it runs (seconds of training).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import harness  # benchmarks/harness.py: JSON lines, machine header

os.environ.setdefault("TQDM_DISABLE", "1")
NAME = "smollm2-135m-instruct"


def attnlm(*args: object) -> str:
    """Run ``attnlm ARGS`` as a user does; its stdout (one line naming the failure if any)."""
    cmd = harness.attnlm_command(*(str(a) for a in args))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{' '.join(cmd[2:5])} ... failed: {last}")
    return done.stdout


def bpc(model: object, val: Path, args: argparse.Namespace) -> float:
    """``attnlm eval --model MODEL --text VAL``: bits per character of the whole text."""
    out = attnlm("eval", "--model", model, "--text", val, "--json", "--threads", args.threads,
                 "--batch-size", args.eval_batch)  # fmt: skip
    return float(json.loads(out.strip().splitlines()[-1])["bpc"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=300.0, help="training seconds per model")
    ap.add_argument("--val-chars", type=int, default=20_000)
    ap.add_argument("--train-chars", type=int, default=0,
                    help="the last N characters before the validation (0: all)")  # fmt: skip
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backward-precision", nargs="+", default=["float32"],
                    choices=["float32", "bfloat16"],
                    help="one LoRA row per value (attnlm train --backward-precision)")  # fmt: skip
    args = harness.parse(
        ap, quick={"budget": 3.0, "val_chars": 600, "train_chars": 20_000, "seq": 32,
                   "batch": 1, "rank": 2, "eval_batch": 1},
    )  # fmt: skip
    harness.set_threads(args.threads)
    harness.header("finetune_shakespeare", budget_s=args.budget, threads=args.threads)

    from attnlm.data.corpus import load_text

    text = load_text(None)
    val, train = text[-args.val_chars :], text[: -args.val_chars]
    if args.train_chars:
        train = train[-args.train_chars :]  # the text just before the validation
    budget = f"{args.budget:g}s"
    common = ["--time-budget", budget, "--max-iters", 1_000_000, "--eval-interval",
              1_000_000, "--eval-iters", 2, "--threads", args.threads, "--seed", 0,
              "--no-progress"]  # fmt: skip
    rows: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="attnlm-shakespeare-") as tmp:
        work = Path(tmp)
        (work / "train.txt").write_text(train, encoding="utf-8")
        (work / "val.txt").write_text(val, encoding="utf-8")
        rows["smollm2 base"] = bpc(NAME, work / "val.txt", args)
        runs = []  # the LoRA run folders
        for precision in args.backward_precision:
            name = "lora" if precision == "float32" else f"lora-{precision}-backward"
            attnlm("train", "--init-from", NAME, "--text", work / "train.txt", "--out",
                   work / name, "--lora", args.rank, "--lora-alpha", 2 * args.rank,
                   "--lora-targets", "all", "--lr", args.lr, "--batch-size", args.batch,
                   "--block-size", args.seq, "--backward-precision", precision,
                   *common)  # fmt: skip
            label = f"smollm2 + LoRA r{args.rank} all" + (
                "" if precision == "float32" else f" ({precision} backward)"
            )
            rows[label] = bpc(work / name, work / "val.txt", args)
            runs.append(name)
        attnlm("train", "--preset", "llama-char", "--text", work / "train.txt", "--out",
               work / "scratch", *common)  # fmt: skip
        rows["llama-char from scratch"] = bpc(work / "scratch", work / "val.txt", args)
        steps = {name: json.loads((work / name / "checkpoint" / "config.json").read_text())["step"]
                 for name in (*runs, "scratch")}  # fmt: skip
    for name, value in rows.items():
        print(f"  {name:<44} {value:.4f} bits/char")
    harness.emit({"bench": "finetune_shakespeare", "bpc": rows, "steps": steps,
                  "val_chars": len(val), "train_chars": len(train), "budget_s": args.budget,
                  "target": "LoRA clearly below the base and below from scratch"})  # fmt: skip


if __name__ == "__main__":
    main()
