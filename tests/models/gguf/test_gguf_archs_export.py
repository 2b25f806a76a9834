"""The Llama family's new parts written back to GGUF (:mod:`attnlm.models.gguf.writer`): each
architecture's fixture (``tests/fixtures/gguf_arch/``) loaded, exported as f32, loaded again:
the same config and logits; llama.cpp (``slow``, where ``llama_cpp`` imports) runs the exported
file with the same logits; a part the GGUF architecture cannot carry is refused naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf import load
from attnlm.models.gguf.writer import export_gguf
from attnlm.models.registry import build

HERE = Path(__file__).resolve().parents[2] / "fixtures" / "gguf_arch"
DOC = json.loads((HERE / "llamacpp.json").read_text(encoding="utf-8"))
ARCHS = sorted(DOC["archs"])
#: what llama.cpp's converter writes for each of our archs
WRITTEN = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
           "mixtral": "llama", "qwen3moe": "qwen3moe", "smollm3": "smollm3", "granite": "granite",
           "phi3": "phi3", "gemma2": "gemma2", "gemma3": "gemma3",
           "gemma3-linear": "gemma3", "gemma3-gqa4": "gemma3", "llama3": "llama",
           "mistral-nemo": "llama", "olmo2": "olmo2", "qwen3-yarn": "qwen3",
           "phi3-longrope": "phi3", "phi4-mini": "phi3", "olmo3": "olmo2",
           "gptoss": "gpt-oss"}  # fmt: skip


def _export(tmp_path, arch):
    model, tok = load(HERE / f"{arch}-Q8_0.gguf")
    out = tmp_path / f"{arch}.gguf"
    info = export_gguf(model, tok, out, "f32")
    return model, out, info


@pytest.mark.parametrize("arch", ARCHS)
def test_export_loads_back_the_same(tmp_path, arch):
    model, out, info = _export(tmp_path, arch)
    assert info["architecture"] == WRITTEN[arch]
    again, tok = load(out)
    assert again.config == model.config
    ids = torch.tensor([DOC["archs"][arch]["Q8_0"]["prompt"]])
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert tok.encode(DOC["test_text"]) == DOC["archs"][arch]["Q8_0"]["test_ids"]
    names = set(GGUFFile(out).tensors)
    assert names == set(GGUFFile(HERE / f"{arch}-Q8_0.gguf").tensors)  # the converter's names


PROBE = """
import json, sys
import numpy as np
from llama_cpp import Llama
path, ids = sys.argv[1], json.loads(sys.argv[2])
llm = Llama(model_path=path, n_ctx=128, n_threads=1, logits_all=True, type_k=0, type_v=0,
            flash_attn=False, verbose=False)
llm.eval(ids)
print(json.dumps(np.asarray(llm.scores[: len(ids)]).tolist()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_runs_the_export(tmp_path, arch):
    pytest.importorskip("llama_cpp")
    model, out, _ = _export(tmp_path, arch)
    ids = DOC["archs"][arch]["Q8_0"]["prompt"]
    run = subprocess.run([sys.executable, "-c", PROBE, str(out), json.dumps(ids)],
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    theirs = np.asarray(json.loads(run.stdout.strip().splitlines()[-1]), dtype=np.float32)
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - theirs).max() < 1e-3 * (theirs.max() - theirs.min())


def test_a_part_the_architecture_cannot_carry_is_refused(tmp_path):
    """Mistral's window: llama.cpp's converter writes Mistral as ``llama``, whose graph has no
    sliding window, so the export would run another model there."""
    _, tok = load(HERE / "mistral-Q8_0.gguf")
    table = {"type": "llama", "arch": "mistral", "vocab_size": 512, "block_size": 64,
             "n_layer": 1, "n_head": 4, "n_embd": 256, "d_ff": 256,
             "sliding_window": 16}  # fmt: skip
    model, _, _ = build(table)
    with pytest.raises(InputError, match="model.sliding_window = 16 cannot be exported") as e:
        export_gguf(model, tok, tmp_path / "m.gguf", "f32")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("arch", "layers"), [("smollm3", [1]), ("llama", [3])])
def test_layers_without_positions_llama_cpp_would_not_place_are_refused(tmp_path, arch, layers):
    """llama.cpp's ``smollm3`` graph leaves every fourth layer unrotated whatever the file says,
    and its ``llama`` graph rotates every layer: any other placement is refused."""
    _, tok = load(HERE / "smollm3-Q8_0.gguf")
    table = {"type": "llama", "arch": arch, "vocab_size": 512, "block_size": 64, "n_layer": 4,
             "n_head": 4, "n_embd": 256, "d_ff": 256, "nope_layers": layers}  # fmt: skip
    model, _, _ = build(table)
    with pytest.raises(InputError, match="model.nope_layers = .* cannot be exported") as e:
        export_gguf(model, tok, tmp_path / "m.gguf", "f32")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("arch", ["qwen3moe", "mixtral"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_experts_exported_in_blocks_run_on_the_engine(tmp_path, arch, kind):
    """A mixture of experts exported in 8- or 4-bit blocks (each expert's matrix quantized
    alone, stacked into ``ffn_*_exps``; the router kept F32): loaded back within the
    format's rounding of the model's logits (a rounding may swap a position's expert), and
    the C engine on the file (float activations) equals the PyTorch forward on it."""
    from attnlm import native
    from attnlm.runtime.engine_gguf import ACTIVATIONS_ENV, open_engine

    model, tok = load(HERE / f"{arch}-Q8_0.gguf")
    out = tmp_path / f"{arch}-{kind}.gguf"
    export_gguf(model, tok, out, kind)
    types = {n: i.type_name for n, i in GGUFFile(out).tensors.items()}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["blk.0.ffn_down_exps.weight"] == kind.upper()
    again, _ = load(out)
    ids = DOC["archs"][arch]["Q8_0"]["prompt"]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
        mine = again(torch.tensor([ids])).logits[0].numpy()
    span = ref.max() - ref.min()
    assert np.abs(mine - ref).max() < (0.1 if kind == "q4_0" else 0.02) * span
    if native._compiler() is None:
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ACTIVATIONS_ENV, "float")
        engine = open_engine(GGUFFile(out), None, 2)
        engine.reset(1)
        got = engine.feed(np.asarray([ids]))[0]
    assert np.abs(got - mine).max() < 1e-4 * span
