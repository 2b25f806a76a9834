"""The Hugging Face ``mistral`` adapter: ``MistralForCausalLM``, a sliding window on every layer
(the layout and config translation: :mod:`attnlm.models.hf.llama_family`)."""

from __future__ import annotations

from pathlib import Path

from attnlm.models.hf import llama_family
from attnlm.models.llama import Llama

MODEL_TYPE = "mistral"
MODEL = Llama
ARCH = llama_family.ARCHS[MODEL_TYPE]


def load(path: str | Path) -> Llama:
    """Load a ``MistralForCausalLM`` folder into our Llama (its parts from ``config.json``)."""
    return llama_family.load(path, ARCH)


def save(model: Llama, path: str | Path, max_shard_size: int | None = None) -> None:
    """Write ``model`` as a ``MistralForCausalLM`` folder (``transformers`` loads it)."""
    llama_family.save(model, path, ARCH, max_shard_size=max_shard_size)
