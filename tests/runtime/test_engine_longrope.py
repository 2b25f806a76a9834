"""LongRoPE's choice of set on the C engine and in pieces (the ``phi3-longrope`` fixture of
tests/fixtures/gguf_arch/: an original context of 8). ``transformers`` decides per forward
call: a call whose sequence reaches past the original context rotates all its positions with
the long set. A prompt fed in pieces (the engine's 64-token pieces, the server's chunks)
therefore carries the whole prompt's reach, so it rotates as one forward over all of it;
several slots in one call each decide for their own sequence. The file's logits themselves are
tested against llama.cpp in test_engine_llamacpp.py and test_gguf_archs.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf import load
from attnlm.nn.positional import reaching
from attnlm.runtime.engine_gguf import open_engine

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
FILE = HERE / "phi3-longrope-Q8_0.gguf"
DOC = json.loads((HERE / "llamacpp.json").read_text(encoding="utf-8"))
native_only = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / (ref.max() - ref.min()))


def _ids(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 500, n)


def test_the_long_set_is_what_llama_cpp_computed():
    """The fixture's prompt (12 positions) passes the original context: with the short set
    instead, the logits move far from llama.cpp's."""
    rec = DOC["archs"]["phi3-longrope"]["Q8_0"]
    want = np.asarray(rec["dequantized"]["logits"], dtype=np.float32)
    model, _ = load(FILE)
    with torch.no_grad():
        got = model(torch.tensor([rec["prompt"]])).logits[0].numpy()
        assert _rel(got, want) < 1e-4, _rel(got, want)
        model.rotary.long_from = 10**6  # the short set throughout
        short = model(torch.tensor([rec["prompt"]])).logits[0].numpy()
    assert _rel(short, want) > 1e-2, _rel(short, want)


def test_pieces_reaching_the_whole_prompt_rotate_as_one_forward():
    """PyTorch: a 12-token prompt fed as 3 pieces of 4 under ``reaching(model, 12)`` equals the
    one forward; without it the first pieces take the short set."""
    model, _ = load(FILE)
    ids = torch.from_numpy(_ids(12))[None]
    with torch.no_grad():
        whole = model(ids).logits[0]

        def pieces(reach):
            state = model.new_state()
            with reaching(model, reach):
                return torch.cat([model(ids[:, i : i + 4], cache=state).logits[0]
                                  for i in range(0, 12, 4)])  # fmt: skip

        assert torch.allclose(pieces(12), whole, atol=1e-5, rtol=0)
        assert not torch.allclose(pieces(None), whole, atol=1e-3)


@native_only
def test_engine_pieces_slots_and_steps_choose_as_transformers():
    engine = open_engine(GGUFFile(FILE), None, 2)
    assert engine.config.rope_long_from == 8
    ids = _ids(12, seed=1)
    engine.reset(1)
    whole = engine.feed(ids[None])[0]  # (12, V): the long set
    engine.reset(1)
    parts = np.concatenate([engine.feed(ids[None, i : i + 4], reach=12)[0] for i in (0, 4, 8)])
    assert _rel(parts, whole) < 1e-5
    engine.reset(1)
    per_piece = np.concatenate([engine.feed(ids[None, i : i + 4])[0] for i in (0, 4, 8)])
    assert _rel(per_piece, whole) > 1e-3  # the first two pieces decided alone: short
    # two slots in one call: a short sequence (5) and a long one (12), each as alone
    short = _ids(5, seed=2)
    engine.reset(1)
    short_alone = engine.feed(short[None])[0]
    engine.reset_slots(2, 32)
    rows = engine.step_rows(np.concatenate([short, ids]),
                            np.concatenate([np.arange(5), np.arange(12)]),
                            np.asarray([0] * 5 + [1] * 12))  # fmt: skip
    assert _rel(rows[:5], short_alone) < 1e-5 and _rel(rows[5:], whole) < 1e-5
    # a prefill in chunks with the prompt's reach equals the prompt at once
    engine.reset_slots(1, 32)
    engine.prefill(0, 0, ids[:6], reach=12)
    assert _rel(engine.prefill(0, 6, ids[6:], reach=12), whole[-1]) < 1e-5
    # rows riding in another slot's step with their prompt's reach: as the prompt at once
    engine.reset_slots(2, 32)
    engine.prefill(1, 0, short)
    engine.prefill(0, 0, ids[:6], reach=12)
    rows = engine.step_rows(np.concatenate([ids[6:], [7]]), np.concatenate([np.arange(6, 12), [5]]),
                            np.asarray([0] * 6 + [1]), ends=np.asarray([12] * 6 + [6]))  # fmt: skip
    assert _rel(rows[:6], whole[6:]) < 1e-5
    with pytest.raises(ValueError, match="ends gives each row a reach beyond its position"):
        engine.step_rows(np.asarray([1]), np.asarray([6]), np.asarray([1]), ends=np.asarray([6]))
