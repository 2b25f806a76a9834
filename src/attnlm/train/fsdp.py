"""Fully sharded data parallel training (FSDP2) and its sharded checkpoints.

``[train] parallel = "fsdp"`` (``--parallel fsdp``) under ``torchrun``: instead of every
process holding the whole model, gradients and AdamW state (DDP), each process holds a
1/N slice of every parameter and of its optimizer state (``torch.distributed.fsdp.fully_shard``,
parameters become ``DTensor`` shards along dimension 0). Before a unit runs forward or
backward its parameters are all-gathered, afterwards freed again; gradients are
reduce-scattered, so each process steps AdamW on its own slice only.

Units: every :class:`~attnlm.nn.blocks.TransformerBlock` (the block every transformer family
stacks: gpt, llama, bert, the encoder-decoder transformer) is its own unit, then the root
holds the rest (embeddings, final norm, head; a tied head and embedding stay one parameter).
A family without transformer blocks (rnn, rnn-seq2seq, ffnn) is one unit, the root: its
parameters and optimizer state are still sharded, but all of them are gathered for each
forward pass.

A sharded checkpoint is the ordinary checkpoint folder (:mod:`attnlm.loading.checkpoint`) plus
``shards/``, written atomically as one folder::

    model.safetensors   the full weights, gathered on rank 0 (every ordinary reader works)
    config.json, tokenizer.json
    state.pt            step, timers, every rank's random state, data position; no optimizer
    shards/             torch.distributed.checkpoint: model and AdamW state, one file per
                        rank plus .metadata

Resuming reads ``shards/`` (any number of processes: DCP reshards on load);
:func:`export_checkpoint` turns a sharded checkpoint into an ordinary one (full optimizer
state in ``state.pt``) in one process, to continue without FSDP.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnlm.base.errors import InputError
from attnlm.base.foreign import register as _register_reader
from attnlm.loading.checkpoint import (
    CheckpointError,
    load_state,
    load_tokenizer,
    read_config,
    resolve_checkpoint,
    save_checkpoint,
)
from attnlm.nn.blocks import TransformerBlock

SHARDS = "shards"  # the folder of a sharded checkpoint that holds the DCP files

# torch.distributed.checkpoint is imported where it is used: it takes most of a second to
# import, which a run without FSDP should not pay.


def shard(model: torch.nn.Module, device: torch.device) -> int:
    """Shard ``model`` in place over every process of the group: each
    :class:`TransformerBlock` is a unit, then the root. Returns the number of block units
    (0: the whole model is one unit). Call before building the optimizer (the parameters
    are replaced by ``DTensor`` shards)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return len(blocks)


@contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients without reduce-scattering them (micro-steps before the last)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and the optimizer's state dicts keyed by parameter name (this process's
    shards under FSDP, whole tensors for a plain model): what DCP saves and loads into."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }


def _full_model(config: dict[str, Any], full: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A CPU model of the checkpoint's family holding the gathered weights ``full``; built
    without touching the global random state (a resumed run must continue exactly)."""
    from attnlm.models import registry

    with torch.random.fork_rng(devices=[]):
        model, _, _ = registry.build(config["model"])
    model.load_state_dict(full)
    return model


def save_sharded(
    ckpt_dir: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    tokenizer: Any,
    state: dict[str, Any],
) -> Path:
    """Write a sharded checkpoint (module docstring) atomically; called by every process.

    Every process writes its shards into a temporary sibling folder with DCP; the full
    weights are gathered to rank 0, which writes the ordinary files and moves the shards in
    (:func:`attnlm.loading.checkpoint.save_checkpoint`), so the old checkpoint is replaced by one
    rename only when everything is on disk."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    final = Path(ckpt_dir)
    staging = final.parent / f".{final.name}.shards-tmp"
    main = dist.get_rank() == 0
    if main:
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed save
        final.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    try:
        dcp.save(_sharded_state(model, optimizer), checkpoint_id=staging)
    except Exception as e:  # noqa: BLE001 - DCP reports every rank's failure on every rank
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        kept = f"the previous checkpoint in {final} is intact" if final.exists() else "none saved"
        raise CheckpointError(f"could not write the checkpoint shards ({e}); {kept}") from None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)  # rank 0: every tensor; others: {}
    if main:
        save_checkpoint(
            final, _full_model(config, full), config, tokenizer, state, move_in={SHARDS: staging}
        )
    dist.barrier()  # nobody reads or writes the next checkpoint before this one is in place
    return final


def is_sharded(ckpt: Path) -> bool:
    """Whether the checkpoint folder ``ckpt`` holds FSDP shards."""
    return (ckpt / SHARDS / ".metadata").is_file()


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ckpt: Path) -> None:
    """Load the shards of ``ckpt`` into ``model`` and ``optimizer`` (sharded, or plain in
    one process); every process of the group calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if not is_sharded(ckpt):
        raise InputError(
            f'{ckpt}: no {SHARDS}/ (not trained with parallel = "fsdp"); resume it as it was '
            "trained"
        )
    state = _sharded_state(model, optimizer)
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, checkpoint_id=ckpt / SHARDS)
    # CheckpointException derives from BaseException, so `except Exception` lets it through
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - missing or corrupt shards
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        first = first.split(" Traceback")[0][:300]
        raise InputError(f"{ckpt}/{SHARDS}: missing, corrupt or not this model ({first})") from None
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def export_checkpoint(src: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the sharded checkpoint of run (or checkpoint folder) ``src`` as an ordinary
    checkpoint in run folder ``out`` (``out/checkpoint/``), in this one process: the weights
    and the AdamW state read from the shards, ``train.parallel`` set to ``"ddp"``, so the
    exported run resumes with ``attnlm train --resume OUT`` in one process or under DDP.
    Returns the new checkpoint folder."""
    from attnlm.base.config import from_dict
    from attnlm.loading.checkpoint import CHECKPOINT_DIR
    from attnlm.models import registry
    from attnlm.train.config import TrainConfig
    from attnlm.train.optim import make_optimizer

    ckpt = resolve_checkpoint(src)
    config = read_config(ckpt)
    if not is_sharded(ckpt):
        raise InputError(f"{ckpt}: not a sharded checkpoint (no {SHARDS}/); it is ordinary already")
    dest = Path(out) / CHECKPOINT_DIR
    if dest.exists():
        raise InputError(f"{dest} exists already; choose another --out")
    train = dict(config.get("train", {}), parallel="ddp")
    model, _, _ = registry.build(config["model"])
    cfg = from_dict(TrainConfig, train, where="train")
    optimizer = make_optimizer(model, cfg, "cpu")
    with warnings.catch_warnings():  # DCP warns that it reads in one process: we mean to
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single")
        load_sharded(model, optimizer, ckpt)
    state = load_state(ckpt)
    state["optimizer"] = optimizer.state_dict()  # the ordinary layout (parameter indices)
    tok, pairs = load_tokenizer(ckpt)
    tokenizer = pairs if pairs is not None else tok  # what save_checkpoint writes back
    config = {k: v for k, v in config.items() if k != "format"}
    return save_checkpoint(dest, model, {**config, "train": train}, tokenizer, state)


_register_reader("FSDP shards", f"{__name__}.load_sharded")
