"""Activation tracing and patching, ``attnlm.inspect`` against TransformerLens 4.3 (its
``TransformerBridge`` on the same Hugging Face folder, raw numerics), CPU, float32, 2 threads.

Each side runs in its own process (one per round, the two alternating), so that its peak RSS
(``wait4``) is the whole process's: imports, the model and the work. In a process the timed
call runs once untimed, then ``--reps`` (captures) or ``--sweep-reps`` (sweeps) times; the
median is the round's sample (wall and CPU seconds, all threads). Each child also reports its
peak RSS right after loading the model, its resident memory then and after the task, which say
whether the peak is the loading's or the task's. This parent process imports no torch (a
child's peak RSS starts at its parent's).

1. **capture**: every activation of one pass over a 16-token input: ``trace(model, ids)``
   (every hook name, each head's ``hook_result`` included) against ``bridge.run_with_cache(ids)``
   (all of the bridge's hooks, under ``torch.no_grad``).
2. **sweep**: a residual-stream patching sweep, ``blocks.L.hook_resid_pre`` of the first
   ``--sweep-layers`` layers x 16 positions, clean into corrupt, the logit difference's
   fraction recovered. attnlm: the resid half of ``attnlm.inspect.experiments.patching`` written
   out through ``trace`` (the clean run capturing the residual streams, the corrupt run, then one
   batched pass of layers x positions rows with ``hook`` interventions, as ``patching`` does;
   ``patching`` itself also sweeps the heads, in a second batched pass). TransformerLens: the
   clean ``run_with_cache`` (the resid_pre hooks), the corrupt forward, and
   ``transformer_lens.patching.generic_activation_patch`` with ``layer_pos_patch_setter``
   (what ``get_act_patch_resid_pre`` runs): one ``run_with_hooks`` forward per (layer,
   position), as its docs and demos do (its patching functions do not batch patches). Both
   sides' sweeps are printed as their largest difference.
3. **plain forward**: "nothing is slower when no trace runs": ``model(ids)`` with the current
   ``src/attnlm/models/decoder.py`` against its version before tracing (``git show
   8584c0e:src/attnlm/models/decoder.py``, loaded as a separate module; the same model object's
   weights under a subclass whose ``forward`` is the old one), alternating in one process.

Models: a random GPT-2-small-shaped model (12 layers, width 768, 12 heads, vocabulary 50,257;
``transformers``' own random init, kept in the cache) on 16 random token ids, and SmolLM2-135M's
Hugging Face export (``attnlm export``; 30 layers, the sweep on its first 12) on a 16-token
sentence.

Targets (issue 46): attnlm's time <= 0.5x TransformerLens's; its peak RSS <= 0.7x.

Run: ``.venv/bin/python benchmarks/bench_interp.py [--rounds 3] [--models gpt2-small smollm2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import harness  # benchmarks/harness.py: alternating runs, medians, JSON lines

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",
}
MEMORY_MARKS = ("load_peak_mib", "loaded_mib", "end_rss_mib")
BEFORE = "8584c0e"  # the commit before tracing: its decoder.py is the plain forward's baseline
#: 16 tokens in SmolLM2's tokenizer, both; the answer " Mary", the wrong one " John"
SMOL_CLEAN = "Then, when Mary and John went to the store, John gave a drink to"
SMOL_CORRUPT = "Then, when Mary and John went to the store, Mary gave a drink to"


# -- the parent: models, inputs, rounds --------------------------------------------------------


def _env(threads: int) -> dict[str, str]:
    """The children's environment: offline, ``threads`` BLAS/OpenMP threads (what
    ``harness.set_threads`` sets; the children call it too, for torch)."""
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(ROOT / "tests")}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _gpt2_folder(args: argparse.Namespace, env: dict[str, str]) -> Path:
    """The random GPT-2 folder (made once, in a child, kept in the cache)."""
    from attnlm.base.fileio import cache_dir

    shape = f"{args.gpt2_layers}x{args.gpt2_width}x{args.gpt2_vocab}"
    folder = cache_dir() / "bench" / f"gpt2-random-{shape}"
    if not (folder / "tokenizer.json").is_file():
        harness.run_process(
            [
                sys.executable,
                __file__,
                "--make-gpt2",
                str(folder),
                "--gpt2-layers",
                str(args.gpt2_layers),
                "--gpt2-width",
                str(args.gpt2_width),
                "--gpt2-vocab",
                str(args.gpt2_vocab),
            ],
            env=env,
        )
    return folder


def _smollm2_folder(env: dict[str, str]) -> Path:
    """SmolLM2 as a Hugging Face folder (made once, kept in the cache)."""
    from attnlm.base.fileio import cache_dir

    folder = cache_dir() / "bench" / "smollm2-hf"
    if not (folder / "config.json").is_file():
        cmd = harness.attnlm_command(
            "export", "--model", "smollm2-135m-instruct", "--out", str(folder)
        )
        harness.run_process(cmd, env=env)
    return folder


def _inputs(name: str, folder: Path, positions: int, vocab: int) -> dict[str, object]:
    """Clean and corrupt ids (``positions`` each), the answer and the wrong token."""
    if name == "smollm2":
        from attnlm.tokenizers import load  # no torch

        tok = load(folder)
        clean, corrupt = tok.encode(SMOL_CLEAN)[:positions], tok.encode(SMOL_CORRUPT)[:positions]
        answer, wrong = tok.encode(" Mary")[0], tok.encode(" John")[0]
    else:
        rng = random.Random(0)
        clean = [rng.randrange(vocab) for _ in range(positions)]
        corrupt = list(clean)
        corrupt[positions // 2] = (clean[positions // 2] + 1) % vocab
        answer, wrong = rng.randrange(vocab), rng.randrange(vocab)
    return {"clean": clean, "corrupt": corrupt, "answer": answer, "wrong": wrong}


def _child(
    args: argparse.Namespace, side: str, task: str, folder: Path, inputs: dict, env: dict[str, str]
) -> tuple[harness.Sample, float, dict]:
    """One worker process: (its median sample, its peak RSS in MiB, what it printed)."""
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        side,
        task,
        str(folder),
        "--inputs",
        json.dumps(inputs),
        "--reps",
        str(args.reps),
        "--sweep-reps",
        str(args.sweep_reps),
        "--threads",
        str(args.threads),
        "--sweep-layers",
        str(args.sweep_layers),
        "--plain-reps",
        str(args.plain_reps),
    ]
    if task == "plain":
        cmd += ["--before", str(args.before_file)]
    run = harness.run_process(cmd, env=env)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    return harness.Sample(out["wall"], out["cpu"]), run.peak_rss_mib, out


def _compare(
    args: argparse.Namespace,
    name: str,
    task: str,
    folder: Path,
    inputs: dict,
    env: dict[str, str],
    what: str,
) -> None:
    samples: dict[str, list[harness.Sample]] = {"attnlm": [], "transformer-lens": []}
    rss: dict[str, list[float]] = {"attnlm": [], "transformer-lens": []}
    outs: dict[str, dict] = {}

    def contender(side: str):
        def run() -> harness.Sample:
            sample, peak, outs[side] = _child(args, side, task, folder, inputs, env)
            rss[side].append(peak)
            return sample

        return run

    samples = harness.alternate({s: contender(s) for s in samples}, rounds=args.rounds, swap=True)
    peak = {s: harness.median(v) for s, v in rss.items()}
    ratio = peak["attnlm"] / peak["transformer-lens"]
    extra: dict[str, object] = {"model": name, "peak_rss_mib": peak, "rss_ratio": ratio}
    print(f"  {name} {task}: {what}")
    if task == "sweep":
        a, t = outs["attnlm"]["result"], outs["transformer-lens"]["result"]
        diff = max(
            abs(x - y) for ra, rt in zip(a, t, strict=True) for x, y in zip(ra, rt, strict=True)
        )
        extra["max_abs_diff"] = diff
        print(
            f"  {name} {task}: {len(a)} layers x {len(a[0])} positions, largest difference "
            f"between the two sides' fractions {diff:.1e}"
        )
    else:
        extra["tensors"] = {s: o["tensors"] for s, o in outs.items()}
        print(
            f"  {name} {task}: tensors captured: attnlm {outs['attnlm']['tensors']}, "
            f"transformer-lens {outs['transformer-lens']['tensors']}"
        )
    print(
        f"  {name} {task}: peak RSS attnlm {peak['attnlm']:.0f} MiB, transformer-lens "
        f"{peak['transformer-lens']:.0f} MiB: ratio {ratio:.2f}x; target <= 0.7x"
    )
    for side, o in outs.items():  # where the peak comes from (the last round's process)
        extra[f"{side}_memory"] = {k: round(o[k]) for k in MEMORY_MARKS}
        print(
            f"  {name} {task}: {side}: peak while loading the model {o['load_peak_mib']:.0f} "
            f"MiB, resident after loading {o['loaded_mib']:.0f} MiB, after the task "
            f"{o['end_rss_mib']:.0f} MiB"
        )
    harness.report(
        f"interp {task} {name}",
        samples,
        ours="attnlm",
        peer="transformer-lens",
        target="<= 0.5x time, <= 0.7x peak RSS",
        **extra,
    )


def _plain(
    args: argparse.Namespace, name: str, folder: Path, inputs: dict, env: dict[str, str]
) -> None:
    _, _, out = _child(args, "attnlm", "plain", folder, inputs, env)
    runs = {
        "current": [harness.Sample(*s) for s in out["current"]],
        BEFORE: [harness.Sample(*s) for s in out["before"]],
    }
    print(
        f"  {name} plain forward: {len(runs['current'])} alternating calls per side, "
        f"logits equal: {out['equal']}"
    )
    harness.report(
        f"interp plain forward {name}",
        runs,
        ours="current",
        peer=BEFORE,
        target="<= 1.0x (no slower)",
        model=name,
        logits_equal=out["equal"],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models", nargs="+", default=["gpt2-small", "smollm2"], choices=["gpt2-small", "smollm2"]
    )
    ap.add_argument("--rounds", type=int, default=3, help="processes per side and task")
    ap.add_argument("--reps", type=int, default=5, help="timed captures per process (median)")
    ap.add_argument("--sweep-reps", type=int, default=3, help="timed sweeps per process")
    ap.add_argument("--plain-reps", type=int, default=40, help="plain forwards per side")
    ap.add_argument("--sweep-layers", type=int, default=12)
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpt2-layers", type=int, default=12)
    ap.add_argument("--gpt2-width", type=int, default=768)
    ap.add_argument("--gpt2-vocab", type=int, default=50257)
    ap.add_argument("--worker", nargs=3, metavar=("SIDE", "TASK", "FOLDER"), help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--before", help=argparse.SUPPRESS)
    ap.add_argument("--make-gpt2", help=argparse.SUPPRESS)
    args = harness.parse(
        ap,
        quick={
            "models": ["gpt2-small"],
            "rounds": 1,
            "reps": 2,
            "sweep_reps": 1,
            "plain_reps": 5,
            "sweep_layers": 2,
            "positions": 8,
            "gpt2_layers": 2,
            "gpt2_width": 128,
            "gpt2_vocab": 1000,
        },
    )
    if args.worker:
        return worker(args)
    if args.make_gpt2:
        return make_gpt2(args)
    env = _env(args.threads)
    os.environ.update(
        {k: env[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    )
    harness.header(
        "interp",
        threads=args.threads,
        rounds=args.rounds,
        reps=args.reps,
        sweep_layers=args.sweep_layers,
        positions=args.positions,
    )
    if not harness.require("interp", "transformer_lens", "transformers", "pandas"):
        return None
    work = Path(tempfile.mkdtemp(prefix="bench-interp-"))
    args.before_file = work / f"decoder_{BEFORE}.py"
    args.before_file.write_text(
        subprocess.run(
            ["git", "show", f"{BEFORE}:src/attnlm/models/decoder.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    for name in args.models:
        if name == "smollm2":
            folder = _smollm2_folder(env)
            vocab = 49152
        else:
            folder = _gpt2_folder(args, env)
            vocab = args.gpt2_vocab
            if (args.gpt2_layers, args.gpt2_width, vocab) != (12, 768, 50257):
                name = f"gpt2-random-{args.gpt2_layers}x{args.gpt2_width}x{vocab}"
        inputs = _inputs(name, folder, args.positions, vocab)
        if len(inputs["clean"]) != args.positions or len(inputs["corrupt"]) != args.positions:
            raise SystemExit(f"{name}: the inputs are not {args.positions} tokens")
        P, L = args.positions, args.sweep_layers
        _compare(
            args,
            name,
            "capture",
            folder,
            inputs,
            env,
            f"every activation of one pass over {P} tokens",
        )
        _compare(
            args,
            name,
            "sweep",
            folder,
            inputs,
            env,
            f"resid_pre patching, {L} layers x {P} positions "
            f"(attnlm: 1 batched pass of {L * P} rows; TL: {L * P} forwards)",
        )
        _plain(args, name, folder, inputs, env)
    return None


# -- the children ------------------------------------------------------------------------------


def make_gpt2(args: argparse.Namespace) -> None:
    """A random GPT-2 (``transformers``' init, seed 0) saved to ``--make-gpt2`` with a small
    byte-level BPE tokenizer (attnlm's loader wants one; the benchmark feeds ids)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from support_tl import bpe_tokenizer

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=args.gpt2_layers,
        n_embd=args.gpt2_width,
        n_head=max(1, args.gpt2_width // 64),
        vocab_size=args.gpt2_vocab,
        n_positions=1024,
    )
    GPT2LMHeadModel(cfg).eval().save_pretrained(args.make_gpt2)
    bpe_tokenizer(300).save_pretrained(args.make_gpt2)


def worker(args: argparse.Namespace) -> None:
    """One side's task in this process; prints one JSON line (median wall / CPU seconds of
    ``--reps`` timed calls after an untimed one, and what the task found)."""
    harness.set_threads(args.threads)
    import torch

    side, task, folder = args.worker
    inp = json.loads(args.inputs)
    clean, corrupt = torch.tensor([inp["clean"]]), torch.tensor([inp["corrupt"]])
    a, w = inp["answer"], inp["wrong"]
    if task == "plain":
        return _worker_plain(args, folder, clean)
    if side == "attnlm":
        from attnlm.loading.sources import resolve

        model = resolve(folder, "cpu", "f32").model
        fn = (
            (lambda: _attnlm_capture(model, clean))
            if task == "capture"
            else (lambda: _attnlm_sweep(model, clean, corrupt, a, w, args.sweep_layers))
        )
    else:
        from support_tl import boot

        bridge = boot(folder)
        fn = (
            (lambda: _tl_capture(bridge, clean))
            if task == "capture"
            else (lambda: _tl_sweep(bridge, clean, corrupt, a, w, args.sweep_layers))
        )
    loaded = {"load_peak_mib": _peak_mib(), "loaded_mib": _rss_mib()}
    result = fn()  # untimed: first-call costs (allocations, kernels' dispatch)
    reps = args.reps if task == "capture" else args.sweep_reps
    samples = [harness.time_call(fn) for _ in range(reps)]
    out = {
        "wall": harness.median(s.wall for s in samples),
        "cpu": harness.median(s.cpu for s in samples),
        **loaded,
        "end_rss_mib": _rss_mib(),
    }
    if task == "capture":
        out["tensors"] = result
    else:
        out["result"] = result
    print(json.dumps(out), flush=True)
    return None


def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _rss_mib() -> float:
    """This process's resident memory now (``/proc/self/statm``), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _attnlm_capture(model, ids) -> int:
    from attnlm.inspect.trace import trace

    return len(trace(model, ids))


def _tl_capture(bridge, ids) -> int:
    import torch

    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    return len(cache)


def _attnlm_sweep(model, clean, corrupt, a: int, w: int, layers: int) -> list[list[float]]:
    """The resid half of ``attnlm.inspect.experiments.patching``: its ``patch_sweep`` (the
    patches batched, 512 tokens per pass) through ``trace``."""
    from attnlm.inspect.experiments import patch_sweep, put_position
    from attnlm.inspect.trace import trace

    T = clean.shape[1]
    names = [f"blocks.{i}.hook_resid_pre" for i in range(layers)]
    src = trace(model, clean, names=names, last_only=True)
    base = trace(model, corrupt, names=[], last_only=True)

    def diff(logits):
        last = logits[:, -1].float()
        return last[:, a] - last[:, w]

    clean_d, corrupt_d = float(diff(src.logits)[0]), float(diff(base.logits)[0])
    d = patch_sweep(model, src, corrupt[0].tolist(), names, T, put_position, diff)
    return ((d - corrupt_d) / (clean_d - corrupt_d)).view(layers, T).tolist()


def _tl_sweep(bridge, clean, corrupt, a: int, w: int, layers: int) -> list[list[float]]:
    """TransformerLens's own activation patching of resid_pre, one forward per patch."""
    import pandas as pd
    import torch
    from transformer_lens import patching

    T = clean.shape[1]
    with torch.no_grad():
        names = [f"blocks.{i}.hook_resid_pre" for i in range(layers)]
        clean_logits, cache = bridge.run_with_cache(clean, names_filter=names)
        corrupt_logits = bridge(corrupt)

        def diff(logits):
            return logits[0, -1, a] - logits[0, -1, w]

        clean_d, corrupt_d = diff(clean_logits), diff(corrupt_logits)

        def metric(logits):
            return (diff(logits) - corrupt_d) / (clean_d - corrupt_d)

        index = pd.DataFrame(
            [(i, p) for i in range(layers) for p in range(T)], columns=["layer", "pos"]
        )
        out = patching.generic_activation_patch(
            bridge,
            corrupt,
            cache,
            metric,
            patching.layer_pos_patch_setter,
            "resid_pre",
            index_df=index,
        )
    return out.view(layers, T).tolist()


def _worker_plain(args: argparse.Namespace, folder: str, ids) -> None:
    """``model(ids)`` with the current decoder and with its version before tracing, the same
    weights, alternating (the order swapped every other round)."""
    import copy
    import importlib.util

    import torch

    from attnlm.loading.sources import resolve

    spec = importlib.util.spec_from_file_location(f"attnlm_decoder_{BEFORE}", args.before)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    model = resolve(folder, "cpu", "f32").model
    cls = type(model)
    before = copy.copy(model)  # the same parameters and modules
    before.__class__ = type(f"{cls.__name__}Before", (cls,), {"forward": old.Decoder.forward})

    def call(m):
        def run():
            with torch.inference_mode():
                return m(ids)

        return run

    with torch.inference_mode():
        equal = bool(torch.equal(model(ids).logits, before(ids).logits))
    runs = harness.alternate(
        {
            "current": lambda: harness.time_call(call(model)),
            "before": lambda: harness.time_call(call(before)),
        },
        rounds=args.plain_reps,
        swap=True,
    )
    out = {
        "wall": 0.0,
        "cpu": 0.0,
        "equal": equal,
        "current": [(s.wall, s.cpu) for s in runs["current"]],
        "before": [(s.wall, s.cpu) for s in runs["before"]],
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
