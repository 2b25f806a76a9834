"""Llama-family GGUF architectures on the C engine (without PyTorch), from
the committed fixtures of ``tests/fixtures/gguf_arch/`` (small models converted and quantized
by llama.cpp; llama.cpp's logits and greedy ids recorded by its ``make_fixtures.py``):

- ``qwen2``: q/k/v biases, llama.cpp's NEOX rotary (pairs ``(i, i + D/2)``: its rows are
  stored unpermuted), an untied head;
- ``qwen3``: a head width D (128) other than ``n_embd / n_head`` (64), each q and k head
  RMS-normalized before the rotation (its gains ``(D,)``), one key/value head;
- ``phi3``: fused q/k/v (``attn_qkv``) and gate/up (``ffn_up`` of 2F rows) matrices, each
  multiplied as one product in its stored blocks;
- ``llama`` and ``mistral`` (architecture ``llama``, no sliding window): q and k rows in
  llama.cpp's interleaved order, rotated in adjacent pairs as stored (or moved back for the
  q8 layout of the Q8_0 files);
- ``gemma2``: the sqrt(C) embedding scale, post-attention and post-feed-forward norms,
  GeGLU, attention and final logit soft-capping, a sliding window of 8 on the even layers
  (the prompt of 12 and the 32 greedy steps run past it); ``gemma3``: per-head q/k norms,
  five sliding layers of six with their own rotary base, a final soft-cap in
  ``gemma3-linear`` (only Q8_0), whose global layers' rotary positions are scaled linearly
  (each part, left out, moves the logits by 5e-3 to 0.99 of the range, measured), and
  ``gemma3-gqa4`` (only Q8_0): Gemma 3 270M's attention shape, 4 query heads of width 256 per
  key/value head (the C engine's attend4_256).

For each file in each tensor type:

- float activations (``ATTNLM_GGML_ACTIVATIONS=float``): logits at every position of the
  prompt and 32 greedy tokens within 1e-4 of each position's logit range of the PyTorch
  float32 forward (:func:`attnlm.models.gguf.load`, itself tested against llama.cpp in
  tests/models/gguf/test_gguf_archs.py), and the 32 greedy ids llama.cpp chose on the file's
  float32 twin (a dropped bias moves the logits by some 20% of the range, measured);
- the default integer activations (llama.cpp's way): logits at every prompt position within
  :data:`INT_TOL` of the range of llama.cpp's own on the quantized file, and its greedy ids
  up to its first near-tie.

A slow test chats with the real ``qwen2.5-coder-0.5b-instruct`` (skipped where it is not in
attnlm's cache): backend ``c-engine``, and the reply writes a function.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.runtime.engine_gguf import ACTIVATIONS_ENV, engine_for, engine_format, open_engine

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
DOC = json.loads((HERE / "llamacpp.json").read_text(encoding="utf-8"))
ARCHS = ("qwen2", "qwen3", "phi3", "llama", "mistral", "gemma2", "gemma3", "qwen3moe", "mixtral",
         "smollm3", "granite", "olmo2")  # fmt: skip
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_M", "Q2_K", "IQ4_XS", "IQ4_NL")
#: every architecture in the five types, and llama / qwen2 in Q3_K_M, Q2_K, IQ4_XS, IQ4_NL too
CASES = [(arch, kind) for arch in ARCHS for kind in TYPES if kind in DOC["archs"][arch]]
CASES += [("gemma3-linear", "Q8_0"), ("gemma3-gqa4", "Q8_0"), ("llama3", "Q8_0"),
          ("mistral-nemo", "Q8_0"), ("qwen3-yarn", "Q8_0"),
          ("phi3-longrope", "Q8_0"), ("phi4-mini", "Q8_0"), ("olmo3", "Q8_0"),
          ("gptoss", "Q8_0"), ("gptoss", "MXFP4_MOE")]  # fmt: skip
TIE = 5e-3  # a top-1 / top-2 margin below this fraction of the range is a near-tie
#: integer activations vs llama.cpp on the quantized file, of each position's logit range:
#: both round the products' inputs to 8 bits, differently (llama.cpp's K-quant products take
#: blocks of 256 (Q8_K), ours of 32), each some 0.3-1% from the float32 forward; measured
#: 0.3-1.8% apart on these files (a dropped bias or q/k norm: 6-20%)
INT_TOL = 2.5e-2
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    """The largest error of each position (row) over that position's logit range."""
    span = ref.max(axis=-1) - ref.min(axis=-1)
    return float((np.abs(ours - ref).max(axis=-1) / span).max())


