"""Fine-tuning defaults per machine class: the one table ``attnlm train --init-from`` takes its
settings from when the command line and a preset leave them out.

A fine-tune is judged by what it does in the minutes a user gives it, and what moves the
held-out loss fastest per second differs by machine: a GPU or a CPU with AMX runs wide
adapters and long windows for little more than narrow ones; a 2-core CPU without bfloat16
instructions pays for every extra product. :func:`machine_class` names the class of this
machine, :data:`TABLE` holds one :class:`Recipe` per class and kind of run (``lora`` or
``full``), :func:`describe` says in the run's first lines what was chosen and why, and
``attnlm train --show-defaults`` prints the whole table.

Machine classes (:data:`CLASSES`), decided once per process:

=====================  ===================================================================
``gpu``                the run's device is CUDA (or MPS)
``cpu-amx``            AMX tiles (``amx_tile`` and ``amx_bf16`` in ``/proc/cpuinfo``) and
                       bfloat16 products that run (:func:`attnlm.nn.grad_precision
                       .bf16_backward_support`, which tries one)
``cpu-avx512-bf16``    AVX512-BF16 without AMX, bfloat16 products that run
``cpu-avx512``         PyTorch's CPU capability ``AVX512`` without bfloat16 products
``cpu-avx2``           capability ``AVX2``
``cpu``                anything else
=====================  ===================================================================

The capability is PyTorch's own (``torch.backends.cpu.get_cpu_capability()``, which
``ATEN_CPU_CAPABILITY=avx2`` lowers) and oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``, e.g.
``AVX512_CORE`` to leave out bfloat16 and AMX) is honoured, so a machine of another class can
be simulated: ``ONEDNN_MAX_CPU_ISA=AVX512_CORE attnlm train ...`` runs as ``cpu-avx512``.

Measurement status: the recipes of ``cpu-avx512`` are measured
(``benchmarks/bench_finetune_quality.py --seconds 300 --threads 2 --simulate avx512``: held-out
bits/char after 300 s of wall-clock, against peft's recipe, on a quiet 2-core machine) and
``cpu-avx2`` / ``cpu`` take it unmeasured. Every other recipe holds the values fine-tuning had
before this table (:data:`TODAY_LORA`, :data:`TODAY_FULL`: a 256-token window, LoRA alpha 8 on
q and v as peft's defaults), marked ``UNMEASURED``: no GPU or AMX machine has run the
benchmark. Full fine-tuning's ``cpu-avx512`` row is measured the same way (``--full``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any

CLASSES = ("gpu", "cpu-amx", "cpu-avx512-bf16", "cpu-avx512", "cpu-avx2", "cpu")
KINDS = ("lora", "full")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below which bfloat16 products / AMX are off
_NO_BF16_ISA = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")
_NO_AMX_ISA = (*_NO_BF16_ISA, "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16")


@dataclass(frozen=True)
class Recipe:
    """The settings one machine class starts a fine-tune with (``kind``: ``lora`` or
    ``full``). ``measured``: where the values come from, in words (``UNMEASURED`` for values
    kept from before any measurement)."""

    lr: float
    min_lr: float
    warmup_iters: int
    batch_size: int
    block_size: int  # training window in tokens, at most the model's context (finetune.start_from)
    rank: int = 0  # LoRA rank for a bare --lora (0: full fine-tuning)
    alpha: float = 8.0  # LoRA alpha (scale alpha / rank)
    dropout: float = 0.0
    targets: str = "q,v"
    backward_precision: str = "float32"
    eval_iters: int = 10  # validation batches per evaluation (before, during and after)
    measured: str = "UNMEASURED"

    def train_table(self) -> dict[str, Any]:
        """The ``[train]`` entries this recipe sets (LoRA entries only for a LoRA recipe). The
        window is not one of them: :func:`attnlm.train.finetune.start_from` caps the model's
        context at :attr:`block_size` when ``train.block_size`` is 0."""
        table: dict[str, Any] = {
            "lr": self.lr,
            "min_lr": self.min_lr,
            "warmup_iters": self.warmup_iters,
            "batch_size": self.batch_size,
            "backward_precision": self.backward_precision,
            "eval_iters": self.eval_iters,
        }
        if self.rank:
            table.update(lora_alpha=self.alpha, lora_dropout=self.dropout,
                         lora_targets=self.targets)  # fmt: skip
        return table

    def summary(self) -> str:
        """One line: the recipe's settings."""
        lora = ""
        if self.rank:
            lora = (f"LoRA r {self.rank}, alpha {self.alpha:g}, dropout {self.dropout:g}, "
                    f"targets {self.targets}; ")  # fmt: skip
        bwd = (
            "" if self.backward_precision == "float32" else f"; {self.backward_precision} backward"
        )
        return (f"{lora}lr {self.lr:g} (warmup {self.warmup_iters} steps, cosine to "
                f"{self.min_lr:g} over the run or its time budget), batch {self.batch_size} x "
                f"{self.block_size} tokens{bwd}, {self.eval_iters} validation batches")  # fmt: skip


