"""The GPU benchmark: decode tokens/s, training step time and MFU, the GPU preset's loss; JSON.

Rows (each measured ours and ``transformers`` alternating in this process, medians):

* ``decode``: greedy tokens/s at batch 1 and 16 of a GPT-2-small-shaped model (12 layers, 12
  heads, width 768, random weights, the same weights on both sides): ours plain (static state),
  ours compiled (``generate(compile=True)``: CUDA graphs), ``transformers`` dynamic cache,
  ``transformers`` static cache + ``torch.compile`` (``cache_implementation="static"``).
* ``train``: one training step (B 16 x 1024, bf16 autocast, compile, fused AdamW, clipping)
  of ours and of ``GPT2LMHeadModel``; MFU = (6 N + 12 L H Q T) FLOPs per token x tokens/s /
  peak (PaLM appendix B, nanoGPT's estimate). nanoGPT's 38.4 ms / 37.1% on an H100 is the
  recorded reference (docs/benchmarks.md).
* ``preset`` (``--preset-seconds S``): train ``shakespeare-char-gpu`` for S seconds on
  ``--text`` and report the final validation loss (nanoGPT: 1.2965 in 190 s on an H100).

``--device cpu --smoke`` runs every row tiny on the CPU (2 layers, a few steps, the compiled
step with the "eager" backend, no ``transformers`` compile) so the script is known to work
without a GPU. ``--json PATH`` writes the results.

    .venv/bin/python benchmarks/bench_gpu.py [--device cuda] [--json gpu.json]
        [--preset-seconds 190 --text shakespeare.txt] [--smoke]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.generate.options import DecodeOptions

PEAKS_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}
NANOGPT_H100 = {"step_ms": 38.4, "mfu": 0.371, "preset_val": 1.2965, "preset_seconds": 190}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev: torch.device) -> float:
    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t0


def alternate(runners: dict, runs: int, dev: torch.device) -> dict[str, float]:
    """Median seconds per runner, one warm-up call each, then ``runs`` alternating rounds.
    Each call's time goes to stderr as it ends, so a run cut short still shows where its
    time went."""
    for key, f in runners.items():
        print(f"  warm-up {key}: {timed(f, dev):.2f} s", file=sys.stderr, flush=True)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(runs):
        for key, f in runners.items():
            times[key].append(timed(f, dev))
            print(f"  {key}: {times[key][-1]:.3f} s", file=sys.stderr, flush=True)
    return {k: statistics.median(v) for k, v in times.items()}


def gpt2_pair(shape: dict, dev: torch.device, tmp: str):
    """Random GPT-2 weights loaded by both libraries (ours through the HF import)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnlm.models import from_hf

    torch.manual_seed(0)
    cfg = GPT2Config(**shape, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(cfg).save_pretrained(tmp)
    ref = GPT2LMHeadModel.from_pretrained(tmp).to(dev).eval()
    return from_hf(tmp).to(dev).eval(), ref


def decode_rows(args, dev: torch.device, shape: dict) -> list[dict]:
    from attnlm.generate import SamplingConfig, generate
    from attnlm.quant.layers import quantize_weights
    from attnlm.runtime.compiled import compiled_step

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = gpt2_pair(shape, dev, tmp)
    quantized = {f"ours_{fmt}": quantize_weights(copy.deepcopy(ours), fmt) for fmt in args.weights}
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    ours, ref = ours.to(dtype), ref.to(dtype)
    step = compiled_step(ours, backend="eager" if args.smoke else None)
    ref_static = None
    if not args.smoke:
        ref_static = type(ref)(ref.config).to(dev, dtype).eval()
        ref_static.load_state_dict(ref.state_dict())
        ref_static.forward = torch.compile(ref_static.forward, mode="reduce-overhead")
    n = args.new
    for batch in (1, 16):
        prompt = torch.randint(shape["vocab_size"], (batch, 8), device=dev)

        def hf(model, prompt=prompt, **kw):
            def run():
                with torch.no_grad():
                    model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                   max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                   pad_token_id=0, **kw)  # fmt: skip

            return run

        runners = {
            "ours_plain": lambda p=prompt: generate(
                ours, p, SamplingConfig(temperature=0, max_new_tokens=n), DecodeOptions(lookahead=0)
            ),
            "ours_compiled": lambda p=prompt: generate(
                ours,
                p,
                SamplingConfig(temperature=0, max_new_tokens=n),
                DecodeOptions(compile=step),
            ),
            "hf_dynamic": hf(ref),
        }
        for key, model in quantized.items():  # weight-only formats: float32 activations
            runners[key] = lambda p=prompt, m=model: generate(
                m, p, SamplingConfig(temperature=0, max_new_tokens=n), DecodeOptions(lookahead=0)
            )
        if ref_static is not None:
            runners["hf_static_compiled"] = hf(ref_static, cache_implementation="static")
        med = alternate(runners, args.runs, dev)
        for key, sec in med.items():
            rows.append({"row": "decode", "batch": batch, "path": key,
                         "tokens_per_s": batch * n / sec})  # fmt: skip
    return rows


