"""Checkpoints: atomic replacement, a failing write (disk full) keeps the previous one intact."""

import errno
import json

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.loading import checkpoint as C
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.tokenizers.char import CharTokenizer


def make(seed):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_embd=8, positions="rope")
    return GPT(cfg), cfg


def save(path, model, cfg, step):
    from dataclasses import asdict

    config = {"model_type": "gpt", "step": step, "model": asdict(cfg), "train": {}}
    state = {"trainer": {"step": step}, "rng": torch.get_rng_state()}
    return C.save_checkpoint(path, model, config, CharTokenizer.train("abcde"), state)


def test_roundtrip_and_replacement(tmp_path):
    m1, cfg = make(0)
    save(tmp_path / "checkpoint", m1, cfg, 1)
    m2, _ = make(1)
    save(tmp_path / "checkpoint", m2, cfg, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no temp or .old left
    ck = C.load_checkpoint(tmp_path)
    assert ck.step == 2
    for a, b in zip(ck.model.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    # tied embeddings stay tied after loading
    assert ck.model.lm_head.weight.data_ptr() == ck.model.tok_emb.weight.data_ptr()
    assert ck.load_state()["trainer"]["step"] == 2  # loaded with weights_only=True


@pytest.mark.parametrize("target", ["torch.save", "tokenizer"])
def test_failing_write_keeps_previous_checkpoint(tmp_path, monkeypatch, target):
    m1, cfg = make(0)
    save(tmp_path / "checkpoint", m1, cfg, 1)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoint").iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if target == "torch.save":
        monkeypatch.setattr(C.torch, "save", disk_full)
    else:
        monkeypatch.setattr(CharTokenizer, "save", disk_full)
    m2, _ = make(1)
    with pytest.raises(C.CheckpointError, match="No space left on device.*intact"):
        save(tmp_path / "checkpoint", m2, cfg, 2)
    after = {p.name: p.read_bytes() for p in (tmp_path / "checkpoint").iterdir()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert C.load_checkpoint(tmp_path).step == 1


def test_kill_between_renames_leaves_old_checkpoint(tmp_path):
    m1, cfg = make(0)
    save(tmp_path / "checkpoint", m1, cfg, 1)
    # the state right after `checkpoint` -> `checkpoint.old` and before the new one moved in
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
    assert C.resolve_checkpoint(tmp_path).name == "checkpoint.old"
    assert C.load_checkpoint(tmp_path).step == 1


def test_missing_and_corrupt(tmp_path):
    with pytest.raises(InputError, match="no such"):
        C.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(InputError, match="no checkpoint found"):
        C.load_checkpoint(tmp_path)
    m1, cfg = make(0)
    path = save(tmp_path / "checkpoint", m1, cfg, 1)
    (path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="config.json: not a valid"):
        C.load_checkpoint(tmp_path)
    save(tmp_path / "checkpoint", m1, cfg, 1)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="model.safetensors: missing or corrupt"):
        C.load_checkpoint(tmp_path)
    save(tmp_path / "checkpoint", m1, cfg, 1)
    (path / "state.pt").write_bytes(b"junk")
    with pytest.raises(InputError, match="state.pt"):
        C.load_checkpoint(tmp_path).load_state()
    config = json.loads((path / "config.json").read_text())
    config["format"] = "something-else"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="not an attnlm checkpoint"):
        C.load_checkpoint(tmp_path)
