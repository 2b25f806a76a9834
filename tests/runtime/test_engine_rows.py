"""The C engine's rows API (:meth:`attnlm.runtime.engine.Engine.step_rows`,
:meth:`~attnlm.runtime.engine.Engine.prefill`: each row at its own cache slot and position,
one pass over the weights for all; an OpenAI server's continuous batching) against the same
engine feeding each sequence alone with :meth:`~attnlm.runtime.engine.Engine.feed` (itself
tested against the PyTorch forward and llama.cpp in test_engine_archs.py): every row's logits
within 1e-5 of that position's logit range, for rows at different positions in mixed slots, a
prompt prefilled in pieces beside other slots' decoding, a slot cut back to a shorter prefix
and refilled, and a prefill longer than one pass; on a ``llama`` (interleaved rotary rows) and
a ``qwen2`` (q/k/v biases) fixture of tests/fixtures/gguf_arch/, with float and the default
integer activations. Bad slots, positions and ids are refused with a ValueError naming them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.runtime.engine import MAX_TOKENS
from attnlm.runtime.engine_gguf import ACTIVATIONS_ENV, open_engine

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")
TOL = 1e-5


def rel(ours: np.ndarray, ref: np.ndarray) -> float:
    """The largest error of each row over that row's logit range."""
    span = ref.max(axis=-1) - ref.min(axis=-1)
    return float((np.abs(ours - ref).max(axis=-1) / span).max())


def alone(engine, seq: list[int]) -> np.ndarray:
    """Logits (T, V) of every position of ``seq`` fed alone (one sequence, pieces of at most
    MAX_TOKENS)."""
    engine.reset(1)
    return np.concatenate([engine.feed(np.asarray([seq[i : i + MAX_TOKENS]]))[0]
                           for i in range(0, len(seq), MAX_TOKENS)])  # fmt: skip


def open_fixture(name: str, activations: str | None, monkeypatch):
    if activations is None:
        monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(ACTIVATIONS_ENV, activations)
    return open_engine(GGUFFile(HERE / f"{name}.gguf"), None, 2)


CASES = [(name, act) for name in ("llama-Q4_K_M", "qwen2-Q4_K_M") for act in ("float", None)]


@pytest.mark.parametrize(("name", "activations"), CASES)
def test_rows_equal_each_sequence_alone(name, activations, monkeypatch):
    engine = open_fixture(name, activations, monkeypatch)
    rng = np.random.default_rng(3)
    vocab = engine.config.vocab_size
    seqs = [rng.integers(0, vocab, n).tolist() for n in (14, 9, 6)]
    refs = [alone(engine, s) for s in seqs]
    engine.reset_slots(4, 32)
    # slot 2 takes sequence 0, slot 0 sequence 1: prompts prefilled, the first in two pieces
    assert rel(engine.prefill(2, 0, np.asarray(seqs[0][:5])), refs[0][4:5]) < TOL
    assert rel(engine.prefill(2, 5, np.asarray(seqs[0][5:10])), refs[0][9:10]) < TOL
    assert rel(engine.prefill(0, 0, np.asarray(seqs[1][:3])), refs[1][2:3]) < TOL
    # one step: slot 2 decodes at 10, slot 3 prefills its whole prompt (sequence 2) as
    # rows, slot 0 decodes at 3 then 4 (two rows of one slot)
    rows = [(seqs[0][10], 10, 2)] + [(seqs[2][i], i, 3) for i in range(6)]
    rows += [(seqs[1][3], 3, 0), (seqs[1][4], 4, 0)]
    tokens, positions, slots = (np.asarray(col) for col in zip(*rows))
    got = engine.step_rows(tokens, positions, slots)
    want = np.concatenate([refs[0][10:11], refs[2][:6], refs[1][3:5]])
    assert got.shape == (len(rows), vocab) and got.dtype == np.float32
    assert rel(got, want) < TOL
    # the rest one row per slot per step, in a different slot order
    for step in range(3):
        rows = [(seqs[1][5 + step], 5 + step, 0), (seqs[0][11 + step], 11 + step, 2)]
        tokens, positions, slots = (np.asarray(col) for col in zip(*rows))
        got = engine.step_rows(tokens, positions, slots)
        assert rel(got, np.stack([refs[1][5 + step], refs[0][11 + step]])) < TOL
    assert engine.held.tolist() == [8, 0, 14, 6]


