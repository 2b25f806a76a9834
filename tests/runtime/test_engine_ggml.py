"""The C engine on GGUF files whose matrices it multiplies in their ggml blocks as stored
(:data:`attnlm.runtime.engine_gguf.AS_STORED`: K-quants, Q5_0, F16, ... mixed), against
``transformers``' ``LlamaForCausalLM`` holding the float32 values the file holds (what
``gguf.quants.dequantize`` reads back; K-quant blocks are random with sane scales):

- with float activations (``ATTNLM_GGML_ACTIVATIONS=float``): logits within 2e-5 of each
  position's logit range (the float32 forward summed in another order: the random K-quant
  blocks make logits of magnitude 50, where float32 rounding alone is some 3e-4 absolute,
  3e-6 of the range; one wrong block moves logits by about 1e-2 of it) and the same greedy
  tokens;
- with the default integer activations (llama.cpp's way, each product's input quantized to
  8 bits per block: of 32 for the 32-blocks, of 256 for the K-quants (llama.cpp's Q8_K);
  each product alone is tested exactly in tests/native/test_ggml_kernels.py, and the whole
  against llama.cpp in tests/runtime/test_engine_llamacpp.py): logits within 10% of each
  position's logit range, 1.5% in the median (8-bit inputs err by up to 1/254 of a block's
  largest value; this random model's large weights amplify that through 2 layers to
  0.8-1.3% in the median, 7.7% at most with a Q6_K head, whose blocks of 256 share one
  scale, measured), top tokens equal where the reference's margin is clear.
The matrices are views of a memory map of the file (no copy), and every type is used. A
second file holds every matrix in MXFP4 (gpt-oss's experts' type; the products alone are
tested bit for bit in tests/native/test_mxfp4_products.py), to the same bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import support_runtime
from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.generate import SamplingConfig, engine_decode
from attnlm.native import structs
from attnlm.runtime.engine_gguf import AS_STORED, engine_format, open_engine
from gguf_support import write_llama

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")

V = 300
TYPES = ("Q6_K", "Q4_K", "Q5_K", "Q8_0", "Q5_0", "Q4_1", "Q4_0", "Q5_1", "F16", "BF16", "F32")


def hf_llama(tied: bool):
    return support_runtime.hf_llama(tied, V, width=256, ffn=512, seed=7)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """tied -> (path, transformers model holding what the file holds)"""
    out = {}
    for tied, types in ((True, TYPES), (False, TYPES[3:] + TYPES[:3])):
        path = tmp_path_factory.mktemp("gguf") / f"mixed-{tied}.gguf"
        model = hf_llama(tied)
        held = write_llama(path, model, types=types)
        state = {k: torch.from_numpy(np.array(v)) for k, v in held.items()}
        if tied:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=False)
        out[tied] = (path, model)
    return out


def reference(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def ours(engine, ids: np.ndarray) -> np.ndarray:
    """A prefill of 70 tokens (two calls), then 2, 1 and 2 tokens, the last position alone."""
    engine.reset(ids.shape[0])
    return np.concatenate([
        engine_decode._feed(engine, ids[:, :70], last_only=False),
        engine.feed(ids[:, 70:72]), engine.feed(ids[:, 72:73]),
        engine.feed(ids[:, 73:75], last_only=True),
    ], axis=1)  # fmt: skip


@pytest.mark.parametrize("tied", [True, False])
def test_float_activations_equal_the_float32_forward(files, tied, monkeypatch):
    monkeypatch.setenv("ATTNLM_GGML_ACTIVATIONS", "float")
    path, hf = files[tied]
    header = GGUFFile(path)
    assert engine_format(header, None) == AS_STORED
    assert engine_format(header, "q4") is None  # converting is the PyTorch path's
    engine = open_engine(header, None, 2)
    used = {engine.head.fmt} | {x.fmt for b in engine.blocks
                                for x in (b.qkv, b.k, b.v, b.out, b.fc, b.up, b.proj)}  # fmt: skip
    assert used == {structs.GGML_FORMATS[t] for t in TYPES}
    for b in engine.blocks:  # views of the file's map: no copy
        assert isinstance(b.qkv.w.base, np.memmap) or isinstance(b.qkv.w, np.memmap)
        assert b.qkv.act == structs.ACT_FLOAT
    ids = np.random.default_rng(0).integers(0, V, size=(2, 75))
    got, want = ours(engine, ids), reference(hf, ids)
    want = np.concatenate([want[:, :73], want[:, 74:75]], axis=1)
    spread = want.max(axis=-1, keepdims=True) - want.min(axis=-1, keepdims=True)
    assert (np.abs(got - want) <= 2e-5 * spread).all(), np.abs(got - want).max()


def test_float_activations_give_the_forwards_greedy_tokens(files, monkeypatch):
    monkeypatch.setenv("ATTNLM_GGML_ACTIVATIONS", "float")
    path, hf = files[True]
    engine = open_engine(GGUFFile(path), None, 2)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    greedy = SamplingConfig(temperature=0, max_new_tokens=24)
    got = engine_decode.decode(engine, [prompt], greedy, lookahead=0)[0]
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                       pad_token_id=0).numpy()[0, len(prompt):].tolist()  # fmt: skip
    assert got == want


@pytest.mark.parametrize("tied", [True, False])
def test_integer_activations_follow_the_forward(files, tied, monkeypatch):
    monkeypatch.delenv("ATTNLM_GGML_ACTIVATIONS", raising=False)
    path, hf = files[tied]
    engine = open_engine(GGUFFile(path), None, 2)
    assert engine.blocks[0].qkv.act == structs.ACT_AUTO  # the C default: integers
    ids = np.random.default_rng(1).integers(0, V, size=(2, 75))
    got, want = ours(engine, ids)[:, :73], reference(hf, ids)[:, :73]
    spread = want.max(axis=-1) - want.min(axis=-1)
    off = np.abs(got - want).max(axis=-1) / spread  # per position, of its logit range
    assert off.max() <= 0.1 and np.median(off) <= 0.015, (off.max(), np.median(off))
    top2 = np.sort(want, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 0.05 * spread
    assert clear.sum() > 50
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()


def test_a_nan_block_scale_is_refused(files, tmp_path):
    path, _ = files[True]
    header = GGUFFile(path)
    name = next(n for n, i in header.tensors.items() if i.type_name == "Q4_K")
    info = header.tensors[name]
    data = bytearray(path.read_bytes())
    nan = np.array([np.nan], np.float16).tobytes()
    at = info.offset + 144 * 3 + 2  # the fourth block's dmin
    data[at : at + 2] = nan
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    from attnlm.base.errors import InputError

    with pytest.raises(InputError, match=f"{name}.*NaN"):
        open_engine(GGUFFile(bad), None, 1)


@pytest.fixture(scope="module")
def mxfp4_file(tmp_path_factory):
    """(path, transformers model) of a Llama whose every matrix is MXFP4 (gpt-oss's experts'
    type), the token embedding's rows too"""
    path = tmp_path_factory.mktemp("gguf") / "mxfp4.gguf"
    model = hf_llama(False)
    held = write_llama(path, model, types=("MXFP4",))
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in held.items()},
                          strict=False)  # fmt: skip
    return path, model


