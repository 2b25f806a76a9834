"""Greedy generation with the KV cache: our loop vs ``GPT2LMHeadModel.generate(use_cache=True)``.

The same weights on both sides: a GPT-2-layout model is written in the Hugging Face layout,
loaded by ``transformers`` with ``from_pretrained`` and by us through our HF import
(``attnlm.models.from_hf``). Both decode 200 tokens greedily from the same prompt; the tokens
must be identical. Alternating runs in this process, ``harness.set_threads(1)``; medians.

Two models:

* ``trained``: nanoGPT's CPU shape (4 layers, 4 heads, width 128) with GPT-2's parts (learned
  positions, biases, GELU-tanh), window 256, trained with ``attnlm train`` for 120 s (1 thread)
  on the default corpus (cached under ``runs/bench_generate/``); prompt ``"ROMEO:\\n"``. Real
  text, so lookahead drafts are accepted only where the text repeats.
* ``random``: a randomly initialised 10.8M-parameter model (6 layers, 6 heads, width 384,
  window 256, vocabulary 65; nanoGPT's Shakespeare-char GPU shape); random 8-token prompt.

Rows, at batch 1 and 16 (``--batch``): our plain loop (one token per forward pass) with the
static decoding state (the default) and with the growing cache, ``--compile``: with the
compiled step (warm-up reported apart), at batch 1 with lookahead drafts (the default for greedy
decoding of one prompt, ``attnlm.generate.lookahead``: a separate row, not plain decoding), HF,
and the ceiling: one token per row through the blocks' 24 weight matrices alone (``F.linear``),
measured in the same rounds. Times are CPU seconds of this process (``--wall``: wall clock).

    .venv/bin/python benchmarks/bench_generate.py [--runs 5] [--new 200] [--model both]
        [--batch 1 16] [--compile] [--wall]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.generate import DecodeOptions, SamplingConfig, generate
from attnlm.models import from_hf, save_hf
from attnlm.models.gpt import GPT

RUN_DIR = Path("runs/bench_generate")
# CPU time of this process: on a shared machine the wall clock also counts the time other
# people's jobs hold the cores; --wall switches to it
clock = time.process_time


def trained_pair(tmp: str, threads: int, seconds: str):
    from transformers import GPT2LMHeadModel

    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.train.config import spec_from_tables
    from attnlm.train.run import train_run

    if not (RUN_DIR / "checkpoint").exists():
        tables = {
            "model": {
                "block_size": 256, "n_layer": 4, "n_head": 4, "n_embd": 128,
                "positions": "learned", "bias": True, "activation": "gelu_tanh",
            },
            "train": {
                "batch_size": 4, "lr": 4e-3, "min_lr": 1e-4, "warmup_iters": 50,
                "max_iters": 100_000, "time_budget": seconds, "threads": threads,
                "eval_interval": 500, "progress": False,
            },
        }  # fmt: skip
        train_run(spec_from_tables(tables, "bench-generate"), RUN_DIR)
    ck = load_checkpoint(RUN_DIR)
    save_hf(ck.model, tmp)
    ref = GPT2LMHeadModel.from_pretrained(tmp).eval()
    ours = from_hf(tmp).eval()
    prompt = torch.tensor([ck.tokenizer.encode("ROMEO:\n")])
    return ours, ref, prompt, ck.tokenizer


def random_pair(tmp: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=65, n_positions=256, n_embd=384, n_layer=6, n_head=6,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(tmp)
    ref = GPT2LMHeadModel.from_pretrained(tmp).eval()
    ours = from_hf(tmp).eval()
    prompt = torch.randint(65, (1, 8), generator=torch.Generator().manual_seed(1))
    return ours, ref, prompt, None


def weight_matmuls(model: GPT, rows: int):
    """One token per row through the transformer blocks' weight matrices alone (4 per layer:
    QKV, output, the two feed-forward ones), nothing else: the bandwidth ceiling of a step."""
    weights = [m.weight for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")]  # fmt: skip
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

    def run(n: int) -> None:
        with torch.inference_mode():
            for _ in range(n):
                for w in weights:
                    torch.nn.functional.linear(inputs[w.shape[1]], w)

    return run


def compare(name, ours, ref, prompt, n, runs, tokenizer=None, batch=1, compiled=False) -> bool:
    prompt = prompt.expand(batch, -1).contiguous()
    if batch > 1:  # different rows: shift each row's ids
        prompt = (prompt + torch.arange(batch)[:, None]) % ours.config.vocab_size

    def greedy(**kw):
        return lambda: generate(
            ours, prompt, SamplingConfig(temperature=0, max_new_tokens=n), DecodeOptions(**kw)
        )

    def run_hf():
        with torch.no_grad():
            return ref.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0,
            )  # fmt: skip

    ceiling = weight_matmuls(ours, batch)
    runners = {
        "plain": greedy(lookahead=0),
        "dynamic": greedy(lookahead=0, static=False),
        "hf": run_hf,
        "ceiling": lambda: ceiling(n),
    }
    if batch == 1:
        runners["ours"] = greedy()
    warmup: dict[str, float] = {}
    if compiled:
        runners["compiled"] = greedy(compile=True)
    times: dict[str, list[float]] = {k: [] for k in runners}
    outs = {}
    for key, f in runners.items():  # warm up (the compiled step compiles here): wall clock,
        t0 = time.perf_counter()  # as compile workers run in other processes
        f()
        warmup[key] = time.perf_counter() - t0
    for _ in range(runs):
        for key, f in runners.items():
            t0 = clock()
            outs[key] = f()
            times[key].append(clock() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = all(torch.equal(outs[k], outs["hf"]) for k in runners if k not in ("hf", "ceiling"))
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"\n== {name}: {n_params / 1e6:.2f}M parameters, greedy, batch {batch}, {n} new "
          f"tokens, prompt {prompt.size(1)} tokens, median of {runs} (min-max)")  # fmt: skip
    if tokenizer is not None:
        text = tokenizer.decode(outs["plain"][0].tolist())
        print("   text: " + repr(text[:160]) + ("..." if len(text) > 160 else ""))
    labels = {
        "ours": "attnlm, lookahead 8 (drafts)",
        "plain": "attnlm plain (static state)",
        "dynamic": "attnlm plain (growing cache)",
        "compiled": "attnlm plain, compile=True",
        "hf": "HF generate(use_cache=True)",
        "ceiling": "24 weight matmuls alone",
    }
    for key in runners:
        rate = [batch * n / t for t in times[key]]
        extra = f", warm-up {warmup[key]:.1f} s" if key == "compiled" else ""
        print(f"   {labels[key]:<32} {med[key] * 1e3:8.1f} ms {batch * n / med[key]:7.0f} tok/s "
              f"({min(rate):.0f}-{max(rate):.0f}) {med['hf'] / med[key]:5.2f}x HF, "
              f"{med['ceiling'] / med[key]:4.0%} of ceiling{extra}")  # fmt: skip
    if batch == 1:
        passes = _count_passes(ours, runners["ours"])
        print(f"   forward passes with lookahead: {passes} (without: {n})")
    print(f"   identical tokens (ours and HF): {same}")
    harness.emit(
        {
            "bench": f"decode {name} batch {batch}",
            "clock": "wall" if clock is time.perf_counter else "cpu",
            "runs": runs,
            "seconds": med,
            "speedup_vs_hf": {k: med["hf"] / v for k, v in med.items()},
            "share_of_ceiling": {k: med["ceiling"] / v for k, v in med.items()},
            "identical_tokens": same,
        }
    )
    return same


def _count_passes(model: torch.nn.Module, fn) -> int:
    """Passes through the model's backend (its runner's ``step`` calls, :mod:`attnlm.runtime`)
    while ``fn`` runs: the planner's runners are wrapped for the call."""
    from attnlm.runtime import planner

    calls = [0]
    real = planner.runner_for

    def counting(*args, **kwargs):
        runner = real(*args, **kwargs)
        step = runner.step

        def counted(*a, **k):
            calls[0] += 1
            return step(*a, **k)

        runner.step = counted
        return runner

    planner.runner_for = counting
    try:
        fn()
    finally:
        planner.runner_for = real
    return calls[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=["both", "trained", "random"], default="both")
    ap.add_argument("--train-seconds", default="120s")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--compile", action="store_true", help="also time generate(compile=True)")
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of CPU time")
    args = harness.parse(ap, quick={"runs": 1, "new": 16, "model": "random", "batch": [1]})
    if not harness.require("generate", "transformers"):
        return
    harness.set_threads(args.threads)
    if args.wall:
        global clock
        clock = time.perf_counter
    ok = True
    if args.model in ("both", "trained"):
        with tempfile.TemporaryDirectory() as tmp:
            ours, ref, prompt, tok = trained_pair(tmp, args.threads, args.train_seconds)
        for b in args.batch:
            ok &= compare("trained char model", ours, ref, prompt, args.new, args.runs, tok, b,
                          args.compile)  # fmt: skip
    if args.model in ("both", "random"):
        with tempfile.TemporaryDirectory() as tmp:
            ours, ref, prompt, _ = random_pair(tmp)
        for b in args.batch:
            ok &= compare("random 10.8M model", ours, ref, prompt, args.new, args.runs, None, b,
                          args.compile)  # fmt: skip
    if not ok:
        raise SystemExit("token mismatch between attnlm and HF generate")


if __name__ == "__main__":
    main()
