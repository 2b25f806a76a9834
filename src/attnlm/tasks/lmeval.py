"""The lm-evaluation-harness task equal to an attnlm task, so that the two can be run side by
side (the parity tests and ``benchmarks/bench_eval_tasks.py`` do; a user can too).

:func:`lm_eval_yaml` writes the YAML of a task folder (:func:`attnlm.tasks.files.write_task`):
the ``json`` dataset over its local files (no download), the same fields, delimiters and
metrics. A cloze task becomes lm-evaluation-harness's ``loglikelihood`` type, whose request does
not insert the target delimiter: the delimiter goes into ``doc_to_target`` and the YAML's own
delimiter is empty, which gives the same prompts and continuations.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlm.tasks.files import Task

_METRICS = {
    "multiple_choice": ("acc", "acc_norm"),
    "cloze": ("perplexity", "acc"),
    "generation": ("exact_match",),
}
_AGGREGATION = {"perplexity": "perplexity"}
_LOWER_IS_BETTER = {"perplexity"}


def _q(text: str) -> str:
    """A YAML scalar: JSON's double-quoted strings are valid YAML."""
    return json.dumps(text, ensure_ascii=False)


def lm_eval_yaml(task: Task, folder: str | Path, name: str) -> str:
    """The YAML of lm-evaluation-harness task ``name`` over the task folder ``folder``."""
    folder = Path(folder).resolve()
    files = {"test": str(folder / "test.jsonl")}
    if task.train:
        files["train"] = str(folder / "train.jsonl")
    lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:"]
    lines += [f"    {split}: {_q(path)}" for split, path in files.items()]
    lines += ["test_split: test"]
    if task.train:
        lines += ["training_split: train", "fewshot_split: train"]
    target_delimiter = task.target_delimiter
    if task.kind == "multiple_choice":
        lines += ["output_type: multiple_choice", "doc_to_text: context",
                  "doc_to_choice: choices", "doc_to_target: gold"]  # fmt: skip
    elif task.kind == "cloze":
        lines += [
            "output_type: loglikelihood",
            "doc_to_text: context",
            f"doc_to_target: {_q(_jinja_literal(task.target_delimiter) + '{{target}}')}",
        ]
        target_delimiter = ""
    else:
        lines += ["output_type: generate_until", "doc_to_text: prompt", "doc_to_target: answer",
                  "generation_kwargs:", "  until: [" + ", ".join(_q(s) for s in task.stops) + "]",
                  "  do_sample: false", f"  max_gen_toks: {task.max_gen_toks}"]  # fmt: skip
    lines += [f"target_delimiter: {_q(target_delimiter)}",
              f"fewshot_delimiter: {_q(task.fewshot_delimiter)}"]  # fmt: skip
    if task.description:
        lines.append(f"description: {_q(task.description)}")
    lines.append("metric_list:")
    for metric in _METRICS[task.kind]:
        better = str(metric not in _LOWER_IS_BETTER).lower()
        lines += [f"  - metric: {metric}", f"    aggregation: {_AGGREGATION.get(metric, 'mean')}",
                  f"    higher_is_better: {better}"]  # fmt: skip
        if metric == "exact_match":
            flags = {"ignore_case": task.ignore_case, "ignore_punctuation": task.ignore_punctuation}
            lines += [f"    {k}: {str(v).lower()}" for k, v in flags.items()]
    return "\n".join(lines) + "\n"


def _jinja_literal(text: str) -> str:
    """``text`` as it must appear inside a Jinja template (a literal; braces escaped)."""
    return text.replace("{", "{{ '{' }}") if "{" in text else text