@pytest.mark.parametrize("act", ["float", "int"])
def test_mxfp4_matrices_follow_the_forward(mxfp4_file, act, monkeypatch):
    """Float activations: within 2e-5 of each position's logit range; integer ones (8 bits per
    block of 32, llama.cpp's way): within 10% of it, 1.5% in the median (as above)."""
    monkeypatch.setenv("ATTNLM_GGML_ACTIVATIONS", act)
    path, hf = mxfp4_file
    header = GGUFFile(path)
    assert engine_format(header, None) == AS_STORED
    engine = open_engine(header, None, 2)
    assert {x.fmt for b in engine.blocks for x in (b.qkv, b.out, b.fc, b.proj)} == {structs.MXFP4}
    ids = np.random.default_rng(2).integers(0, V, size=(2, 75))
    got, want = ours(engine, ids)[:, :73], reference(hf, ids)[:, :73]
    off = np.abs(got - want).max(axis=-1) / (want.max(axis=-1) - want.min(axis=-1))
    if act == "float":
        assert off.max() <= 2e-5, off.max()
    else:
        assert off.max() <= 0.1 and np.median(off) <= 0.015, (off.max(), np.median(off))


def test_an_infinite_mxfp4_value_is_refused(mxfp4_file, tmp_path):
    """MXFP4's scale 2^(e - 128) has no NaN, but e = 255 makes values of 2 or more infinite
    (2^128): refused as the PyTorch loader refuses them; e = 255 where the block's values are
    0 or +-1 (2^127 at most) is finite and kept."""
    path, _ = mxfp4_file
    header = GGUFFile(path)
    name = next(n for n, i in header.tensors.items() if n.endswith("attn_q.weight"))
    at = header.tensors[name].offset + 17 * 5  # the sixth block's e
    data = bytearray(path.read_bytes())
    data[at : at + 17] = bytes([255, *[0x19] * 16])  # nibbles 9 (-1) and 1 (+1)
    finite = tmp_path / "finite.gguf"
    finite.write_bytes(bytes(data))
    open_engine(GGUFFile(finite), None, 1)
    data[at + 1] = 0x29  # nibble 2 (+2): 2^128
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    from attnlm.base.errors import InputError

    with pytest.raises(InputError, match=f"{name}.*infinite"):
        open_engine(GGUFFile(bad), None, 1)
