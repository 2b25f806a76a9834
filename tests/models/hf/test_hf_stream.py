"""Reading a Hugging Face folder's safetensors straight into the model (``hf/stream.py``) gives
the tensors of the reference path: the whole state dict read by ``safetensors``, mapped by
``to_ours`` and copied by ``load_state_dict``; GPT-2 (transposed Conv1D weights), Llama (q, k,
v joined into one weight), a sharded folder, weights stored in another dtype, and the damage
the streamed reader must refuse in one line."""

from __future__ import annotations

import json
import struct

import pytest
import torch

pytest.importorskip("transformers")

from attnlm.base.errors import InputError  # noqa: E402
from attnlm.models.hf import folder as hf_folder  # noqa: E402
from attnlm.models.hf import gpt2, llama  # noqa: E402
from attnlm.models.hf.mapping import to_ours  # noqa: E402
from support_tl import random_folder  # noqa: E402

ADAPTERS = {"gpt2": gpt2, "llama": llama}


def _reference(kind: str, path):
    """The model loaded the way the folder was loaded before streaming: the whole state dict
    in memory, mapped, then copied in by load_state_dict."""
    adapter = ADAPTERS[kind]
    hf = hf_folder.read_hf_config(path)
    if kind == "gpt2":
        cfg = gpt2.GPTConfig(**gpt2.config_from_hf(hf, where="config.json"))
    else:
        cfg = llama.LlamaConfig(**llama.config_from_hf(hf, where="config.json"))
    model = adapter.MODEL(cfg)
    state = to_ours(adapter.layout(cfg), hf_folder.read_hf_weights(path))
    return hf_folder.load_mapped_state(model, state, path, adapter.layout(cfg).optional)


def _same(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    assert (a.lm_head.weight is a.tok_emb.weight) == (b.lm_head.weight is b.tok_emb.weight)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_streamed_weights_equal_the_reference_path(tmp_path, kind):
    path = random_folder(kind, tmp_path / kind, seed=3)
    streamed = ADAPTERS[kind].load(path)
    _same(streamed, _reference(kind, path))
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(streamed(ids).logits, _reference(kind, path)(ids).logits)


def test_sharded_and_bfloat16_folders_stream_like_the_reference(tmp_path):
    from safetensors.torch import load_file, save_file

    path = random_folder("llama", tmp_path / "m", seed=4)
    state = load_file(path / "model.safetensors")
    names = sorted(state)
    (path / "model.safetensors").unlink()
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    for shard, keys in halves.items():  # stored as bfloat16: converted on the way in
        save_file({k: state[k].to(torch.bfloat16) for k in keys}, path / shard)
    weight_map = {k: shard for shard, keys in halves.items() for k in keys}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    streamed = llama.load(path)
    _same(streamed, _reference("llama", path))
    assert streamed.tok_emb.weight.dtype == torch.float32


def _rewrite_header(file, edit) -> None:
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8 : 8 + n])
    edit(head)
    new = json.dumps(head).encode()
    file.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n :])


def _first(head: dict) -> dict:
    return head[next(k for k in sorted(head) if k != "__metadata__")]


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f.write_bytes(f.read_bytes()[:-100]),  # truncated
        lambda f: _rewrite_header(f, lambda h: _first(h).update(shape=[3, 3])),
        lambda f: _rewrite_header(f, lambda h: _first(h).update(dtype="F8_E9")),
        lambda f: _rewrite_header(f, lambda h: _first(h).update(data_offsets=[0, 2**60])),
        lambda f: f.write_bytes(struct.pack("<Q", 2**40) + f.read_bytes()[8:]),
    ],
    ids=["truncated", "shape-lies", "unknown-dtype", "offset-past-end", "huge-header"],
)
def test_damaged_weights_are_refused_in_one_line(tmp_path, damage):
    path = random_folder("gpt2", tmp_path / "m", seed=5)
    damage(path / "model.safetensors")
    with pytest.raises(InputError) as e:
        gpt2.load(path)
    assert "\n" not in str(e.value) and "model.safetensors" in str(e.value)


def test_a_weight_of_the_wrong_shape_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    path = random_folder("gpt2", tmp_path / "m", seed=6)
    state = load_file(path / "model.safetensors")
    key = next(k for k in state if k.endswith("ln_f.weight"))
    state[key] = torch.ones(5)
    save_file(state, path / "model.safetensors")
    with pytest.raises(InputError, match=r"ln_f\.weight.* has shape \(5,\), config.json implies"):
        gpt2.load(path)
