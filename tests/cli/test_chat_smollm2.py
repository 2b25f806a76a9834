"""The real LLM through the commands (slow; skipped unless the GGUF reader is installed and
SmolLM2-135M-Instruct is already in the cache, so no test downloads it): ``attnlm chat``
answers "What is the capital of France?" naming Paris, and the logit lens of "The capital of
France is" ends in " Paris"."""

from __future__ import annotations

import importlib.util
import json

import pytest

from support import attnlm_process

NAME = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cached():
    if importlib.util.find_spec("attnlm.models.gguf") is None:
        pytest.skip("attnlm.models.gguf (the GGUF reader) is not installed")
    from attnlm.data.corpus import cache_dir

    folder = cache_dir() / "pretrained" / NAME
    if not any(folder.glob("*.gguf")):
        pytest.skip(f"{NAME} is not in the cache ({folder}); attnlm chat --model {NAME} fetches it")
    return folder


def test_chat_names_paris(cached):
    r = attnlm_process("chat", "--model", NAME, "--message", "What is the capital of France?",
                       "--max-new-tokens", 20, threads=2, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and r.stdout.count("\n") == 1


def test_lens_ends_in_paris(cached):
    r = attnlm_process("lens", "--model", NAME, "The capital of France is", "--json",
                       threads=2, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["layers"]) == 31  # the embeddings and 30 blocks
    assert doc["layers"][-1]["positions"][-1][0]["token"] == " Paris"