@pytest.mark.parametrize(("name", "activations"), CASES)
def test_a_slot_cut_back_and_refilled(name, activations, monkeypatch):
    engine = open_fixture(name, activations, monkeypatch)
    rng = np.random.default_rng(5)
    vocab = engine.config.vocab_size
    first = rng.integers(0, vocab, 12).tolist()
    second = first[:7] + rng.integers(0, vocab, 5).tolist()  # the next turn shares 7 tokens
    other = rng.integers(0, vocab, 8).tolist()
    engine.reset_slots(2, 16)
    engine.prefill(0, 0, np.asarray(first))
    engine.prefill(1, 0, np.asarray(other))
    # the cached prefix kept, the rest prefilled over the old positions
    got = engine.prefill(0, 7, np.asarray(second[7:]))
    assert engine.held.tolist() == [12, 8]
    assert rel(got[None], alone(engine, second)[-1:]) < TOL
    engine.reset_slots(2, 16)
    engine.prefill(0, 0, np.asarray(first))
    engine.prefill(1, 0, np.asarray(other[:7]))
    # one step cuts slot 0 back to 3 positions, and decodes slot 1
    got = engine.step_rows(np.asarray([second[3], other[7]]), np.asarray([3, 7]),
                           np.asarray([0, 1]))  # fmt: skip
    assert engine.held.tolist() == [4, 8]
    assert rel(got[:1], alone(engine, second[:4])[-1:]) < TOL
    assert rel(got[1:], alone(engine, other)[-1:]) < TOL


def test_a_prefill_longer_than_one_pass(monkeypatch):
    engine = open_fixture("qwen2-Q4_K_M", "float", monkeypatch)
    seq = np.random.default_rng(7).integers(0, engine.config.vocab_size, MAX_TOKENS + 9)
    ref = alone(engine, seq.tolist())
    engine.reset_slots(2, 128)
    assert rel(engine.prefill(1, 0, seq)[None], ref[-1:]) < TOL
    assert engine.held.tolist() == [0, len(seq)]


def test_rows_refuse_what_is_out_of_range(monkeypatch):
    engine = open_fixture("llama-Q8_0", None, monkeypatch)
    v = engine.config.vocab_size
    with pytest.raises(ValueError, match="reset_slots"):
        engine.step_rows(np.asarray([1]), np.asarray([0]), np.asarray([0]))
    engine.reset_slots(2, 8)
    engine.prefill(0, 0, np.asarray([1, 2, 3]))

    def rows(token, position, slot):
        return engine.step_rows(np.asarray(token), np.asarray(position), np.asarray(slot))

    for args, match in [
        (([1], [0], [2]), r"slot 2 is out of range \[0, 2\)"),
        (([1], [0], [-1]), r"slot -1 is out of range"),
        (([1], [8], [0]), r"position 8 is out of range \[0, 8\)"),
        (([v], [0], [0]), rf"token id {v} is out of range \[0, {v}\)"),
        (([1], [4], [0]), "position 4 of slot 0 leaves a gap: the slot holds 3"),
        (([1, 2], [3, 5], [0, 0]), "consecutive positions"),
        (([1, 2], [3, 3], [1, 1]), "gap"),
        (([1, 2], [0], [0]), "equal length"),
        (([], [], []), "equal length"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            rows(*args)
    with pytest.raises(ValueError, match=r"position 8 is out of range"):
        engine.prefill(1, 0, np.arange(9))
    with pytest.raises(ValueError, match="at least one token"):
        engine.prefill(1, 0, np.asarray([], dtype=np.int64))
    assert engine.held.tolist() == [3, 0]  # nothing refused was written
    with pytest.raises(ValueError, match="feed follows reset"):
        engine.feed(np.asarray([[1], [2]]))
    with pytest.raises(ValueError, match="n_slots >= 1"):
        engine.reset_slots(0, 8)


def test_want_returns_the_rows_asked_for(monkeypatch):
    """``want``: the logits of those rows alone, in that order, equal to the same rows of a
    call that returns every row; nothing is written when it is out of range."""
    engine = open_fixture("qwen2-Q4_K_M", None, monkeypatch)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, engine.config.vocab_size, 5)
    positions, slots = np.asarray([0, 1, 2, 0, 1]), np.asarray([0, 0, 0, 1, 1])
    engine.reset_slots(2, 16)
    every = engine.step_rows(tokens, positions, slots)
    engine.reset_slots(2, 16)
    picked = engine.step_rows(tokens, positions, slots, want=np.asarray([4, 2]))
    assert picked.shape == (2, engine.config.vocab_size)
    assert rel(picked, every[[4, 2]]) < TOL
    held = engine.held.tolist()
    for want in ([5], [-1], [0, 0]):
        with pytest.raises(ValueError, match="want lists"):
            engine.step_rows(tokens[:1], np.asarray([3]), np.asarray([0]), want=np.asarray(want))
    assert engine.held.tolist() == held
    engine.reset_slots(2, 16)  # no rows wanted: the caches filled alone, then the same logits
    none = engine.step_rows(tokens[:3], positions[:3], slots[:3], want=np.asarray([], int))
    assert none.shape == (0, engine.config.vocab_size)
    last = engine.step_rows(tokens[3:], positions[3:], slots[3:])
    assert rel(last, every[3:]) < TOL
