"""The Llama family against ``transformers.LlamaForCausalLM``: training step, greedy decoding,
and the KV cache of grouped-query attention in bytes.

* **training step**: the ``llama-char`` shape (4 layers, 4 query heads, 2 key/value heads,
  width 128, SwiGLU width 352, tied embeddings) with block 64, batch 12, vocabulary 80; one
  step = forward with loss, backward, gradient clipping at 1.0, fused AdamW (lr 1e-3, betas
  (0.9, 0.99), weight decay 0.1 on matrices), zero_grad; both models start from the same
  weights (ours written with ``save_hf`` and read by ``from_pretrained``). A third row runs
  ours with ``torch.backends.mkldnn.enabled = False``: its linear layers then use
  ``F.linear`` (MKL) as HF's do, which separates the oneDNN matrix multiplications from the
  other fused kernels (``attnlm.nn.fused``). Reported in tokens/s of wall-clock time and of
  this thread's CPU time (steadier on a shared machine), with the per-round spread;
  ``--block``/``--batch`` change the window and batch.
* **matrix products**: the training step's five linear-layer shapes (forward) on MKL
  (``F.linear``) and on oneDNN (``attnlm.nn.fused.linear``), in CPU time.
* **greedy decoding**: two random models, the ``llama-char`` shape above (window 256) and a
  6-layer one (6 query heads, 2 key/value heads, width 384, SwiGLU 1024), vocabulary 65,
  decode 200 tokens from an 8-token prompt (bench_generate.py's comparison and report); our
  ``attnlm.generate.generate`` (KV cache; with lookahead drafts, the default for one greedy
  prompt, and without) against ``LlamaForCausalLM.generate(do_sample=False)``; the tokens must
  be identical.
* **KV cache**: models of one shape with ``n_kv_head`` = 8 (MHA), 2 (GQA, n_head / n_kv_head
  = 4) and 1 (MQA) decode the same prompt; the bytes the cache holds are measured
  (``KVCache.nbytes``).

Both sides run in this process with ``torch.set_num_threads`` (1 by default), alternating in
rounds; medians of the rounds are reported.

    .venv/bin/python benchmarks/bench_llama.py [--rounds 7] [--steps 20] [--runs 5] [--new 200]
        [--only train|gemm|decode|cache] [--block 64] [--batch 12] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import torch

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.models import save_hf
from attnlm.models.llama import Llama, LlamaConfig
from bench_generate import compare  # the house's decoding comparison (benchmarks/ on sys.path)
from bench_train import make_step  # the house's training step: loss, backward, clip, fused AdamW

V, T, B = 80, 64, 12
TRAIN_SHAPE = dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, d_ff=352, tie_embeddings=True)
DECODE_SHAPE = dict(n_layer=6, n_head=6, n_kv_head=2, n_embd=384, d_ff=1024)


def pair(vocab: int, block: int, shape: dict, tmp: str):
    """Our random Llama and the same weights in ``LlamaForCausalLM``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    ours = Llama(LlamaConfig(vocab_size=vocab, block_size=block, **shape))
    save_hf(ours, tmp)
    ref = LlamaForCausalLM.from_pretrained(tmp)
    return ours, ref


