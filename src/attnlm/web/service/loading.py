"""Loading served models: a :class:`~attnlm.web.service.model.ModelService` for a checkpoint
or run folder, or for a named pretrained model / Hugging Face folder (``attnlm serve
--model``). Every SPEC is read through :func:`attnlm.loading.sources.resolve`; the family
and its capabilities come from the model-family registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlm.web.service.limits import DEFAULT_MAX_CHARS
from attnlm.web.service.model import ModelService


def _service_name(path: Path) -> str:
    p = path.resolve()
    if p.name in ("checkpoint", "checkpoint.old") and p.parent.name:
        return p.parent.name
    if p.suffix.lower() == ".gguf":
        return p.stem
    return p.name or "model"


def _is_name(model: str | None) -> bool:
    """A registered name or Hub id (shown as given), not a path."""
    return model is not None and not Path(model).expanduser().exists()


def load_service(
    path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    device: str = "cpu",
    max_chars: int = DEFAULT_MAX_CHARS,
    model: str | None = None,
    weights: str | None = None,
) -> ModelService:
    """A :class:`ModelService` for a checkpoint or run folder ``path``, or a named pretrained
    model / Hugging Face folder ``model`` (``attnlm serve --model minilm``); errors:
    InputError.

    The one place that loads served models (through :func:`attnlm.loading.sources.resolve`, which
    also finds the chat template and the ids that end a turn): the family and its
    capabilities come from the registry entry the checkpoint names (``fill-mask`` only where
    the model has its masked-LM head); a translation checkpoint is served with its pair tokenizers.
    """
    from attnlm.base.errors import InputError
    from attnlm.loading.sources import as_checkpoint, resolve

    if (path is None) == (model is None):
        raise InputError("give exactly one of --model SPEC and --checkpoint SPEC")
    resolved = resolve(model if model is not None else path, device, weights)
    found = resolved.info
    ck = as_checkpoint(resolved)  # an attnlm run's own record: pair tokenizers of translation
    capabilities = set(ck.family.capabilities)
    if getattr(ck.model, "head", True) is None:  # a BertModel folder (minilm): no masked-LM head
        capabilities.discard("fill-mask")
    return ModelService(
        name=name or (model if _is_name(model) else _service_name(Path(ck.path))),
        model=ck.model,
        tokenizer=ck.pair_tokenizers or ck.tokenizer,  # both sides for a translation model
        family=ck.family.type,
        capabilities=frozenset(capabilities),
        max_chars=max_chars,
        source=str(ck.path),
        chat_template=found.chat_template,
        stop_ids=tuple(found.stop_ids),
    )


def resolve_named_model(name: str, **kwargs: Any) -> ModelService:
    """The service of a named pretrained model or Hugging Face folder (``serve --model``);
    unknown names raise InputError."""
    return load_service(model=name, **kwargs)