#: a fine-tune's settings that no machine class changes
RUN_SETTINGS = {"weight_decay": 0.0, "max_iters": 1000, "eval_interval": 100}
# UNMEASURED: the values fine-tuning used before this table (train.finetune.FINETUNE_TRAIN,
# 256-token windows; LoRA alpha 8 on q,v as peft's LoraConfig). The measurement that replaces
# them per class: benchmarks/bench_finetune_quality.py on a quiet machine of that class.
TODAY_LORA = Recipe(lr=1e-4, min_lr=1e-5, warmup_iters=10, batch_size=8, block_size=256,
                     rank=8, alpha=8.0, dropout=0.0, targets="q,v")  # fmt: skip
TODAY_FULL = Recipe(lr=1e-4, min_lr=1e-5, warmup_iters=10, batch_size=8, block_size=256)
MEASURED_CPU_LORA = "measured: -4.7% held-out bits/char in 300 s, peft's recipe -1.2%"

# A CPU without bfloat16 products: short windows and small batches take several times the
# steps of 8 x 256 in the same seconds, and a high rate on every linear layer moves the
# held-out loss in them (the measurement: docs/finetuning.md, docs/benchmarks.md).
CPU_LORA = Recipe(lr=1e-3, min_lr=1e-5, warmup_iters=10, batch_size=4, block_size=128,
                  rank=8, alpha=16.0, dropout=0.0, targets="all",
                  measured=MEASURED_CPU_LORA)  # fmt: skip
#: the same recipe on CPUs of the classes below, which were not measured themselves
CPU_LORA_BELOW = dataclasses.replace(CPU_LORA, measured="cpu-avx512's, not measured here")
# full fine-tuning: the short windows' extra steps beat 8 x 256's (bench_finetune_quality --full)
MEASURED_CPU_FULL = "measured: -4.73% held-out bits/char in 300 s, 8 x 256 -4.48%"
CPU_FULL = Recipe(lr=1e-4, min_lr=1e-5, warmup_iters=10, batch_size=4, block_size=128,
                  measured=MEASURED_CPU_FULL)  # fmt: skip
CPU_FULL_BELOW = dataclasses.replace(CPU_FULL, measured="cpu-avx512's, not measured here")

#: machine class -> kind of run -> recipe (edit here when a class is measured; say how in
#: ``measured``)
TABLE: dict[str, dict[str, Recipe]] = {
    "gpu": {"lora": TODAY_LORA, "full": TODAY_FULL},  # UNMEASURED (no GPU lent yet)
    "cpu-amx": {"lora": TODAY_LORA, "full": TODAY_FULL},  # UNMEASURED (no AMX CPU here)
    "cpu-avx512-bf16": {"lora": TODAY_LORA, "full": TODAY_FULL},  # UNMEASURED
    "cpu-avx512": {"lora": CPU_LORA, "full": CPU_FULL},
    "cpu-avx2": {"lora": CPU_LORA_BELOW, "full": CPU_FULL_BELOW},
    "cpu": {"lora": CPU_LORA_BELOW, "full": CPU_FULL_BELOW},
}