def train_rows(args, dev: torch.device, shape: dict) -> list[dict]:
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnlm.models.gpt import GPT, GPTConfig
    from attnlm.train.config import TrainConfig
    from attnlm.train.optim import make_optimizer

    T, B = shape["n_positions"], args.batch
    cfg = GPTConfig(vocab_size=shape["vocab_size"], block_size=T, n_layer=shape["n_layer"],
                    n_head=shape["n_head"], n_embd=shape["n_embd"])  # fmt: skip
    ours = GPT(cfg).to(dev)
    ref = GPT2LMHeadModel(GPT2Config(**shape, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)).to(dev)  # fmt: skip
    x = torch.randint(cfg.vocab_size, (B, T), device=dev)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    n_params = sum(p.numel() for p in ours.parameters())
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * T
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAKS_TFLOPS.items() if k in name), None)

    def stepper(model, loss_of):
        opt = make_optimizer(model, TrainConfig(lr=6e-4, weight_decay=0.1), dev.type)
        fwd = model if args.smoke else torch.compile(model)

        def step():
            with autocast:
                loss = loss_of(fwd)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    runners = {
        "ours": stepper(ours, lambda m: m(x, x).loss),
        "hf": stepper(ref, lambda m: m(input_ids=x, labels=x).loss),
    }
    for f in runners.values():  # compile and settle
        for _ in range(args.warmup):
            f()
    med = alternate(runners, args.steps, dev)
    rows = []
    for key, sec in med.items():
        mfu = flops_per_token * B * T / sec / (peak * 1e12) if peak else None
        rows.append({"row": "train", "path": key, "step_ms": sec * 1e3, "mfu": mfu,
                     "batch": B, "block": T, "params": n_params})  # fmt: skip
    return rows


def preset_row(args) -> dict:
    from attnlm.train.config import load_spec
    from attnlm.train.run import train_run

    overrides = [f'time_budget="{args.preset_seconds}s"']
    if args.smoke:
        overrides += ['device="cpu"', 'dtype="float32"', "compile=false", "model.n_layer=1",
                      "model.n_embd=32", "model.n_head=2", "batch_size=4", "eval_iters=2",
                      "model.block_size=32", "progress=false"]  # fmt: skip
    if args.text:
        overrides.append(f'text="{args.text}"')
    spec = load_spec("shakespeare-char-gpu", overrides)
    with tempfile.TemporaryDirectory() as tmp:
        result = train_run(spec, Path(tmp), log=lambda *a, **k: None)
    val = result.last_eval.loss if result.last_eval is not None else None
    return {"row": "preset", "preset": "shakespeare-char-gpu", "seconds": result.elapsed,
            "steps": result.step, "val_loss": val}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: check the script runs")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--new", type=int, default=200, help="new tokens per decode")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="training batch")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument(
        "--weights",
        nargs="*",
        default=["q8", "q4"],
        help="weight-only formats decoded beside bf16 (ours plain, batch 1 and 16)",
    )
    ap.add_argument("--rows", default="decode,train", help="which of decode,train to run")
    ap.add_argument("--preset-seconds", type=float, default=0, help="0: skip the preset row")
    ap.add_argument("--text", default=None, help="corpus of the preset row")
    args = harness.parse(
        ap, quick={"smoke": True, "device": "cpu", "runs": 1, "steps": 2, "warmup": 1, "new": 8}
    )
    if not harness.require("gpu", "transformers"):
        return
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        harness.skip("gpu", "all rows", "no CUDA GPU available (try --device cpu --smoke)")
        return
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.smoke:
        args.new, args.runs, args.batch, args.steps, args.warmup = 8, 1, 2, 1, 1
        shape = dict(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    else:
        shape = dict(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    wanted = set(args.rows.split(",")) - {""}
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    sections = [lambda: decode_rows(args, dev, shape)] if "decode" in wanted else []
    sections += [lambda: train_rows(args, dev, shape)] if "train" in wanted else []
    sections += [lambda: [preset_row(args)]] if args.preset_seconds else []
    rows = []
    for section in sections:  # each section's rows printed as soon as it ends
        new = section()
        for r in new:
            harness.emit({"bench": "gpu", "device": device, "smoke": args.smoke, **r})
        rows += new
    result = {"device": device, "torch": torch.__version__, "smoke": args.smoke,
              "nanogpt_h100_reference": NANOGPT_H100, "rows": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
