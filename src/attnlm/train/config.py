"""Training configuration: the ``[train]`` table of a preset as a frozen dataclass.

A preset (``attnlm/configs/NAME.toml``) has a ``[model]`` table (``type``, the model family,
``gpt`` when absent, and that family's config fields except ``vocab_size``, which comes from the
tokenizer) and a ``[train]`` table (:class:`TrainConfig`).
CLI flags and ``--set table.key=value`` override single values; unknown keys and bad values raise
:class:`~attnlm.base.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from attnlm.base.config import from_dict, load_preset, parse_override
from attnlm.base.errors import ConfigError
from attnlm.base.validate import (
    DTYPES,
    at_least_zero,
    device,
    docs_budget,
    fraction,
    non_negative,
    one_of,
    positive,
)
from attnlm.data.corpus import DEFAULT_VAL_FRACTION

PARALLEL = ("ddp", "fsdp")  # the values of train.parallel
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")

# Fields of TrainConfig that may change when a run is resumed (they do not change the maths of
# the steps already taken). Any other difference is refused with a clear error.
RESUMABLE_CHANGES = frozenset(
    {
        "max_iters",
        "time_budget",
        "eval_interval",
        "eval_iters",
        "log_interval",
        "early_stop",
        "device",
        "dtype",
        "backward_precision",
        "grad_checkpoint",
        "compile",
        "threads",
        "fused",
        "progress",
        "workers",
    }
)


def parse_duration(text: str) -> float:
    """Seconds in ``"120s"``, ``"2m"``, ``"1.5h"`` or a bare number of seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(f"time budget {text!r} must look like 120s, 2m or 1h")
    scale = {"s": 1, "sec": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    seconds = float(m.group(1)) * scale
    if seconds <= 0:
        raise ConfigError(f"time budget must be positive, got {text!r}")
    return seconds


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, schedule, evaluation, device and data settings of one training run."""

    # optimisation
    batch_size: int = 12  # windows per micro-step and per process
    grad_accum: int = 1  # micro-steps per optimizer step, in total over all processes
    max_iters: int = 2000  # optimizer steps
    time_budget: str | None = None  # wall-clock limit, e.g. "120s"; the schedule follows it
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    weight_decay: float = 0.1  # on matrices (dim >= 2) only
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 turns clipping off
    fused: bool = True  # the fused AdamW kernel on CPU and CUDA (nanoGPT uses it on CUDA only)
    hmm_em: bool = False  # each step is one Baum-Welch EM iteration over the training split
    # evaluation, logging, checkpoints
    eval_interval: int = 250  # evaluate and save a checkpoint every N steps (and at the end)
    eval_iters: int = 20  # validation batches per evaluation (fixed batches each time)
    early_stop: int = 0  # stop after N evaluations without improvement; 0 = never
    log_interval: int = 10
    progress: bool = True
    seed: int = 1337
    # device
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "float32"  # float32 | bfloat16 (autocast)
    # float32 | bfloat16: the backward's products of linear layers and the LM head on
    # bfloat16 inputs (float32 forward and loss; CPU with AMX/AVX512-BF16; nn.grad_precision)
    backward_precision: str = "float32"
    # auto | on | off: the blocks recompute their insides in the backward instead of keeping
    # them (auto: when they would take more than half the free memory; train/checkpointing.py)
    grad_checkpoint: str = "auto"
    compile: bool = False  # torch.compile the model
    threads: int = 0  # torch.set_num_threads; 0 leaves torch's default
    # how the processes that torchrun starts share the work: "ddp" (each holds the whole
    # model; one process without torchrun) or "fsdp" (FSDP2: parameters, gradients and
    # optimizer state sharded across processes; needs torchrun); see train/fsdp.py
    parallel: str = "ddp"
    # data
    text: str | None = None  # corpus path (text, JSON Lines, Parquet, folder); None = built-in
    tokenizer: str = "char"  # char | bpe | wordpiece | gpt2 | path to a saved tokenizer JSON
    unk: bool = False  # char: one more id, <unk>, for characters the corpus does not have
    bpe_vocab_size: int = 512  # trained vocabularies (bpe, wordpiece); 0 = sized from the data
    val_fraction: float = DEFAULT_VAL_FRACTION  # also spelled valid_fraction in a preset/--set
    text_field: str = "text"  # the document field of JSON Lines / column of Parquet and Arrow
    skip_bad: bool = False  # skip (and count) bad records instead of stopping at the first
    workers: int = 0  # processes encoding the corpus; 0 = the machine's cores on large corpora
    tokenizer_sample: int = 64_000_000  # characters of the training split a tokenizer learns on
    data_dir: str | None = None  # prepared token files (attnlm data prepare, or nanoGPT's)
    # sentence pairs (families whose objective trains on pairs: seq2seq)
    pairs: str | None = None  # TSV path source<TAB>target; None = the built-in task
    valid_pairs: str | None = None  # validation pairs file (then none are held out of `pairs`)
    test_pairs: str | None = None  # test pairs file (then none are held out of `pairs`)
    shared_vocab: bool = True  # one tokenizer for both sides (else one per side)
    test_fraction: float = 0.1  # pairs held out for BLEU/chrF (valid: val_fraction); 0 = none
    max_pair_tokens: int = 0  # drop pairs with a side longer than this many tokens; 0 = keep
    # fine-tuning (see train/finetune.py)
    init_from: str | None = None  # start from this model (a --model SPEC): weights + tokenizer
    block_size: int = 0  # training window in tokens; 0 = the model's block_size
    freeze_embeddings: bool = False  # token/position embeddings get no gradient
    freeze_layers: int = 0  # the first N blocks get no gradient
    chat_data: str | None = None  # JSON Lines of {"messages": [...]}: loss on assistant turns
    # LoRA (attnlm.lora.layers): adapters of rank `lora` on a pretrained model, the base frozen;
    # 0 = off. Defaults are peft's LoraConfig: alpha 8, no dropout, q and v
    lora: int = 0
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    lora_targets: str = "q,v"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # lr = inf trained to NaN weights, exit 0
            value = getattr(self, f.name)
            if f.type == "float" and isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"train.{f.name} must be a finite number, got {value}")
        counts = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters")
        positive(self, *counts, "log_interval", "tokenizer_sample", where="train")
        optional = ("warmup_iters", "early_stop", "threads", "workers", "bpe_vocab_size")
        non_negative(self, *optional, "max_pair_tokens", where="train")
        non_negative(self, "block_size", "freeze_layers", where="train")
        at_least_zero(self, "weight_decay", "grad_clip", where="train")
        fraction(self, "beta1", "beta2", "test_fraction", where="train")
        if not self.text_field:
            raise ConfigError("train.text_field must be a non-empty field name")
        if self.text is not None and self.data_dir is not None:
            raise ConfigError("give the corpus as text or as a prepared data_dir, not both")
        if not self.lr > 0 or not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"train.lr must be > 0 and 0 <= min_lr <= lr (lr={self.lr})")
        if self.val_fraction + self.test_fraction >= 1:
            raise ConfigError(
                f"train.test_fraction must leave val_fraction + test_fraction < 1, got "
                f"{self.test_fraction}"
            )
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"train.val_fraction must be in (0, 1), got {self.val_fraction}")
        one_of(self, "parallel", PARALLEL, where="train")
        one_of(self, "dtype", DTYPES, where="train")
        one_of(self, "backward_precision", DTYPES, where="train")
        one_of(self, "grad_checkpoint", ("auto", "on", "off"), where="train")
        if self.backward_precision == "bfloat16" and self.dtype == "bfloat16":
            raise ConfigError(
                "train.backward_precision bfloat16 is for float32 training: dtype bfloat16 "
                "(autocast) runs the backward's products in bfloat16 already"
            )
        if self.backward_precision == "bfloat16" and self.compile:
            raise ConfigError(
                "train.backward_precision bfloat16 does not apply to a compiled model "
                "(torch.compile picks its own kernels): drop --compile or the setting"
            )
        object.__setattr__(
            self, "device", device(self.device, "train.device", check_available=False)
        )
        if self.time_budget is not None:
            parse_duration(self.time_budget)
        cap = docs_budget()
        if cap is not None:  # the doc tests: a few steps whatever the preset or flags say
            for name in ("max_iters", "eval_iters", "eval_interval", "warmup_iters"):
                object.__setattr__(self, name, min(getattr(self, name), cap))
        non_negative(self, "lora", where="train")
        if self.lora:
            self.lora_config()  # a bad rank, alpha, dropout or target: one line naming it

    def lora_config(self) -> Any:
        """The run's :class:`~attnlm.lora.layers.LoRAConfig`, or None without ``lora``."""
        from attnlm.lora.layers import LoRAConfig

        if not self.lora:
            return None
        return LoRAConfig(self.lora, self.lora_alpha, self.lora_dropout, self.lora_targets)

    @property
    def time_budget_s(self) -> float | None:
        return None if self.time_budget is None else parse_duration(self.time_budget)


@dataclass
class RunSpec:
    """A run's configuration before the tokenizer is known: model table dict + TrainConfig."""

    model: dict[str, Any]
    train: TrainConfig
    preset: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"model": dict(self.model), "train": dataclasses.asdict(self.train)}


