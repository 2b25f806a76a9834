"""Greedy generation with the KV cache: our loop vs ``GPT2LMHeadModel.generate(use_cache=True)``.

One set of weights: a GPT-2-layout model (6 layers, 6 heads, width 384, block 256, vocabulary
65; about 10.8M parameters, nanoGPT's Shakespeare-char shape) is built with ``transformers``,
saved with ``save_pretrained`` and loaded into our GPT through our HF import
(``GPT.from_hf``). Both decode 200 tokens greedily from the same 8-token prompt; the tokens
must be identical. Alternating runs in this process, ``torch.set_num_threads(1)``; medians.

    .venv/bin/python benchmarks/bench_generate.py [--runs 5] [--new 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from attnlm.models.gpt import GPT

V, T, L, H, C = 65, 256, 6, 6, 384


def build_pair(tmp: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=V,
        n_positions=T,
        n_embd=C,
        n_layer=L,
        n_head=H,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    ref = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # a less uniform output than the random init, so greedy is decisive
        ref.transformer.wte.weight.mul_(20)
    ref.save_pretrained(tmp)
    ref.eval()
    ours = GPT.from_hf(tmp).eval()
    return ours, ref


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = build_pair(tmp)
    prompt = torch.randint(V, (1, 8), generator=torch.Generator().manual_seed(1))
    n = args.new

    def run_ours():
        return ours.generate(prompt, n, temperature=0, use_cache=True)

    def run_hf():
        with torch.no_grad():
            return ref.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )

    run_ours(), run_hf()  # warm up
    t_ours, t_hf = [], []
    for _ in range(args.runs):
        a, dt = timed(run_ours)
        t_ours.append(dt)
        b, dt = timed(run_hf)
        t_hf.append(dt)
    same = torch.equal(a, b)
    mo, mh = statistics.median(t_ours), statistics.median(t_hf)
    n_params = sum(p.numel() for p in ours.parameters())
    print(
        f"model: {n_params / 1e6:.1f}M parameters (L{L} H{H} C{C} T{T} V{V}); greedy, {n} new "
        f"tokens, prompt 8, threads {args.threads}, median of {args.runs}"
    )
    print(f"      attnlm generate (KV cache): {mo * 1e3:8.1f} ms  ({n / mo:6.0f} tokens/s)")
    print(f"  HF generate(use_cache=True):    {mh * 1e3:8.1f} ms  ({n / mh:6.0f} tokens/s)")
    print(f"identical tokens: {same}")
    print(f"speed-up attnlm / HF: {mh / mo:.2f}x (target >= 2x)")
    if not same:
        raise SystemExit("token mismatch between attnlm and HF generate")


if __name__ == "__main__":
    main()
