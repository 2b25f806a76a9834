"""Decoding a K-quant GGUF file in its own blocks (the C engine's ggml products,
``src/attnlm/native/ggml_blocks.h``) against llama.cpp (``llama-cpp-python``) on the same file,
whole process against whole process.

The file: any Q4_K_M llama-architecture GGUF (``--path``), by default SmolLM2-135M-Instruct
requantized to Q4_K_M by llama.cpp's own quantizer (``llama_cpp.llama_model_quantize``, from
the cached ``smollm2-135m-instruct`` file; made once into the attnlm cache, ``bench/``).
Its matrices mix Q5_0 and Q8_0 (rows of 576, not a multiple of 256, fall back from Q4_K /
Q6_K as llama.cpp's quantizer does) with Q4_K and Q6_K.

Rows (medians over ``--rounds``, the contenders started in turn: attnlm, llama.cpp, ...):

* decode tokens/s at batch 1, greedy, a 64-token prompt and ``--new`` new tokens, one token
  per pass (``--lookahead 0``), ``--threads`` threads: attnlm (integer activations, the
  default), attnlm with float activations (``ATTNLM_GGML_ACTIVATIONS=float``) and llama.cpp
  (target: attnlm >= 1.2x llama.cpp); prefill of a 512-token prompt (>= 1.2x); peak RSS
  (<= 1.0x);
* ``--cpu-time``: in one process, one thread, the CPU time (``time.thread_time``) of each
  decoding step of attnlm's engine and of llama.cpp's ``eval``, alternating token by token:
  the ratio that stays meaningful on a machine shared with other work;
* ``--prefill-cpu-time``: the same for a ``--prefill-tokens`` prefill (one call each,
  alternating; the Qwen2.5-Coder-0.5B file's products are mostly Q5_0, its rows of 896 not
  a multiple of 256);
* ``--kernels``: each block type's product alone (4096 x 1536, one row of x and 64 rows, one
  thread), float against integer activations, alternating.

``--moe``: a mixture of experts (:func:`moe_file`, synthetic: Qwen3-MoE's parts at 0.6 B
parameters, 8 of 64 experts per token), whose decode reads only the chosen experts' blocks;
``--moe gptoss``: gpt-oss's parts (sinks, biases, a window on every other layer, 4 of 32
experts per token, the clamped SwiGLU) at 0.5 B parameters, in llama.cpp's ``MXFP4_MOE`` (the
experts in MXFP4, the rest Q8_0: how gpt-oss is released).

The CPU class of a laptop without AVX-512 (``--simulate avx2``): attnlm's C step built for
``x86-64-v3`` (AVX2, FMA, F16C; ``ATTNLM_NATIVE_MARCH``) and PyTorch / oneDNN kept to AVX2,
against llama.cpp built for the same class (``--llama-cpp-lib``: the ``bin/`` of a build
configured with ``-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_BMI2=ON``, of the wheel's llama.cpp version; ``benchmarks/build_llama_cpp.sh``).

    .venv/bin/python benchmarks/bench_kquant.py [--rounds 3] [--threads 2] [--new 128]
        [--path FILE.gguf | --requantize Q3_K_M | --moe [gptoss]] [--cpu-time] [--prefill-cpu-time]
        [--kernels] [--simulate avx2 --llama-cpp-lib DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

import bench_local_llm as local  # the peer process, whole-process runs and ratio lines
import harness  # benchmarks/harness.py: JSON lines, optional peers

SOURCE = "smollm2-135m-instruct"


def default_file(requantize: str | None = None) -> Path:
    """SmolLM2-135M-Instruct in Q4_K_M, made by llama.cpp's quantizer from the cached file
    (which is Q4_1: ``allow_requantize``) once, into the attnlm cache; with ``requantize``
    (a llama.cpp file type: ``Q3_K_M``, ``IQ4_XS`` ...), the cached Qwen2.5-Coder-1.5B-Instruct
    file (Q4_K_M; its rows of 1536 and 8960 are whole blocks of 256) in that type."""
    from attnlm.base.fileio import cache_dir
    from attnlm.data.pretrained import pretrained_file

    source, kind = local.gguf_path(), "Q4_K_M"
    name = "smollm2-135m-instruct-q4_k_m.gguf"
    if requantize:
        qwen = "qwen2.5-coder-1.5b-instruct"
        source, kind = str(pretrained_file(qwen)), requantize
        name = f"{qwen}-{requantize.lower()}.gguf"
    out = cache_dir() / "bench" / name
    if out.is_file():
        return out
    return quantized(source, out, kind)


#: the synthetic mixture of experts of ``--moe`` (Qwen3-MoE's parts, scaled down)
MOE = dict(type="llama", arch="qwen3moe", vocab_size=512, block_size=4096, n_layer=8,
           n_head=16, n_kv_head=4, n_embd=1024, d_ff=384, n_expert=64, n_expert_used=8,
           qk_norm=True, rope_theta=1e6)  # fmt: skip
#: ``--moe gptoss``: gpt-oss's parts, scaled down (its heads of 64, 4 experts per token)
GPTOSS = dict(type="llama", arch="gptoss", vocab_size=512, block_size=4096, n_layer=8,
              n_head=16, n_kv_head=4, n_embd=1024, d_ff=512, n_expert=32,
              n_expert_used=4, qkv_bias=True, attn_out_bias=True, attn_sinks=True,
              moe_bias=True, moe_gating="topk_softmax", moe_norm_topk=False,
              mlp_act="swiglu_oai", sliding_window=128, rope_theta=150000.0,
              layer_types=["sliding_attention", "full_attention"] * 4)  # fmt: skip
#: each --moe kind: its config, the committed fixture whose tokenizer it takes, the file type
MOE_KINDS = {"qwen3moe": (MOE, "qwen3moe-Q8_0.gguf", "Q4_K_M"),
             "gptoss": (GPTOSS, "gptoss-Q8_0.gguf", "MXFP4_MOE")}  # fmt: skip


def moe_file(kind: str = "qwen3moe") -> Path:
    """A mixture of experts in Q4_K_M, made here (no real one can be downloaded in the sandbox
    this was measured in): attnlm's Llama with Qwen3-MoE's parts (:data:`MOE`: 64 experts of
    width 384, 8 per token, q/k norms; width 1024, 8 layers; 0.62 B parameters, about 0.1 B
    of them per token), GPT-2's random initialisation (the router spreads the tokens over the
    experts), the tokenizer of the committed ``qwen3moe`` fixture; written as a float32 GGUF by
    attnlm's exporter and quantized by llama.cpp's own quantizer, once, into the attnlm cache."""
    import torch

    from attnlm.base.fileio import cache_dir
    from attnlm.models.gguf import load_tokenizer
    from attnlm.models.gguf.writer import export_gguf
    from attnlm.models.registry import build

    table, fixture, ftype = MOE_KINDS[kind]
    out = cache_dir() / "bench" / f"{kind}-synthetic-{ftype.lower()}.gguf"
    if out.is_file():
        return out
    fixture = Path(__file__).resolve().parents[1] / "tests/fixtures/gguf_arch" / fixture
    torch.manual_seed(0)
    model, _, _ = build(table)
    f32 = out.with_name(f"{kind}-synthetic-f32.gguf")
    out.parent.mkdir(parents=True, exist_ok=True)
    export_gguf(model.eval(), load_tokenizer(str(fixture)), f32, "f32")
    del model
    try:
        return quantized(f32, out, ftype)
    finally:
        f32.unlink(missing_ok=True)


def quantized(source: Path | str, out: Path, kind: str) -> Path:
    """``source`` in the llama.cpp file type ``kind`` at ``out``, by llama.cpp's quantizer."""
    import llama_cpp

    from attnlm.base.fileio import temp_path_for

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(out)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.allow_requantize = True
    params.nthread = 2
    done = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(),
                                          ctypes.byref(params))  # fmt: skip
    if done != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama.cpp's quantizer failed ({done})")
    tmp.replace(out)
    return out


