"""``attnlm eval --task`` against lm-evaluation-harness (its Hugging Face backend) on the same
model folder and the same task, whole processes as a user runs them, 2 threads.

The model is SmolLM2-135M-Instruct exported from its GGUF file as a Hugging Face folder
(``attnlm export --out``, float32; both tools read that folder). The task is the built-in
``tatoeba-mc`` (1,000 four-choice examples) written as a task folder, and for lm-evaluation-harness
as the equal YAML over the same local files (:func:`attnlm.tasks.lmeval.lm_eval_yaml`), run
offline. lm-evaluation-harness runs with its default batch size (1); ``--peer-batch-size`` changes
it. Both sides' ``acc`` and ``acc_norm`` are printed and must be equal.

Target (issue 47): attnlm's time <= 0.33x lm-evaluation-harness's.

Run: ``.venv/bin/python benchmarks/bench_eval_tasks.py [--shots 0] [--limit N] [--rounds 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import harness  # benchmarks/harness.py: alternating runs, medians, JSON lines

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}  # fmt: skip


def _export(folder: Path) -> Path:
    """SmolLM2 as a Hugging Face folder (made once, kept in the cache)."""
    if not (folder / "config.json").is_file():
        cmd = harness.attnlm_command("export", "--model", "smollm2-135m-instruct", "--out",
                                     str(folder))  # fmt: skip
        harness.run_process(cmd)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="the first N examples only")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer-batch-size", default="1")
    args = harness.parse(ap, quick={"limit": 20, "rounds": 1})
    harness.set_threads(args.threads)
    harness.header("eval_tasks", shots=args.shots, limit=args.limit, threads=args.threads)
    if not harness.require("eval_tasks", "lm_eval", "transformers"):
        return
    from attnlm.base.fileio import cache_dir
    from attnlm.tasks.builtin import tatoeba_mc

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support_lmeval import write_lm_eval_task

    hf = _export(cache_dir() / "bench" / "smollm2-hf")
    work = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    task = tatoeba_mc().limited(args.limit)
    yaml_dir = write_lm_eval_task(task, work, "attnlm_tatoeba_mc")
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(work / "hf-datasets")}
    ours_out, peer_out = work / "ours.json", work / "peer"
    ours_cmd = harness.attnlm_command(
        "eval", "--model", str(hf), "--task", str(work / "data"), "--num-fewshot",
        str(args.shots), "--threads", str(args.threads), "--json", "--no-progress",
    )  # fmt: skip
    peer_cmd = [
        str(Path(sys.executable).parent / "lm_eval"), "run", "--model", "hf", "--model_args",
        f"pretrained={hf},dtype=float32", "--device", "cpu", "--tasks", "attnlm_tatoeba_mc",
        "--include_path", str(yaml_dir), "--num_fewshot", str(args.shots), "--batch_size",
        args.peer_batch_size, "--output_path", str(peer_out),
    ]  # fmt: skip
    runs = harness.alternate(
        {
            "attnlm": lambda: harness.time_process(ours_cmd, stdout=ours_out, env=env),
            "lm-eval": lambda: harness.time_process(peer_cmd, env=env),
        },
        rounds=args.rounds,
    )
    ours = json.loads(ours_out.read_text())["results"][0]["metrics"]
    peer_file = max(peer_out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    peer = json.loads(peer_file.read_text())["results"]["attnlm_tatoeba_mc"]
    same = ours["acc"] == peer["acc,none"] and ours["acc_norm"] == peer["acc_norm,none"]
    print(f"  attnlm  acc {ours['acc']:.4f}  acc_norm {ours['acc_norm']:.4f}")
    print(f"  lm-eval acc {peer['acc,none']:.4f}  acc_norm {peer['acc_norm,none']:.4f}"
          f"  ({'equal' if same else 'DIFFERENT'})")  # fmt: skip
    harness.report(f"eval --task tatoeba-mc ({len(task.test)} examples, {args.shots}-shot)",
                   runs, ours="attnlm", peer="lm-eval", target="<= 0.33x time",
                   acc=ours["acc"], acc_norm=ours["acc_norm"], metrics_equal=same)  # fmt: skip


if __name__ == "__main__":
    main()