def bench_train(rounds: int, steps: int, block: int = T, batch: int = B) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = pair(V, block, TRAIN_SHAPE, tmp)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(V, (steps, batch, block + 1), generator=g)
    batches = [(d[:, :-1], d[:, 1:]) for d in data]
    hf_batches = [(d[:, :-1], None) for d in data]  # HF's labels are its inputs, shifted inside
    with torch.no_grad():
        x, y = batches[0]
        a, b = ours(x, y).loss.item(), ref(input_ids=data[0], labels=data[0]).loss.item()
    step = make_step(ours, False)

    def mkl_step(x, y):  # ours with oneDNN off: the linear layers fall back to F.linear (MKL)
        torch.backends.mkldnn.enabled = False
        try:
            return step(x, y)
        finally:
            torch.backends.mkldnn.enabled = True

    runs = {"attnlm Llama": (step, batches),
            "attnlm, MKL linear": (mkl_step, batches),
            "HF LlamaForCausalLM": (make_step(ref, True), hf_batches)}  # fmt: skip

    def tokens_per_s(step, bs) -> tuple[float, float]:
        """Tokens per second of wall-clock time and of this thread's CPU time (which other
        processes on a shared machine do not inflate)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        for x, y in bs:
            step(x, y)
        n = sum(x.numel() for x, _ in bs)
        return n / (time.perf_counter() - t0), n / (time.thread_time() - c0)

    for step_fn, bs in runs.values():  # warm up
        tokens_per_s(step_fn, bs[:3])
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for r in range(rounds):  # alternating, the order reversed every other round
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            results[name].append(tokens_per_s(*runs[name]))
    wall = {name: statistics.median(w for w, _ in v) for name, v in results.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in results.items()}
    n_params = sum(p.numel() for p in ours.parameters())
    print(
        f"\n== training step: {n_params / 1e6:.2f}M parameters, L4 H4 Hkv2 C128 F352 "
        f"T{block} B{batch} V{V}; initial losses {a:.4f} (ours on T) / {b:.4f} (HF on T + 1)"
    )
    print(f"   tokens/s, median of {rounds} rounds x {steps} steps: wall clock | thread CPU time")
    hf = "HF LlamaForCausalLM"
    for name in runs:
        print(
            f"   {name:>22}: {wall[name]:10,.0f} | {cpu[name]:10,.0f}   "
            f"ratio to HF {wall[name] / wall[hf]:.2f}x | {cpu[name] / cpu[hf]:.2f}x"
        )
    spread = [w / h for (w, _), (h, _) in zip(results["attnlm Llama"], results[hf], strict=True)]
    print(f"   per-round wall ratios attnlm / HF: {min(spread):.2f}x to {max(spread):.2f}x")
    ratio = wall["attnlm Llama"] / wall[hf]
    print(f"   ratio attnlm / HF: {ratio:.2f}x (target >= 1.2x)")
    harness.emit(
        {
            "bench": "llama-train-step",
            "runs": rounds,
            "tokens_per_s_wall": wall,
            "tokens_per_s_thread_cpu": cpu,
            "speedup_wall": ratio,
            "speedup_cpu": cpu["attnlm Llama"] / cpu[hf],
            "target": ">= 1.2x speed-up",
        }
    )
    return ratio


def bench_gemm(rounds: int) -> None:
    """The training step's matrix products (forward ``x Wᵀ``) on MKL (``F.linear``, what
    HF's layers call) and on oneDNN (``attnlm.nn.fused.linear``), alternating."""
    from attnlm.nn import fused

    n = B * T
    shapes = {"qkv 128->256": (128, 256), "out 128->128": (128, 128),
              "gate/up 128->704": (128, 704), "down 352->128": (352, 128),
              "lm_head 128->80": (128, 80)}  # fmt: skip
    ok = fused.onednn_available()
    print(f"\n== matrix products of the training step, {n} rows, float32 "
          f"(oneDNN available: {ok}), median of {rounds} rounds x 50")  # fmt: skip
    for label, (k, m) in shapes.items():
        x, w = torch.randn(n, k), torch.randn(m, k)
        times: dict[str, list[float]] = {"MKL": [], "oneDNN": []}
        fns = {"MKL": torch.nn.functional.linear, "oneDNN": fused.linear}
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = time.thread_time()
                for _ in range(50):
                    fn(x, w)
                times[name].append((time.thread_time() - t0) / 50)
        a, b = (statistics.median(times[k]) for k in ("MKL", "oneDNN"))
        gflops = 2 * n * k * m / 1e9
        print(f"   {label:<18} MKL {a * 1e6:7.0f} us ({gflops / a:5.1f} GFLOP/s)   oneDNN "
              f"{b * 1e6:7.0f} us ({gflops / b:5.1f} GFLOP/s)   {a / b:.2f}x")  # fmt: skip


def bench_decode(runs: int, n: int, shape: dict, label: str) -> bool:
    """bench_generate's comparison (same timing loop and report) on a random Llama pair."""
    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = pair(65, 256, shape, tmp)
    prompt = torch.randint(65, (1, 8), generator=torch.Generator().manual_seed(1))
    return compare(f"random Llama, {label}", ours.eval(), ref.eval(), prompt, n, runs)


def bench_cache(n: int) -> None:
    base = dict(vocab_size=65, block_size=512, n_layer=6, n_head=8, n_embd=512, d_ff=1024)
    prompt = torch.randint(65, (1, 8), generator=torch.Generator().manual_seed(2))
    sizes = {}
    for kv in (8, 2, 1):
        torch.manual_seed(0)
        model = Llama(LlamaConfig(**base, n_kv_head=kv)).eval()
        state = model.new_state()
        with torch.no_grad():
            logits = model.step(prompt, state)
            for _ in range(n):
                logits = model.step(logits[:, -1:].argmax(-1), state)
        sizes[kv] = state.nbytes
    print(f"\n== KV cache after {8 + n} tokens (L6, H8, width 512, float32), measured bytes")
    for kv, label in ((8, "MHA, n_kv_head=8"), (2, "GQA, n_kv_head=2"), (1, "MQA, n_kv_head=1")):
        print(f"   {label:<18} {sizes[kv]:>12,} bytes  ({sizes[kv] / sizes[8]:.4f} of MHA)")
    print(f"   GQA with n_head / n_kv_head = 4: {sizes[2] / sizes[8]:.4f} of the MHA cache "
          f"(target 1/4)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=["train", "gemm", "decode", "cache"], default=None)
    ap.add_argument("--block", type=int, default=T, help="training window (default 64)")
    ap.add_argument("--batch", type=int, default=B, help="training batch (default 12)")
    args = harness.parse(ap, quick={"rounds": 1, "steps": 2, "runs": 1, "new": 16})
    if not harness.require("llama", "transformers"):
        return
    harness.set_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, threads {args.threads}"
    )
    ok = True
    if args.only in (None, "train"):
        bench_train(args.rounds, args.steps, args.block, args.batch)
    if args.only in (None, "gemm"):
        bench_gemm(args.rounds)
    if args.only in (None, "decode"):
        ok = bench_decode(args.runs, args.new, TRAIN_SHAPE, "L4 H4 Hkv2 C128 F352 V65")
        ok &= bench_decode(args.runs, args.new, DECODE_SHAPE, "L6 H6 Hkv2 C384 F1024 V65")
    if args.only in (None, "cache"):
        bench_cache(args.new)
    if not ok:
        raise SystemExit("token mismatch between attnlm and HF generate")


if __name__ == "__main__":
    main()