def apply_overrides(
    tables: dict[str, dict[str, Any]], overrides: list[str] | None
) -> dict[str, dict[str, Any]]:
    """Apply ``table.key=value`` overrides (``key=value`` means ``train.key``)."""
    out = {k: dict(v) for k, v in tables.items()}
    for text in overrides or []:
        key, value = parse_override(text)
        table, _, field = key.rpartition(".")
        table = table or "train"
        if table not in ("model", "train"):
            raise ConfigError(f"override {text!r}: the table must be 'model' or 'train'")
        out.setdefault(table, {})[field] = value
    return out


# other spellings of [train] keys (the name the docs and issues use -> the field)
TRAIN_ALIASES = {"valid_fraction": "val_fraction"}


def spec_from_tables(tables: dict[str, Any], preset: str = "") -> RunSpec:
    """Check a preset's tables and build a :class:`RunSpec` (model fields checked later)."""
    unknown = sorted(set(tables) - {"model", "train"})
    if unknown:
        raise ConfigError(f"unknown preset table [{unknown[0]}] (known: [model], [train])")
    model = dict(tables.get("model", {}))
    table = dict(tables.get("train", {}))
    for alias, name in TRAIN_ALIASES.items():
        if alias in table:
            if name in table:
                raise ConfigError(f"train.{alias} and train.{name} are one setting; give one")
            table[name] = table.pop(alias)
    train = from_dict(TrainConfig, table, where="train")
    return RunSpec(model=model, train=train, preset=preset)


def load_spec(preset: str, overrides: list[str] | None = None) -> RunSpec:
    """Load a preset by name or path and apply overrides."""
    return spec_from_tables(apply_overrides(load_preset(preset), overrides), preset)
