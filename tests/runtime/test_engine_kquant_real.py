"""Slow: a real Q4_K_M file on the C engine in its own blocks. SmolLM2-135M-Instruct (the cached
``smollm2-135m-instruct`` file, Q4_1) requantized to Q4_K_M by llama.cpp's own quantizer
(``llama_cpp.llama_model_quantize``) into a temporary folder: its matrices mix Q5_0, Q8_0,
Q4_K and Q6_K. Skipped without llama-cpp-python or the cached file.

- float activations: logits equal the PyTorch path's float32 forward of the same file
  (``--weights f32``: the blocks dequantized by :func:`attnlm.quant.blocks.dequantize`)
  within 1e-4 of each position's logit range (measured: 5e-6);
- the default (integer activations) and llama.cpp: the same 32 greedy tokens. Their logits
  are not compared closely: llama.cpp's own differ from the float32 forward by about 3% of
  the logit range on this file (measured; its activations are quantized to 8 bits and its
  keys and values held in float16), ours by a like amount.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.runtime.engine_gguf import AS_STORED, engine_format, open_engine

NO_CC = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")
pytestmark = [pytest.mark.slow, NO_CC]
PROMPT = b"The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    llama_cpp = pytest.importorskip("llama_cpp")
    from attnlm.data.corpus import cache_dir
    from attnlm.data.pretrained import PRETRAINED

    name = "smollm2-135m-instruct"
    source = cache_dir() / "pretrained" / name / PRETRAINED[name].files[0]
    if not source.is_file():
        pytest.skip(f"{name} is not in attnlm's cache")
    out = tmp_path_factory.mktemp("kquant") / "smollm2-q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.allow_requantize = True
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                          ctypes.byref(params)) == 0  # fmt: skip
    header = GGUFFile(out)
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} <= set(header.bytes_per_type())
    assert engine_format(header, None) == AS_STORED
    return out


def test_float_activations_equal_the_float32_forward(q4_k_m, monkeypatch):
    import torch

    from attnlm.models import gguf

    header = GGUFFile(q4_k_m)
    model = gguf.load_model(header, "f32").eval()
    ids = np.random.default_rng(0).integers(0, 49152, size=(1, 40))
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).logits.numpy()[0]
    monkeypatch.setenv("ATTNLM_GGML_ACTIVATIONS", "float")
    engine = open_engine(header, None, 2)
    engine.reset(1)
    got = engine.feed(ids)[0]
    spread = want.max(-1) - want.min(-1)
    assert (np.abs(got - want).max(-1) / spread).max() < 1e-4


def test_greedy_tokens_equal_llama_cpps(q4_k_m, monkeypatch):
    from llama_cpp import Llama

    llm = Llama(str(q4_k_m), n_ctx=256, n_threads=2, verbose=False)
    prompt = llm.tokenize(PROMPT, add_bos=False)
    theirs = []
    for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        theirs.append(token)
        if len(theirs) == 32:
            break
    monkeypatch.delenv("ATTNLM_GGML_ACTIVATIONS", raising=False)
    engine = open_engine(GGUFFile(q4_k_m), None, 2)
    engine.reset(1)
    token = int(engine.feed(np.array([prompt]), last_only=True)[0, 0].argmax())
    ours = []
    for _ in range(32):
        ours.append(token)
        token = int(engine.feed(np.array([[token]]), last_only=True)[0, 0].argmax())
    assert ours == theirs
    assert os.environ.get("ATTNLM_GGML_ACTIVATIONS") is None