def prompt_of(path: Path, n_tokens: int) -> str:
    """The first ``n_tokens`` tokens of the built-in Shakespeare corpus, as text."""
    from attnlm.data.corpus import load_text
    from attnlm.models.gguf import load_tokenizer

    tok = load_tokenizer(str(path))
    return tok.decode(tok.encode(load_text(None)[: 20 * n_tokens])[:n_tokens])


def whole_processes(path: Path, args: argparse.Namespace) -> None:
    rate, rss = "decode_tokens_per_second", "peak_rss_mb"
    for label, tokens, new in (("decode", args.prompt_tokens, args.new),
                               ("prefill", args.prefill_tokens, 1)):  # fmt: skip
        prompt = prompt_of(path, tokens)
        ours = local.attnlm_cmd(str(path), prompt, new, args.threads, None)
        cmds = {"attnlm": ours,
                "attnlm float activations": ["env", "ATTNLM_GGML_ACTIVATIONS=float", *ours],
                "llama.cpp": local.peer_cmd("llamacpp", str(path), prompt, new,
                                            args.threads)}  # fmt: skip
        got = local.compare_processes(f"{label}, prompt {tokens}, {new} new tokens", cmds,
                                      args.rounds)  # fmt: skip
        if label == "decode":
            local.say("decode attnlm / llama.cpp", local.ratio(got, "attnlm", "llama.cpp", rate),
                      ">= 1.2x")  # fmt: skip
            local.say(
                "decode attnlm float activations / llama.cpp",
                local.ratio(got, "attnlm float activations", "llama.cpp", rate),
                "none",
            )
            local.say("peak RSS attnlm / llama.cpp", local.ratio(got, "attnlm", "llama.cpp", rss),
                      "<= 1.0x")  # fmt: skip
        else:
            local.say("prefill attnlm / llama.cpp (time ratio, inverse)",
                      local.ratio(got, "attnlm", "llama.cpp", "prefill_seconds", inverse=True),
                      ">= 1.2x")  # fmt: skip


