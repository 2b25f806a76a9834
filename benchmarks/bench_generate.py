"""Greedy generation with the KV cache: our loop vs ``GPT2LMHeadModel.generate(use_cache=True)``.

The same weights on both sides: a GPT-2-layout model is written in the Hugging Face layout,
loaded by ``transformers`` with ``from_pretrained`` and by us through our HF import
(``GPT.from_hf``). Both decode 200 tokens greedily from the same prompt; the tokens must be
identical. Alternating runs in this process, ``torch.set_num_threads(1)``; medians.

Two models:

* ``trained``: nanoGPT's CPU shape (4 layers, 4 heads, width 128) with GPT-2's parts (learned
  positions, biases, GELU-tanh), window 256, trained with ``attnlm train`` for 120 s (1 thread)
  on the default corpus (cached under ``runs/bench_generate/``); prompt ``"ROMEO:\\n"``. Real
  text, so lookahead drafts are accepted only where the text repeats.
* ``random``: a randomly initialised 10.8M-parameter model (6 layers, 6 heads, width 384,
  window 256, vocabulary 65; nanoGPT's Shakespeare-char GPU shape); random 8-token prompt.

Our loop is timed with lookahead drafts (the default for greedy decoding of one prompt, see
``attnlm.generate.lookahead``) and without (one token per forward pass).

    .venv/bin/python benchmarks/bench_generate.py [--runs 5] [--new 200] [--model both]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnlm.generate import generate
from attnlm.models.gpt import GPT

RUN_DIR = Path("runs/bench_generate")


def trained_pair(tmp: str, threads: int, seconds: str):
    from transformers import GPT2LMHeadModel

    from attnlm.checkpoint import load_checkpoint
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
    ck.model.save_hf(tmp)
    ref = GPT2LMHeadModel.from_pretrained(tmp).eval()
    ours = GPT.from_hf(tmp).eval()
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
    ours = GPT.from_hf(tmp).eval()
    prompt = torch.randint(65, (1, 8), generator=torch.Generator().manual_seed(1))
    return ours, ref, prompt, None


def compare(name: str, ours, ref, prompt, n: int, runs: int, tokenizer=None) -> bool:
    def run_ours():
        return generate(ours, prompt, n, temperature=0, use_cache=True)

    def run_plain():
        return generate(ours, prompt, n, temperature=0, use_cache=True, lookahead=0)

    def run_hf():
        with torch.no_grad():
            return ref.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0,
            )  # fmt: skip

    times: dict[str, list[float]] = {"ours": [], "plain": [], "hf": []}
    outs = {}
    for f in (run_ours, run_plain, run_hf):  # warm up
        f()
    for _ in range(runs):
        for key, f in (("ours", run_ours), ("plain", run_plain), ("hf", run_hf)):
            t0 = time.perf_counter()
            outs[key] = f()
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    passes = _count_passes(ours, run_ours)
    new_ids = outs["ours"][0, prompt.size(1) :].tolist()
    same = torch.equal(outs["ours"], outs["hf"]) and torch.equal(outs["plain"], outs["hf"])
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"\n== {name}: {n_params / 1e6:.2f}M parameters, greedy, {n} new tokens, "
          f"prompt {prompt.size(1)} tokens, median of {runs}")  # fmt: skip
    if tokenizer is not None:
        text = tokenizer.decode(outs["ours"][0].tolist())
        print("   text: " + repr(text[:160]) + ("..." if len(text) > 160 else ""))
    for key, label in (
        ("ours", "attnlm generate (KV cache, lookahead 8)"),
        ("plain", "attnlm generate (KV cache, lookahead 0)"),
        ("hf", "HF generate(use_cache=True)"),
    ):
        print(f"   {label:<40} {med[key] * 1e3:8.1f} ms ({n / med[key]:6.0f} tokens/s)")
    print(f"   identical tokens (all three): {same}; {len(set(new_ids))} distinct ids among the "
          f"{n} new; forward passes with lookahead: {passes} (without: {n})")  # fmt: skip
    print(
        f"   speed-up vs HF: {med['hf'] / med['ours']:.2f}x with lookahead (target >= 2x), "
        f"{med['hf'] / med['plain']:.2f}x one token per pass"
    )
    return same


def _count_passes(model: torch.nn.Module, fn) -> int:
    calls = [0]
    handle = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        fn()
    finally:
        handle.remove()
    return calls[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=["both", "trained", "random"], default="both")
    ap.add_argument("--train-seconds", default="120s")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ok = True
    if args.model in ("both", "trained"):
        with tempfile.TemporaryDirectory() as tmp:
            ours, ref, prompt, tok = trained_pair(tmp, args.threads, args.train_seconds)
        ok &= compare("trained char model", ours, ref, prompt, args.new, args.runs, tok)
    if args.model in ("both", "random"):
        with tempfile.TemporaryDirectory() as tmp:
            ours, ref, prompt, _ = random_pair(tmp)
        ok &= compare("random 10.8M model", ours, ref, prompt, args.new, args.runs)
    if not ok:
        raise SystemExit("token mismatch between attnlm and HF generate")


if __name__ == "__main__":
    main()
