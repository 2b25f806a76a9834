"""Eager against compiled translation (``translate_ids(compile=True)``, ``attnlm translate
--compile``) on a random Marian-shaped encoder-decoder: post-norm, SiLU, split sinusoids,
shared and tied embeddings, a final logits bias.

One thread; CPU time (``time.process_time``) of whole ``translate_ids`` calls, eager and
compiled alternating, median of ``--runs``; the warm-up (compiles of every shape the runs use)
is timed apart. Both paths give the same ids (checked), so they do the same work.

    PYTHONPATH=src python benchmarks/bench_translate_compile.py --runs 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.generate.translate import translate_ids
from attnlm.models.transformer import Transformer, TransformerConfig


def _model(args) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=args.vocab, d_model=args.d_model, n_head=args.heads, d_ff=4 * args.d_model,
        n_encoder_layers=args.layers, n_decoder_layers=args.layers, activation="silu",
        positions_layout="split", final_logits_bias=True, dropout=0.0, pad_id=args.vocab - 1,
        bos_id=args.vocab - 1, eos_id=0, force_eos=False,
    )  # fmt: skip
    return Transformer(cfg).eval()


def _cpu(fn, *args):
    start = time.process_time()
    out = fn(*args)
    return time.process_time() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--sentences", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--runs", type=int, default=5)
    args = harness.parse(
        ap,
        quick={
            "runs": 1,
            "sentences": 1,
            "new_tokens": 4,
            "d_model": 64,
            "vocab": 500,
            "layers": 1,
        },
    )
    harness.set_threads(1)
    model = _model(args)
    rng = random.Random(0)
    sources = [[rng.randrange(1, args.vocab - 1) for _ in range(rng.randint(6, 14))]
               for _ in range(args.sentences)]  # fmt: skip
    cases = {
        "batch 1 (explorer: a sentence a call)": lambda compile: [
            translate_ids(model, [s], max_new_tokens=args.new_tokens, compile=compile)[0]
            for s in sources
        ],
        f"batch {args.sentences} (translate: one call)": lambda compile: translate_ids(
            model, sources, max_new_tokens=args.new_tokens, compile=compile
        ),
    }
    print(f"d_model={args.d_model} heads={args.heads} layers={args.layers}+{args.layers} "
          f"vocab={args.vocab}, {args.sentences} sources of 6-14 tokens, "
          f"{args.new_tokens} new tokens, 1 thread, CPU s")  # fmt: skip
    for name, run in cases.items():
        wall = time.perf_counter()
        warm, got = _cpu(run, True)
        wall = time.perf_counter() - wall
        eager_t, compiled_t = [], []
        for _ in range(args.runs):
            t, want = _cpu(run, False)
            eager_t.append(t)
            t, got = _cpu(run, True)
            compiled_t.append(t)
            assert got == want, "compiled ids differ from eager ones"
        tokens = sum(len(row) - 1 for row in want)
        e, c = statistics.median(eager_t), statistics.median(compiled_t)
        print(f"{name}: eager {e:.3f} s ({tokens / e:.0f} tok/s), compiled {c:.3f} s "
              f"({tokens / c:.0f} tok/s), {e / c:.2f}x; warm-up {warm:.1f} CPU s "
              f"({wall:.1f} s wall)")  # fmt: skip
        harness.emit({"bench": f"translate-compile {name}", "clock": "cpu", "runs": args.runs,
                      "eager_cpu_s": e, "compiled_cpu_s": c, "speedup_cpu": e / c,
                      "warmup_cpu_s": warm, "warmup_wall_s": wall})  # fmt: skip


if __name__ == "__main__":
    main()
