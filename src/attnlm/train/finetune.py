"""Fine-tuning: a run that starts from a pretrained model instead of random weights.

``train.init_from`` names the model as ``--model`` does (an attnlm run, a Hugging Face folder,
a ``.gguf`` file, a registered name, a Hub id; :func:`attnlm.loading.sources.resolve`). The run
takes from it:

* the architecture: its ``[model]`` table (:func:`attnlm.models.registry.config_table`) becomes
  the run's, so the run's ``config.json`` loads the run later without the source; a preset or
  ``--set`` may state model fields only with the source's values (:func:`check_architecture`);
* the weights, as float32 (a quantized GGUF file is dequantized; :func:`load_init_source` says
  so in a note);
* the tokenizer, written into the run folder as ``init_tokenizer.json`` (an attnlm tokenizer
  file: byte-level BPE, WordPiece, a GGUF vocabulary) and used as the run's tokenizer file, so
  the corpus is encoded with the model's own vocabulary and a resumed run reads it back;
* a translation model's tokenizers instead (an attnlm pairs run's source and target
  tokenizers, or one shared; a Hugging Face Marian folder's ``tokenizer.json`` for both sides,
  or an OPUS-MT folder's SentencePiece models, :mod:`attnlm.tokenizers.marian_spm`, one per side
  over one vocabulary; the special tokens at the model's ``pad_id``/``bos_id``/``eos_id``):
  written into the run folder as ``init_tokenizers/``
  (:meth:`attnlm.data.pairs.PairTokenizers.save`), which
  ``train.tokenizer`` names, so the pairs are encoded with them, never trained anew
  (:func:`attnlm.train.pair_data.prepare_pairs`), and their special ids are the model's
  (:func:`check_pair_fields`);
* its chat template (when it has one), kept in the run's config (``chat_template``) so ``chat``
  works on the fine-tuned run.

The run records ``init_from``: the SPEC, how it was read (``kind``) and a fingerprint of the
starting weights (:func:`weights_fingerprint`, a SHA-256 over names, shapes and float32 bytes:
the same for the same weights whatever file they came from).

:func:`freeze` implements ``freeze_embeddings`` / ``freeze_layers``: frozen parameters have
``requires_grad`` False, so they get no gradient and the optimizer holds no state for them
(:func:`attnlm.train.optim.param_groups` skips them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlm.base.errors import ConfigError
from attnlm.train.defaults import RUN_SETTINGS, TODAY_FULL, default_window

INIT_TOKENIZER = "init_tokenizer.json"  # in the run folder: the source model's tokenizer
INIT_PAIR_TOKENIZERS = "init_tokenizers"  # in the run folder: a translation model's tokenizers
#: the ModuleList attributes that hold a family's blocks, in the order they run
BLOCK_LISTS = ("blocks", "encoder", "decoder", "layers")
#: a fine-tuning run's training settings before the per-machine table (a pretrained model
#: wants a small learning rate; windows of 256 tokens unless the model's context is shorter);
#: ``attnlm train --init-from`` takes its settings from :mod:`attnlm.train.defaults` instead
FINETUNE_TRAIN = {**RUN_SETTINGS, **{k: v for k, v in TODAY_FULL.train_table().items()
                                     if k != "backward_precision"}}  # fmt: skip
DEFAULT_WINDOW = TODAY_FULL.block_size


@dataclass
class InitSource:
    """What a run takes from its ``init_from`` model (see the module docstring). ``table``:
    the ``[model]`` table; ``model``: the model itself, float32, which the run trains (no
    second model is built and no copy of the weights is made: a 135M model is 540 MB);
    ``record``: what the run's
    config stores as ``init_from``; ``chat_template``: ``{"source", "special_tokens"}`` or
    None; ``notes``: lines to print (dequantization)."""

    table: dict[str, Any]
    model: nn.Module | None
    tokenizer: Any
    record: dict[str, Any]
    chat_template: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    path: Path | None = None  # where the source's weights are (a LoRA run fingerprints them)
    pairs: Any = None  # a translation model's PairTokenizers (None: a text model)


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 over the state dict in name order: each name, shape and float32 bytes."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        t = value.detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{tuple(t.shape)};".encode())
        digest.update(t.numpy().data)  # the bytes in place: no copy of a 100 MB embedding
    return "sha256:" + digest.hexdigest()


def _gguf_note(spec: str) -> str | None:
    """One line saying which quantized types a GGUF source was dequantized from."""
    from attnlm.loading.sources import gguf_file
    from attnlm.models.gguf.loader import tensor_stats

    path = gguf_file(spec, lookup=True)
    if path is None:
        return None
    types = [t for t in tensor_stats(path)["by_type"] if t != "F32"]
    if not types:
        return None
    return f"init-from: {path.name} holds {', '.join(types)} tensors, dequantized to float32"


def load_init_source(spec: str) -> InitSource:
    """Resolve ``spec`` (on the CPU) into an :class:`InitSource`."""
    from attnlm.loading.sources import resolve
    from attnlm.models import registry

    model, tok, info = resolve(spec, "cpu", weights="f32")  # trained in float32
    table = registry.config_table(info.family, model.config)
    model.float()
    record = {"spec": str(spec), "kind": info.kind, "fingerprint": weights_fingerprint(model)}
    template = None
    if info.chat_template is not None:
        ct = info.chat_template
        template = {"source": ct.source, "special_tokens": dict(ct.special_tokens)}
    notes = [n for n in (_gguf_note(str(spec)),) if n]
    pairs = None
    if info.family.objective == "seq2seq":  # a translation model: both sides' tokenizers
        pairs = _pair_tokenizers(tok, info, table, str(spec))
    return InitSource(table, model, tok, record, template, notes, info.path, pairs)


def _pair_tokenizers(tok: Any, info: Any, table: dict[str, Any], spec: str) -> Any:
    """The source and target tokenizers of a translation model: an attnlm run's own, else
    (a Hugging Face folder) its one tokenizer for both sides, with the special token strings
    found at the model's ``pad_id``/``bos_id``/``eos_id``."""
    from attnlm.data.pairs import PairTokenizers

    stored = getattr(info.checkpoint, "pair_tokenizers", None)
    if stored is not None:
        return stored
    by_id = {i: s for s, i in (getattr(tok, "special_tokens", None) or {}).items()}
    names: dict[str, str] = {}
    for what in ("pad", "bos", "eos"):
        i = table.get(f"{what}_id")
        if i not in by_id:
            raise ConfigError(f"{spec}: the model's {what}_id ({i}) is not a special token of "
                              "its tokenizer; cannot encode pairs for it")  # fmt: skip
        names[what] = by_id[i]
    return PairTokenizers.from_tokenizers(tok, **names)