def _greedy(engine, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """The prompt's logits (T, V) and ``n`` greedy ids, one token a step through the cache."""
    engine.reset(1)
    logits = engine.feed(np.asarray([prompt]))[0]
    ids, last = [], logits[-1]
    for _ in range(n):
        ids.append(int(last.argmax()))
        last = engine.feed(np.asarray([[ids[-1]]]))[0, -1]
    return logits, ids


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_float_activations_equal_the_float32_forward(arch, kind, monkeypatch):
    torch = pytest.importorskip("torch")
    from attnlm.models.gguf import load

    monkeypatch.setenv(ACTIVATIONS_ENV, "float")
    rec = DOC["archs"][arch][kind]
    header = GGUFFile(HERE / f"{arch}-{kind}.gguf")
    assert engine_format(header, None) is not None
    engine = open_engine(header, None, 2)
    logits, ids = _greedy(engine, rec["prompt"], DOC["new_tokens"])
    assert ids == rec["dequantized"]["greedy"]  # llama.cpp on the float32 twin
    model, _ = load(header.path)
    whole = rec["prompt"] + ids[:-1]  # the last id is never fed
    with torch.no_grad():
        ref = model(torch.tensor([whole])).logits[0].numpy()
    engine.reset(1)
    ours = np.concatenate([engine.feed(np.asarray([whole[: len(rec["prompt"])]]))[0]] +
                          [engine.feed(np.asarray([[i]]))[0] for i in ids[:-1]])  # fmt: skip
    assert _rel(logits, ref[: len(rec["prompt"])]) < 1e-4
    assert _rel(ours, ref) < 1e-4, f"{arch} {kind}: {_rel(ours, ref):.2e} of the range"


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_integer_activations_follow_llama_cpp(arch, kind, monkeypatch):
    monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    rec = DOC["archs"][arch][kind]
    engine = open_engine(GGUFFile(HERE / f"{arch}-{kind}.gguf"), None, 2)
    logits, ids = _greedy(engine, rec["prompt"], DOC["new_tokens"])
    theirs = np.asarray(rec["logits"], dtype=np.float32)
    assert _rel(logits, theirs) < INT_TOL, f"{arch} {kind}: {_rel(logits, theirs):.2e}"
    span = float(theirs.max() - theirs.min())
    decided = next((i for i, m in enumerate(rec["margins"]) if m < TIE * span), len(ids))
    assert ids[:decided] == rec["greedy"][:decided]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_resolver_picks_the_engine(arch):
    found = engine_for(HERE / f"{arch}-Q4_K_M.gguf", "cpu", None, 1)
    assert found is not None
    engine, tok, _, _ = found
    assert engine.name == "c-engine" and "C step" in engine.reason
    assert tok.encode(DOC["test_text"]) == DOC["archs"][arch]["Q8_0"]["test_ids"]


@pytest.mark.slow
def test_qwen_coder_chats_on_the_engine():
    from attnlm.data.corpus import cache_dir
    from attnlm.data.pretrained import PRETRAINED
    from support import attnlm_process

    name = "qwen2.5-coder-0.5b-instruct"
    if not (cache_dir() / "pretrained" / name / PRETRAINED[name].joined.name).is_file():
        pytest.skip(f"{name} is not in attnlm's cache")
    r = attnlm_process("chat", "--model", name, "--message",
                       "Write a Python function that reverses a string.", "--max-new-tokens",
                       64, "--json", threads=2, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "c-engine", doc["backend_reason"]
    assert "def " in doc["reply"] and ("[::-1]" in doc["reply"] or "reversed" in doc["reply"])


@pytest.mark.parametrize("arch", ["qwen3moe", "mixtral"])
def test_experts_of_several_sequences_at_once_equal_each_alone(arch):
    """A mixture of experts on the rows of two sequences in one call (a server's step: each
    row routed to its own experts, the rows gathered per expert): each sequence's logits are
    those of the sequence fed alone. (``--weights q8`` / ``q4`` leave experts to PyTorch:
    the step's own layouts hold no stacked experts.)"""
    header = GGUFFile(HERE / f"{arch}-Q4_K_M.gguf")
    assert engine_format(header, "q8") is None and engine_format(header, "q4") is None
    engine = open_engine(header, None, 2)
    prompt = DOC["archs"][arch]["Q4_K_M"]["prompt"]
    seqs = [np.asarray(prompt[:9]), np.asarray(prompt[3:][::-1])]
    engine.reset_slots(2, 32)
    tokens = np.concatenate(seqs)
    positions = np.concatenate([np.arange(len(s)) for s in seqs])
    slots = np.concatenate([np.full(len(s), i) for i, s in enumerate(seqs)])
    both = engine.step_rows(tokens, positions, slots)
    at = 0
    for seq in seqs:
        engine.reset_slots(2, 32)
        alone = engine.step_rows(seq, np.arange(len(seq)), np.zeros(len(seq), np.int64))
        assert np.allclose(both[at : at + len(seq)], alone, rtol=0, atol=1e-5)
        at += len(seq)
