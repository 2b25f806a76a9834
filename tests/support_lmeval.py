"""Run lm-evaluation-harness (its Hugging Face backend, float32, on the CPU) on an attnlm task
through the YAML :func:`attnlm.tasks.lmeval.lm_eval_yaml` writes, offline; the parity tests
and ``benchmarks/bench_eval_tasks.py`` use it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlm.tasks.files import Task, write_task
from attnlm.tasks.lmeval import lm_eval_yaml

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "DISABLE_MULTIPROC": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def write_lm_eval_task(task: Task, workdir: Path, name: str = "attnlm_parity") -> Path:
    """The task as a folder and its YAML beside it; returns the folder holding the YAML."""
    data = write_task(task, workdir / "data")
    yaml_dir = workdir / "yaml"
    yaml_dir.mkdir(parents=True, exist_ok=True)
    (yaml_dir / f"{name}.yaml").write_text(lm_eval_yaml(task, data, name), encoding="utf-8")
    return yaml_dir


def run_lm_eval(
    hf_folder: Path, task: Task, shots: int, workdir: Path, *, limit: int | None = None,
    batch_size: int = 1, seed: int = 1234,
) -> dict[str, Any]:  # fmt: skip
    """lm-evaluation-harness's results and per-example samples (sorted by doc id)."""
    os.environ.update(OFFLINE)
    os.environ.setdefault("HF_DATASETS_CACHE", str(workdir / "hf-datasets"))
    import lm_eval
    from lm_eval.tasks import TaskManager

    name = "attnlm_parity"
    yaml_dir = write_lm_eval_task(task, workdir, name)
    out = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={hf_folder},dtype=float32,device=cpu",
        tasks=[name], num_fewshot=shots, batch_size=batch_size, limit=limit,
        task_manager=TaskManager(include_path=str(yaml_dir), include_defaults=False),
        log_samples=True,
        fewshot_random_seed=seed, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
        bootstrap_iters=0,
    )  # fmt: skip
    samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
    return {"results": out["results"][name], "samples": samples}


def per_example(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(log-likelihoods, greedy flags, metrics) of each lm-eval sample."""
    rows = []
    for s in samples:
        resps = [r[0] for r in s["resps"]]  # one (ll, is_greedy) per request
        rows.append({"doc_id": s["doc_id"], "lls": [float(r[0]) for r in resps],
                     "greedy": [bool(r[1]) for r in resps],
                     "acc": s.get("acc"), "acc_norm": s.get("acc_norm"),
                     "arguments": s.get("arguments")})  # fmt: skip
    return rows