def take_model(init: InitSource) -> nn.Module:
    """The source's model, in training mode, handed over to the run (``init`` keeps no
    reference to it, so the run alone decides how long the weights live)."""
    model, init.model = init.model, None
    if model is None:
        raise ConfigError("the --init-from model was handed over already")
    return model.train()


def check_architecture(requested: dict[str, Any], source: dict[str, Any], spec: str) -> None:
    """Refuse (one line naming the field) a ``[model]`` field that differs from the source."""
    for key, value in requested.items():
        if key not in source:
            raise ConfigError(
                f"model.{key}: the --init-from model ({spec}, {source.get('type')}) has no such "
                "field; the architecture comes from it (leave model settings out)"
            )
        if source[key] != value:
            raise ConfigError(
                f"model.{key} = {value!r} was requested, but the --init-from model ({spec}) has "
                f"{source[key]!r}; the architecture comes from it (leave model.{key} out)"
            )


def block_lists(model: nn.Module) -> list[nn.Module]:
    """The model's blocks in the order they run (encoder before decoder)."""
    out: list[nn.Module] = []
    for name in BLOCK_LISTS:
        blocks = getattr(model, name, None)
        if isinstance(blocks, nn.ModuleList):
            out.extend(blocks)
    return out


def embedding_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Token and learned position embeddings (a tied output head shares the token one)."""
    from attnlm.nn.positional import LearnedPositionalEmbedding

    out: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
            for p in module.parameters(recurse=False):
                out[id(p)] = p
    return list(out.values())


def freeze(model: nn.Module, embeddings: bool = False, layers: int = 0) -> int:
    """Freeze the embeddings and/or the first ``layers`` blocks; returns the number of frozen
    parameters (elements)."""
    frozen: dict[int, nn.Parameter] = {}
    if embeddings:
        frozen.update((id(p), p) for p in embedding_parameters(model))
    if layers:
        blocks = block_lists(model)
        if layers > len(blocks):
            raise ConfigError(f"train.freeze_layers = {layers}, but the model has only "
                              f"{len(blocks)} blocks")  # fmt: skip
        for block in blocks[:layers]:
            frozen.update((id(p), p) for p in block.parameters())
    for p in frozen.values():
        p.requires_grad_(False)
    return sum(p.numel() for p in frozen.values())


def training_window(model_table: dict[str, Any], requested: int) -> int:
    """The training window: ``requested`` (0 = the model's ``block_size``), at most the
    model's ``block_size``."""
    context = int(model_table.get("block_size") or 0)
    if requested and context and requested > context:
        raise ConfigError(f"train.block_size = {requested} is longer than the model's context "
                          f"({context} positions)")  # fmt: skip
    return requested or context


def save_init_tokenizer(run_dir: Path, tokenizer: Any) -> Path:
    """Write the source's tokenizer into the run folder (atomic); returns its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / INIT_TOKENIZER
    tokenizer.save(path)
    return path


def check_vocab(tokenizer: Any, table: dict[str, Any], spec: str) -> None:
    """The source's tokenizer must fit its model's embedding (it may be smaller: padded
    vocabularies)."""
    size = table.get("vocab_size")
    if isinstance(size, int) and tokenizer.vocab_size > size:
        raise ConfigError(f"{spec}: the tokenizer has {tokenizer.vocab_size:,} ids but the "
                          f"model only {size:,}")  # fmt: skip


def check_pair_fields(fields: dict[str, Any], table: dict[str, Any], spec: str) -> None:
    """A translation model's tokenizers must give its own special ids and fit its embeddings
    (``fields``: what the prepared pairs decide, ``PairRunData.model_fields``)."""
    for key, value in fields.items():
        if key not in table:
            continue  # a family without that field (rnn-seq2seq: no share_embeddings)
        have = table[key]
        if key == "src_vocab_size" and have is None:
            have = table.get("vocab_size")
        fits = value <= have if key.endswith("vocab_size") and isinstance(have, int) else (
            value == have)  # fmt: skip
        if not fits:
            raise ConfigError(f"{spec}: its tokenizers give {key} = {value!r} but the model has "
                              f"{have!r}; they do not belong together")  # fmt: skip


def check_data_kind(init: InitSource, cfg: Any) -> None:
    """Refuse, before anything is written, data the source model does not train on: a
    translation model takes ``--pairs``, a text model ``--text``."""
    name, spec = init.table.get("type"), cfg.init_from
    if init.pairs is not None and getattr(cfg, "text", None) is not None:
        raise ConfigError(f"--init-from {spec} is a translation model ({name}): give --pairs "
                          "FILE, not --text")  # fmt: skip
    if init.pairs is None and getattr(cfg, "pairs", None) is not None:
        raise ConfigError(
            f"--init-from {spec} is a {name} model that trains on text: give --text FILE, "
            "not --pairs (a translation model takes them)"
        )


def start_from(
    spec: Any, run_dir: Path, resume: bool, is_main: bool, log: Any
) -> tuple[Any, InitSource | None, dict[str, Any]]:
    """The run spec of a fine-tuning run, its :class:`InitSource` (None when resuming: the
    weights come from the checkpoint) and the entries its checkpoints' ``config.json`` adds
    (``init_from``, ``chat_template``)."""
    import dataclasses

    cfg = spec.train
    if resume:
        from attnlm.loading.checkpoint import read_config, resolve_checkpoint

        stored = read_config(resolve_checkpoint(run_dir))
        extra = {k: stored[k] for k in ("init_from", "chat_template", "lora") if k in stored}
        return spec, None, extra
    init = load_init_source(cfg.init_from)
    check_architecture(spec.model, init.table, cfg.init_from)
    check_data_kind(init, cfg)
    if init.pairs is not None:
        return _start_pairs(spec, init, run_dir, is_main, log)
    path = run_dir / INIT_TOKENIZER
    if is_main:
        save_init_tokenizer(run_dir, init.tokenizer)
    window = training_window(init.table, cfg.block_size)
    if not cfg.block_size:  # this machine's recipe's window (train/defaults.py)
        cap = default_window(cfg.device, cfg.lora)
        window = min(window, cap) if window else cap
    cfg = dataclasses.replace(cfg, tokenizer=str(path.resolve()), block_size=window)
    if is_main:
        for note in init.notes:
            log(note)
        fp = init.record["fingerprint"]
        log(f"init-from: {cfg.init_from} ({init.record['kind']}, weights {fp[:19]}...); "
            f"its tokenizer ({init.tokenizer.vocab_size:,} ids) encodes the data")  # fmt: skip
    extra: dict[str, Any] = {"init_from": init.record}
    if init.chat_template is not None:
        extra["chat_template"] = init.chat_template
    return dataclasses.replace(spec, model=dict(init.table), train=cfg), init, extra


def _start_pairs(
    spec: Any, init: InitSource, run_dir: Path, is_main: bool, log: Any
) -> tuple[Any, InitSource, dict[str, Any]]:
    """:func:`start_from` for a translation model: its tokenizers into ``init_tokenizers/``,
    named by ``train.tokenizer`` (the pairs are encoded with them, never trained anew)."""
    import dataclasses

    cfg, pairs = spec.train, init.pairs
    folder = run_dir / INIT_PAIR_TOKENIZERS
    if is_main:
        pairs.save(folder)
    cfg = dataclasses.replace(cfg, tokenizer=str(folder.resolve()), shared_vocab=pairs.shared)
    if is_main:
        fp = init.record["fingerprint"]
        sizes = (f"{pairs.target_ids.vocab_size:,} ids, shared" if pairs.shared else
                 f"{pairs.source_ids.vocab_size:,} source / {pairs.target_ids.vocab_size:,} "
                 "target ids")  # fmt: skip
        log(f"init-from: {cfg.init_from} ({init.record['kind']}, weights {fp[:19]}...); "
            f"its tokenizers ({sizes}) encode the pairs")  # fmt: skip
    return (
        dataclasses.replace(spec, model=dict(init.table), train=cfg),
        init,
        {"init_from": init.record},
    )
