"""Training-step throughput: our GPT vs ``transformers.GPT2LMHeadModel``, same shape, same AdamW.

Shape of nanoGPT's README CPU recipe: 4 layers, 4 heads, width 128, block 64, batch 12,
vocabulary 80, learned positions, GELU (tanh), biases, tied embeddings, dropout 0. One step =
forward with loss, backward, gradient clipping at 1.0, AdamW step (lr 1e-3, betas (0.9, 0.99),
weight decay 0.1 on matrices; the fused kernel, as our trainer uses, for both models, or
``--no-fused``), zero_grad. Both models run in this process with
``harness.set_threads(1)``, alternating in rounds; medians of the rounds are reported.

    .venv/bin/python benchmarks/bench_train.py [--rounds 7] [--steps 20]
"""

from __future__ import annotations

import argparse

import torch

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.train.optim import param_groups

V, T, B, L, H, C = 80, 64, 12, 4, 4, 128


def ours() -> torch.nn.Module:
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C)
    return GPT(cfg)


def hf():
    from transformers import GPT2Config, GPT2LMHeadModel

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
    return GPT2LMHeadModel(cfg)


def make_step(model, is_hf: bool, fused: bool = True):
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99), fused=fused)
    model.train()

    def step(x, y):
        if is_hf:
            # HF shifts labels inside: labels = the window of T + 1 ids minus its last one
            loss = model(input_ids=x, labels=x).loss
        else:
            loss = model(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-fused", action="store_true", help="for-each AdamW for both models")
    args = harness.parse(ap, quick={"rounds": 1, "steps": 2})
    if not harness.require("train", "transformers"):
        return
    fused = not args.no_fused
    harness.set_threads(args.threads)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(V, (args.steps, B, T + 1), generator=g)
    batches = [(d[:, :-1], d[:, 1:]) for d in data]
    tokens = sum(x.numel() for x, _ in batches)

    def timed(step):  # one run: every batch once
        return lambda: harness.time_call(lambda: [step(x, y) for x, y in batches])

    contenders = {
        "attnlm": timed(make_step(ours(), False, fused)),
        "hf": timed(make_step(hf(), True, fused)),  # transformers.GPT2LMHeadModel
    }
    for fn in contenders.values():  # warm up
        fn()
    harness.header("gpt-train-step", shape=f"L{L} H{H} C{C} T{T} B{B} V{V}", threads=args.threads)
    runs = harness.alternate(contenders, args.rounds)
    r = harness.report(
        "gpt-train-step", runs, "attnlm", "hf", ">= 1.2x speed-up", tokens_per_run=tokens
    )
    for name in runs:
        rate = tokens / r[name]["wall_s"]
        print(
            f"  {name}: {rate:,.0f} tokens/s (median of {args.rounds} rounds x {args.steps} steps)"
        )


if __name__ == "__main__":
    main()
