"""The fuzz targets (fuzz/, ``make fuzz``; docs/reliability.md, "Fuzzing") without the fuzzer:
every committed input of each target's corpus replays under the policy (accepted, or refused
with a one-line InputError; anything else fails here as it would crash the fuzzer), each target
has a corpus that reaches past its reader, and the policy itself fails what it should."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from attnlm.base.errors import InputError

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
CRASHES = Path(__file__).resolve().parent / "fixtures" / "fuzz"  # inputs that crashed, fixed
sys.path.insert(0, str(FUZZ))
import fuzzkit  # noqa: E402

fuzzkit.FUZZING = False  # replay: neither atheris nor its instrumentation
TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in FUZZ.glob("fuzz_*.py"))


def test_the_issue_s_targets_are_all_there():
    assert TARGETS == ["chat_template", "gguf", "tiktoken", "tokenizer_json", "vocab_merges"]


@pytest.mark.parametrize("name", TARGETS)
def test_the_committed_corpus_replays_under_the_policy(name):
    target = importlib.import_module(f"fuzz_{name}").target
    files = list(fuzzkit.inputs([str(FUZZ / "corpus" / name)]))
    assert 1 <= len(files) <= 50 and sum(f.stat().st_size for f in files) < 200_000
    accepted = [f.name for f in files if fuzzkit.one(target, f.read_bytes())]
    assert accepted, f"{name}: no seed gets past the reader"


@pytest.mark.parametrize("path", sorted(CRASHES.iterdir()), ids=lambda p: p.name)
def test_every_crash_found_is_refused_in_one_line(path):
    target = importlib.import_module(f"fuzz_{path.name.split('-crash-')[0]}").target
    assert fuzzkit.one(target, path.read_bytes()) is False


def test_the_policy_passes_one_line_refusals_and_fails_everything_else():
    def refuses(data: bytes) -> None:
        raise InputError(f"x.gguf: {len(data)} bytes refused")

    def two_lines(data: bytes) -> None:
        raise InputError("first\nsecond")

    def crashes(data: bytes) -> None:
        raise IndexError("list index out of range")

    assert fuzzkit.one(lambda data: None, b"x") is True
    assert fuzzkit.one(refuses, b"x") is False
    with pytest.raises(AssertionError, match="2 lines"):
        fuzzkit.one(two_lines, b"x")
    with pytest.raises(IndexError):
        fuzzkit.one(crashes, b"x")