def cpu_time(path: Path, steps: int) -> None:
    """One thread each, CPU time per decoding step, alternating token by token."""
    from llama_cpp import Llama

    from attnlm.base.ggufio import GGUFFile
    from attnlm.runtime.engine_gguf import open_engine

    llm = Llama(str(path), n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False)
    engine = open_engine(GGUFFile(path), None, 1)
    prompt = list(range(100, 164))
    llm.reset()
    llm.eval(prompt)
    engine.reset(1)
    engine.feed(np.array([prompt]), last_only=True)
    ours, theirs = [], []
    for i in range(steps):
        t0 = time.thread_time()
        engine.feed(np.array([[200 + i]]), last_only=True)
        t1 = time.thread_time()
        llm.eval([200 + i])
        ours.append(t1 - t0)
        theirs.append(time.thread_time() - t1)
    a, b = float(np.median(ours)), float(np.median(theirs))
    print(f"\n== CPU time per decoding step, one thread, median of {steps} (alternating)")
    print(f"   attnlm {a * 1e3:.2f} ms, llama.cpp {b * 1e3:.2f} ms")
    local.say("decode CPU time llama.cpp / attnlm", b / a, "none: a diagnostic")
    harness.emit({"bench": "kquant cpu_time", "attnlm_ms": a * 1e3, "llamacpp_ms": b * 1e3})


def prefill_cpu_time(path: Path, tokens: int, rounds: int) -> None:
    """One thread each, CPU time of a ``tokens``-token prefill, alternating."""
    from llama_cpp import Llama

    from attnlm.base.ggufio import GGUFFile
    from attnlm.generate import engine_decode
    from attnlm.runtime.engine_gguf import open_engine

    llm = Llama(str(path), n_ctx=tokens + 16, n_batch=tokens, n_ubatch=tokens, n_threads=1,
                n_threads_batch=1, verbose=False)  # fmt: skip
    engine = open_engine(GGUFFile(path), None, 1)
    prompt = [100 + i % 1000 for i in range(tokens)]
    ours, theirs = [], []
    for _ in range(rounds):
        engine.reset(1)
        t0 = time.thread_time()
        engine_decode._feed(engine, np.array([prompt]), last_only=True)
        t1 = time.thread_time()
        llm.reset()
        llm.eval(prompt)
        ours.append(t1 - t0)
        theirs.append(time.thread_time() - t1)
    a, b = float(np.median(ours)), float(np.median(theirs))
    print(f"\n== CPU time of a {tokens}-token prefill, one thread, median of {rounds}, alternating")
    print(f"   attnlm {a:.2f} s, llama.cpp {b:.2f} s")
    local.say("prefill CPU time llama.cpp / attnlm", b / a, "none: a diagnostic")
    harness.emit({"bench": "kquant prefill_cpu_time", "tokens": tokens, "attnlm_s": a,
                  "llamacpp_s": b})  # fmt: skip


