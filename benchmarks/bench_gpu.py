"""GPU training throughput and MFU of a GPT-2-small-shaped model (bf16 autocast, torch.compile).

Shape: 12 layers, 12 heads, width 768, block 1024, vocabulary 50304 (GPT-2's 50257 padded to a
multiple of 128), learned positions, tied embeddings, no dropout. Steps use the trainer's
AdamW (fused on CUDA), gradient clipping and bf16 autocast. MFU follows the PaLM appendix B /
nanoGPT estimate: FLOPs per token = 6 N + 12 L H Q T (N parameters, Q head width, T block),
divided by the GPU's dense bf16 peak (``--peak-tflops``, default 989 for an H100 SXM).

Without CUDA the script says so and exits 0 (nothing in CI needs a GPU).

    .venv/bin/python benchmarks/bench_gpu.py [--batch 16] [--steps 30] [--no-compile]
"""

from __future__ import annotations

import argparse
import time

import torch

PEAKS_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU available; skipped")
        return

    from attnlm.models.gpt import GPT, GPTConfig
    from attnlm.train.config import TrainConfig
    from attnlm.train.optim import make_optimizer

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    cfg = GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    model = GPT(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, TrainConfig(lr=6e-4, weight_decay=0.1), "cuda")
    fwd = model if args.no_compile else torch.compile(model)
    B, T = args.batch, cfg.block_size
    x = torch.randint(cfg.vocab_size, (B, T), device=dev)
    y = torch.randint(cfg.vocab_size, (B, T), device=dev)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    tok_s = B * T / dt
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * T
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops or next((v for k, v in PEAKS_TFLOPS.items() if k in name), 989.0)
    mfu = flops_per_token * tok_s / (peak * 1e12)
    print(
        f"device: {name}; model {n_params / 1e6:.1f}M params, batch {B} x {T}, bf16 autocast, "
        f"compile={not args.no_compile}"
    )
    print(
        f"step {dt * 1e3:.1f} ms, {tok_s:,.0f} tokens/s, MFU {mfu * 100:.1f}% of {peak:.0f} TFLOPS"
    )


if __name__ == "__main__":
    main()
