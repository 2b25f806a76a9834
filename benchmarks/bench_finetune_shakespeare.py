"""Five minutes of LoRA fine-tuning on a text the model has not seen: SmolLM2-135M on the
built-in Shakespeare, against the base model and a from-scratch ``llama`` trained as long.

Validation text: the last ``--val-chars`` characters of the built-in corpus; nothing of it is
trained on. Rows, each scored in bits per character on that text (attnlm's exact evaluation,
:func:`attnlm.evaluation.evaluate_ids`, windows of ``--seq`` tokens; the character model uses
its own 128-character window):

* ``smollm2 base``: the GGUF dequantized to float32, as it is;
* ``smollm2 + LoRA``: LoRA r ``--rank`` on every linear layer (``all``, alpha 2r), trained for
  ``--budget`` seconds on windows of the rest of the corpus (AdamW, lr ``--lr``, batch
  ``--batch``), merged for scoring;
* ``llama from scratch``: ``attnlm train --preset llama-char`` on the same training text for the
  same wall-clock budget (``--time-budget``).

Target (issue of record): the fine-tuned model clearly below the base and below the
from-scratch model. Run: ``.venv/bin/python benchmarks/bench_finetune_shakespeare.py
[--budget 300] [--threads 2]``; ``--quick`` checks that it runs (seconds of training).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: JSON lines, machine header

os.environ.setdefault("TQDM_DISABLE", "1")
NAME = "smollm2-135m-instruct"


def bpc(model, ids, chars: int, seq: int, batch: int) -> float:
    import numpy as np

    from attnlm.evaluation import evaluate_ids

    return evaluate_ids(model.eval(), np.asarray(ids), chars, seq, batch_size=batch).bpc


def lora_finetune(model, ids, args) -> dict:
    """Train LoRA adapters for ``args.budget`` seconds on random windows of ``ids``."""
    import numpy as np
    import torch

    from attnlm.nn.lora import apply_lora, merge_lora

    apply_lora(model, args.rank, alpha=2 * args.rank, targets="all")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=True)
    rng = np.random.default_rng(0)
    ids = np.asarray(ids)
    t0, steps, losses = time.perf_counter(), 0, []
    while time.perf_counter() - t0 < args.budget:
        starts = rng.integers(0, len(ids) - args.seq - 1, size=args.batch)
        x = torch.from_numpy(np.stack([ids[s : s + args.seq + 1] for s in starts]))
        for group in opt.param_groups:  # a short linear warm-up
            group["lr"] = args.lr * min(1.0, (steps + 1) / 10)
        out = model(x[:, :-1], targets=x[:, 1:])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        steps += 1
    merge_lora(model)
    return {"steps": steps, "seconds": time.perf_counter() - t0, "last_loss": losses[-1]}


def from_scratch(train_path: Path, out: Path, val: str, args) -> tuple[float, dict]:
    """``attnlm train --preset llama-char`` for the budget, scored on ``val``."""
    from attnlm.checkpoint import load_checkpoint

    cmd = harness.attnlm_command(
        "train", "--preset", "llama-char", "--text", str(train_path), "--out", str(out),
        "--time-budget", f"{args.budget:g}s", "--threads", str(args.threads),
        "--eval-interval", "1000000", "--seed", "0",
    )  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"attnlm train failed: {done.stderr.strip().splitlines()[-1:]}")
    ck = load_checkpoint(out)
    ids = ck.tokenizer.encode(val)
    score = bpc(ck.model, ids, len(val), int(ck.model_config.block_size), args.eval_batch)
    return score, {"step": ck.step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=300.0, help="training seconds per model")
    ap.add_argument("--val-chars", type=int, default=20_000)
    ap.add_argument("--train-chars", type=int, default=1_000_000, help="LoRA training text")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = harness.parse(
        ap, quick={"budget": 3.0, "val_chars": 600, "train_chars": 20_000, "seq": 32,
                   "batch": 1, "rank": 2},
    )  # fmt: skip
    harness.set_threads(args.threads)
    harness.header("finetune_shakespeare", budget_s=args.budget, threads=args.threads)

    from attnlm.data.corpus import load_text
    from attnlm.data.pretrained import PRETRAINED, pretrained_path
    from attnlm.models.gguf import load

    text = load_text(None)
    val, train = text[-args.val_chars :], text[: -args.val_chars]
    model, tok = load(pretrained_path(NAME) / PRETRAINED[NAME].files[0])
    val_ids = tok.encode(val)
    rows = {"smollm2 base": bpc(model, val_ids, len(val), args.seq, args.eval_batch)}
    train_ids = tok.encode(train[-args.train_chars :])  # the text just before the validation
    info = lora_finetune(model, train_ids, args)
    rows[f"smollm2 + LoRA r{args.rank} all"] = bpc(
        model, val_ids, len(val), args.seq, args.eval_batch
    )
    with tempfile.TemporaryDirectory(prefix="attnlm-shakespeare-") as tmp:
        train_path = Path(tmp) / "train.txt"
        train_path.write_text(train, encoding="utf-8")
        rows["llama-char from scratch"], scratch = from_scratch(
            train_path, Path(tmp) / "scratch", val, args
        )
    for name, value in rows.items():
        print(f"  {name:<28} {value:.4f} bits/char")
    harness.emit({"bench": "finetune_shakespeare", "bpc": rows, "lora": info,
                  "scratch": scratch, "val_chars": len(val), "budget_s": args.budget,
                  "target": "LoRA clearly below the base and below from scratch"})  # fmt: skip


if __name__ == "__main__":
    main()