def kernels(threads: int, rounds: int) -> None:
    """Each block type's product alone: float activations' time / integer activations'."""
    from attnlm import native
    from attnlm.base.ggufio import TENSOR_TYPES
    from attnlm.native import structs
    from attnlm.quant.blocks import SCALE_OFFSETS

    lib = native.library()
    if lib is None:
        raise SystemExit(f"no C step: {native.why_not}")
    n, k = 4096, 1536
    rng = np.random.default_rng(0)
    for rows, calls in ((1, 20), (64, 2)):
        x = rng.normal(size=(rows, k)).astype(np.float32)
        y, part = np.empty((rows, n), np.float32), np.empty(threads * rows * n, np.float32)
        print(f"\n== one product {n} x {k}, {rows} rows of x, {threads} threads, median of "
              f"{rounds}")  # fmt: skip
        for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K",
                     "Q3_K", "IQ4_NL", "IQ4_XS"):  # fmt: skip
            _, elements, size = next(t for t in TENSOR_TYPES.values() if t[0] == name)
            raw = rng.integers(0, 256, size=(n, k // elements * size), dtype=np.uint8)
            blocks = raw.reshape(-1, size)
            for at in SCALE_OFFSETS[name]:  # small finite float16 scales
                blocks[:, at : at + 2] = np.full((1, 1), 1e-3, np.float16).view(np.uint8)
            times: dict[int, list[float]] = {structs.ACT_FLOAT: [], structs.ACT_INT: []}
            for _ in range(rounds):
                for act in times:
                    layer = structs.Linear(structs.GGML_FORMATS[name], n, k, n, raw.ctypes.data,
                                           None, None, act)  # fmt: skip
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        lib.attnlm_linear(ctypes.byref(layer), x.ctypes.data, rows,
                                          y.ctypes.data, part.ctypes.data, threads)  # fmt: skip
                    times[act].append((time.perf_counter() - t0) / calls)
            f, i = (float(np.median(times[a])) for a in (structs.ACT_FLOAT, structs.ACT_INT))
            print(f"   {name}: float {f * 1e3:.3f} ms, integer {i * 1e3:.3f} ms: "
                  f"integer {f / i:.2f}x as fast")  # fmt: skip
            harness.emit({"bench": "kquant kernel", "type": name, "rows": rows,
                          "float_ms": f * 1e3, "int_ms": i * 1e3})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=128, help="new tokens per decode")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--path", help="a Q4_K_M llama GGUF file (default: SmolLM2 requantized)")
    ap.add_argument("--requantize", metavar="TYPE",
                    help="instead: Qwen2.5-Coder-1.5B-Instruct requantized to TYPE by llama.cpp "
                         "(Q3_K_M, Q2_K, IQ4_XS, IQ4_NL)")  # fmt: skip
    ap.add_argument(
        "--moe",
        nargs="?",
        const="qwen3moe",
        choices=sorted(MOE_KINDS),
        help="instead: a synthetic mixture of experts, Qwen3-MoE in Q4_K_M (MOE) or gpt-oss "
        "in MXFP4_MOE (GPTOSS)",
    )
    ap.add_argument("--cpu-time", action="store_true", help="only the one-thread CPU-time rows")
    ap.add_argument("--kernels", action="store_true", help="only the kernel rows")
    ap.add_argument("--prefill-cpu-time", action="store_true",
                    help="only the one-thread CPU time of a --prefill-tokens prefill")  # fmt: skip
    local.add_cpu_class_arguments(ap)
    args = harness.parse(ap, quick={"rounds": 1, "new": 8, "prompt_tokens": 16,
                                    "prefill_tokens": 32})  # fmt: skip
    local.use_cpu_class(args, peer=not args.kernels)
    harness.header("kquant", threads=args.threads, new=args.new, rounds=args.rounds,
                   simulate=args.simulate, llama_cpp_lib=args.llama_cpp_lib)  # fmt: skip
    if args.kernels:
        kernels(1, max(args.rounds, 5))  # one thread: two on a busy machine measure the queue
        return
    if not harness.require("kquant", "llama_cpp"):
        return
    if args.moe:
        path = moe_file(args.moe)
    else:
        path = Path(args.path) if args.path else default_file(args.requantize)
    if args.cpu_time:
        cpu_time(path, 16 if args.new < 32 else 64)
        return
    if args.prefill_cpu_time:
        prefill_cpu_time(path, args.prefill_tokens, args.rounds)
        return
    whole_processes(path, args)
    cpu_time(path, 16 if args.new < 32 else 64)


if __name__ == "__main__":
    sys.exit(main())
