"""Perplexity of SmolLM2-135M-Instruct on a text, teacher-forced, on the same tokens: attnlm
(the GGUF dequantized to float32, ``attnlm eval``'s model) against llama.cpp
(``llama-cpp-python``, the file's own Q4_1/Q8_0 blocks) and ``transformers``' GGUF loading
(float32).

The tokens are attnlm's encoding of the first ``--chars`` characters of the built-in
Shakespeare corpus (the tokenizer tests show they equal llama.cpp's), scored in one window of
at most ``--ctx`` tokens: the negative log-likelihood of every token after the first. Each
side also reports the wall time of that one forward pass (one process, alternating rounds).
Target: attnlm's perplexity within 1% of llama.cpp's. ``--weights f32,q8,q4`` adds a row per
decode-time weight format (``attnlm-q8``...: the file's matrices loaded straight into that
format, :mod:`attnlm.quant`) beside the float32 one.

llama.cpp is a bench-only peer: ``pip install -e '.[llamacpp]'`` (or the prebuilt wheel);
without it the llama.cpp row is skipped with a line.

Run: ``.venv/bin/python benchmarks/bench_smollm2_ppl.py [--chars 4000] [--threads 2]
[--weights f32,q8,q4]``.
"""

from __future__ import annotations

import argparse
import math
import os

import harness  # benchmarks/harness.py: alternating runs, medians, JSON lines

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' loading bars

NAME = "smollm2-135m-instruct"


def nll_from_logits(logits, ids) -> float:
    """Summed negative log-likelihood (nats) of ``ids[1:]`` under ``logits[:-1]`` (numpy
    float arrays ``(T, V)``; ``ids`` length ``T``)."""
    import numpy as np

    x = np.asarray(logits[:-1], dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    logz = np.log(np.exp(x).sum(axis=1))
    picked = x[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    return float((logz - picked).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chars", type=int, default=4000, help="characters of the corpus scored")
    ap.add_argument("--ctx", type=int, default=2048, help="most tokens scored (one window)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--weights", default="f32", help="weight formats, comma-separated (f32,bf16,q8,q4)"
    )
    args = harness.parse(ap, quick={"chars": 400, "rounds": 1})
    harness.set_threads(args.threads)
    harness.header("smollm2_ppl", chars=args.chars, threads=args.threads)

    import torch

    from attnlm.data.corpus import load_text
    from attnlm.data.pretrained import PRETRAINED, pretrained_path
    from attnlm.models.gguf import load

    path = pretrained_path(NAME) / PRETRAINED[NAME].files[0]
    model, tok = load(path)
    model.eval()
    text = load_text(None)[: args.chars]
    ids = list(tok.encode(text))[: args.ctx]
    n = len(ids) - 1
    results: dict[str, float] = {}
    runs: dict[str, list] = {}

    def ours():
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
        results["attnlm"] = nll_from_logits(logits, ids)

    contenders = {"attnlm": ours}
    from attnlm.models.gguf import load_model

    def ours_in(fmt):
        quantized = load_model(path, fmt)

        def run():
            with torch.no_grad():
                logits = quantized(torch.tensor([ids])).logits[0].float().numpy()
            results[f"attnlm-{fmt}"] = nll_from_logits(logits, ids)

        return run

    for fmt in [f.strip() for f in args.weights.split(",") if f.strip() not in ("", "f32")]:
        contenders[f"attnlm-{fmt}"] = ours_in(fmt)
    if harness.have_module("llama_cpp"):
        from llama_cpp import Llama

        llm = Llama(str(path), n_ctx=max(512, len(ids)), n_threads=args.threads,
                    logits_all=True, verbose=False)  # fmt: skip

        def llamacpp():
            llm.reset()
            llm.eval(ids)
            results["llama.cpp"] = nll_from_logits(llm.scores[: len(ids)], ids)

        contenders["llama.cpp"] = llamacpp
    else:
        harness.skip("smollm2_ppl", "llama.cpp", "llama_cpp is not installed ('.[llamacpp]')")
    if harness.require("smollm2_ppl", "transformers", "gguf", "accelerate"):
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()

        def transformers_():
            with torch.no_grad():
                logits = hf(torch.tensor([ids])).logits[0].float().numpy()
            results["transformers"] = nll_from_logits(logits, ids)

        contenders["transformers"] = transformers_
    timed = {name: (lambda fn=fn: harness.time_call(fn)) for name, fn in contenders.items()}
    runs = harness.alternate(timed, rounds=args.rounds)
    chars = len(tok.decode(ids))
    ppl = {k: math.exp(v / n) for k, v in results.items()}
    for name, p in ppl.items():
        bpc = results[name] / chars / math.log(2)
        print(f"  {name:<13} perplexity {p:.4f}  bits/char {bpc:.4f}  ({n} tokens, {chars} chars)")
    extra = {"tokens": n, "chars": chars, **{f"ppl_{k}": round(v, 5) for k, v in ppl.items()}}
    if "llama.cpp" in ppl:
        rel = ppl["attnlm"] / ppl["llama.cpp"] - 1
        extra["ppl_rel_diff_llamacpp"] = round(rel, 5)
        print(f"  attnlm vs llama.cpp: {100 * rel:+.3f}% (target: within 1%)")
    if "transformers" in ppl:
        extra["ppl_rel_diff_transformers"] = round(ppl["attnlm"] / ppl["transformers"] - 1, 7)
    peer = "llama.cpp" if "llama.cpp" in runs else None
    harness.report("smollm2_ppl forward", runs, ours="attnlm", peer=peer, **extra)


if __name__ == "__main__":
    main()