@dataclass(frozen=True)
class Machine:
    """The detected machine class and the evidence for it (``why``: one line)."""

    name: str
    why: str


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_class(flags: set[str], capability: str, onednn_isa: str, bf16_runs: bool) -> Machine:
    """The CPU's class from its ``/proc/cpuinfo`` ``flags``, PyTorch's ``capability``
    (``AVX512``, ``AVX2``, ``DEFAULT``...), the ``ONEDNN_MAX_CPU_ISA`` cap (empty: none) and
    whether bfloat16 products run (see the module docstring)."""
    isa = onednn_isa.upper()
    cap = capability.upper()
    bf16 = bf16_runs and isa not in _NO_BF16_ISA
    amx = bf16 and {"amx_tile", "amx_bf16"} <= flags and isa not in _NO_AMX_ISA
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    why = (f"PyTorch CPU capability {capability or '?'}, flags {' '.join(shown) or 'none'}"
           + (f", ONEDNN_MAX_CPU_ISA={onednn_isa}" if onednn_isa else "")
           + ("; bfloat16 products run" if bf16 else "; no bfloat16 products"))  # fmt: skip
    if amx:
        name = "cpu-amx"
    elif bf16 and cap.startswith("AVX512"):
        name = "cpu-avx512-bf16"
    elif cap.startswith("AVX512"):
        name = "cpu-avx512"
    elif cap.startswith("AVX2"):
        name = "cpu-avx2"
    else:
        name = "cpu"
    return Machine(name, why)


@functools.cache
def _this_cpu() -> Machine:
    import torch

    from attnlm.nn.grad_precision import bf16_backward_support

    capability = torch.backends.cpu.get_cpu_capability()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "") or os.environ.get("DNNL_MAX_CPU_ISA", "")
    return cpu_class(_cpu_flags(), capability, isa, bf16_backward_support() is None)


def machine_class(device: Any = "auto") -> Machine:
    """The class of the machine a run on ``device`` (``auto``, ``cpu``, ``cuda``...) trains on."""
    from attnlm.base.device import resolve_device

    dev = resolve_device(str(device or "auto"))
    if dev.type in ("cuda", "mps"):
        import torch

        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "Apple GPU"
        return Machine("gpu", f"device {dev} ({name})")
    return _this_cpu()


def recipe(machine: str, kind: str) -> Recipe:
    """The :class:`Recipe` of a machine class for a ``lora`` or ``full`` run."""
    return TABLE[machine][kind]


def default_window(device: Any, lora: int) -> int:
    """The training window of a fine-tune that names none: this machine's recipe's."""
    return recipe(machine_class(device).name, "lora" if lora else "full").block_size


def chosen_train_table(machine: str, lora: int | None) -> dict[str, Any]:
    """The ``[train]`` table a fine-tune starts from on ``machine``: the class's recipe
    (``lora``: the rank given, -1 for a bare ``--lora``, None or 0 for full fine-tuning) over
    the run settings that no class changes (:data:`RUN_SETTINGS`)."""
    kind = "lora" if lora else "full"
    table = {**RUN_SETTINGS, **recipe(machine, kind).train_table()}
    if lora == -1:
        table["lora"] = recipe(machine, kind).rank
    return table


def describe(machine: Machine, lora: int | None, given: dict[str, Any]) -> list[str]:
    """The run's first lines: the machine class and why, the recipe taken from the table, and
    which settings the command line or preset gave instead (``given``: field -> value)."""
    kind = "lora" if lora else "full"
    r = recipe(machine.name, kind)
    if lora and lora != -1:
        r = dataclasses.replace(r, rank=lora)
    lines = [
        f"defaults: machine class {machine.name} ({machine.why})",
        f"defaults: {kind} fine-tuning recipe for {machine.name} ({r.measured}): {r.summary()}",
    ]
    if given:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(given.items()))
        lines.append(f"defaults: given instead: {shown}")
    return lines


def table_lines(current: str | None = None) -> list[str]:
    """The whole table, one line per class and kind (``attnlm train --show-defaults``);
    ``current``: the detected class, marked with ``*``."""
    out = []
    for name in CLASSES:
        for kind in KINDS:
            mark = "*" if name == current else " "
            r = TABLE[name][kind]
            out.append(f"{mark} {name:<16} {kind:<5} {r.summary()} [{r.measured}]")
    return out
