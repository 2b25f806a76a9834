"""Attention and GPT speed: the fused fast path against the explicit formula, and our GPT
against Hugging Face ``GPT2LMHeadModel`` (same weights) for a training step and a forward.

Runs alternate between the contenders in one process with ``harness.set_threads(1)``;
medians of several repeats are printed with ratios (> 1 means ours is faster).

    .venv/bin/python benchmarks/bench_attention.py [--quick]
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
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.nn.attention import MultiHeadAttention


def timed(fn, repeats: int, inner: int) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` groups of ``inner`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def race(contenders: dict, repeats: int, inner: int) -> dict[str, float]:
    """Alternate the contenders ``repeats`` times; median seconds per call of each."""
    for fn in contenders.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            samples[name].append(timed(fn, 1, inner))
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_attention_paths(repeats: int) -> None:
    print("\n## MultiHeadAttention: fused SDPA path vs explicit softmax(QKᵀ/√d)V (causal)")
    print(f"{'B':>3} {'T':>5} {'C':>5} {'H':>3}  {'pass':<9}{'fast ms':>9}{'explicit ms':>13}"
          f"{'ratio':>8}")  # fmt: skip
    for B, T, C, H in [(12, 64, 128, 4), (4, 256, 256, 8), (1, 1024, 256, 8)]:
        torch.manual_seed(0)
        mha = MultiHeadAttention(C, H).eval()
        x = torch.randn(B, T, C)
        with torch.no_grad():
            fast = mha(x, is_causal=True)[0]
            slow = mha(x, is_causal=True, need_weights=True)[0]
        assert (fast - slow).abs().max() < 1e-5
        inner = max(1, 200 // T)
        for name, r in race_paths(mha, x, repeats, inner).items():
            print(f"{B:>3} {T:>5} {C:>5} {H:>3}  {name:<9}{r['fast'] * 1e3:>9.3f}"
                  f"{r['slow'] * 1e3:>13.3f}{r['slow'] / r['fast']:>8.2f}x")  # fmt: skip
            harness.emit({"bench": f"attention {name} B{B} T{T} C{C} H{H}", "clock": "wall",
                          "runs": repeats, "seconds": r,
                          "speedup_wall": r["slow"] / r["fast"]})  # fmt: skip


def race_paths(mha: MultiHeadAttention, x: torch.Tensor, repeats: int, inner: int) -> dict:
    """Fast vs explicit path, forward only and forward + backward."""
    xg = x.clone().requires_grad_(True)

    def fwd(need: bool) -> None:
        with torch.no_grad():
            mha(x, is_causal=True, need_weights=need)

    def fwd_bwd(need: bool) -> None:
        mha(xg, is_causal=True, need_weights=need)[0].sum().backward()

    return {
        name: race({"fast": lambda f=f: f(False), "slow": lambda f=f: f(True)}, repeats, inner)
        for name, f in (("forward", fwd), ("fwd+bwd", fwd_bwd))
    }


def bench_vs_hf(repeats: int) -> None:
    if not harness.require("gpt-vs-hf", "transformers"):
        return
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = GPTConfig(vocab_size=80, block_size=64, n_layer=4, n_head=4, n_embd=128)
    B, T = 12, 64
    torch.manual_seed(0)
    ours = GPT(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(ours, tmp)
        hf = transformers.GPT2LMHeadModel.from_pretrained(tmp)  # SDPA attention by default
    ours.train()
    hf.train()
    for m in (ours, hf):  # same numbers: no dropout
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
    ids = torch.randint(0, 80, (B, T + 1))
    x, y = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        diff = (ours(x).logits - hf(x).logits).abs().max().item()
    print(f"\n## GPT vs HF GPT2LMHeadModel (L=4, H=4, d=128, T={T}, B={B}, vocab 80); "
          f"max |Δlogits| = {diff:.1e}")  # fmt: skip
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_h = torch.optim.AdamW(hf.parameters(), lr=1e-4)

    def step_ours():
        loss = ours(x, targets=y).loss
        opt_o.zero_grad(set_to_none=True)
        loss.backward()
        opt_o.step()

    def step_hf():
        logits = hf(x).logits  # the same loss, computed outside to skip HF's label shifting
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 80), y.reshape(-1))
        opt_h.zero_grad(set_to_none=True)
        loss.backward()
        opt_h.step()

    def fwd(model):
        with torch.no_grad():
            model(x)

    r = race({"ours": step_ours, "hf": step_hf}, repeats, 5)
    print(f"training step   ours {r['ours'] * 1e3:7.2f} ms ({B * T / r['ours']:8.0f} tok/s)   "
          f"HF {r['hf'] * 1e3:7.2f} ms ({B * T / r['hf']:8.0f} tok/s)   "
          f"ratio {r['hf'] / r['ours']:.2f}x")  # fmt: skip
    harness.emit({"bench": "gpt-vs-hf train step", "clock": "wall", "runs": repeats,
                  "seconds": r, "speedup_wall": r["hf"] / r["ours"]})  # fmt: skip
    ours.eval()
    hf.eval()
    r = race({"ours": lambda: fwd(ours), "hf": lambda: fwd(hf)}, repeats, 10)
    print(f"forward (eval)  ours {r['ours'] * 1e3:7.2f} ms   HF {r['hf'] * 1e3:7.2f} ms   "
          f"ratio {r['hf'] / r['ours']:.2f}x")  # fmt: skip
    harness.emit({"bench": "gpt-vs-hf forward", "clock": "wall", "runs": repeats,
                  "seconds": r, "speedup_wall": r["hf"] / r["ours"]})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = harness.parse(parser)
    harness.set_threads(1)
    repeats = 1 if args.quick else 7
    print(f"# bench_attention: torch {torch.__version__}, 1 thread, {platform.machine()}, "
          f"{platform.processor() or 'cpu'}; medians of {repeats} alternating repeats")  # fmt: skip
    bench_attention_paths(repeats)
    bench_vs_hf(repeats)


if __name__ == "__main__":
    main()
