"""A LoRA run folder (:mod:`attnlm.lora_run`): adapters only on disk, the base found again by
its SPEC through ``--model RUN`` (:func:`attnlm.sources.resolve`), the same logits as the
adapted model in memory, and a changed base refused in one line."""

from __future__ import annotations

import pytest
import torch

from attnlm import sources
from attnlm.checkpoint import load_checkpoint, save_checkpoint
from attnlm.errors import InputError
from attnlm.lora_run import lora_table
from attnlm.models import registry
from attnlm.nn.lora import LoRAConfig, apply_lora, lora_state_dict
from attnlm.tokenizers.char import CharTokenizer

TEXT = "to be or not to be, that is the question"


def make_base(tmp_path):
    """An attnlm run folder holding a small random Llama."""
    torch.manual_seed(0)
    tok = CharTokenizer.train(TEXT)
    table = dict(type="llama", vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=4,
                 n_kv_head=2, n_embd=64, d_ff=96)  # fmt: skip
    model, cfg, family = registry.build(table)
    config = {"preset": "", "model": registry.config_table(family, cfg), "train": {}}
    save_checkpoint(tmp_path / "base" / "checkpoint", model, config, tok, {})
    return tmp_path / "base"


def make_lora_run(tmp_path, base_dir):
    model, tok, info = sources.resolve(base_dir)
    cfg = LoRAConfig(4, alpha=8, targets=("q", "v", "down"))
    apply_lora(model, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.3)
    model_table = registry.config_table(info.family, model.config)
    config = {"preset": "", "model": model_table, "train": {},
              "lora": lora_table(cfg, str(base_dir), info.path, model_table)}  # fmt: skip
    run = tmp_path / "lora"
    save_checkpoint(run / "checkpoint", model, config, tok, {})
    return run, model, tok


def test_run_holds_adapters_only_and_loads_with_its_base(tmp_path):
    base_dir = make_base(tmp_path)
    run, adapted, tok = make_lora_run(tmp_path, base_dir)
    saved = (run / "checkpoint" / "model.safetensors").stat().st_size
    full = (base_dir / "checkpoint" / "model.safetensors").stat().st_size
    adapters = sum(v.numel() * 4 for v in lora_state_dict(adapted).values())
    assert saved < adapters + 4096 and saved < full / 5
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        want = adapted(ids).logits
    loaded, tok2, info = sources.resolve(run)
    assert info.kind == "run" and info.checkpoint.path == run / "checkpoint"
    assert tok2.encode(TEXT) == tok.encode(TEXT)
    with torch.no_grad():
        assert (loaded(ids).logits - want).abs().max() < 1e-5  # merged at load
    unmerged, _, _ = sources._load_lora_run(run, str(run), "cpu", merge=False)
    with torch.no_grad():
        assert torch.equal(unmerged(ids).logits, want)
    with pytest.raises(InputError, match="a LoRA run"):
        load_checkpoint(run)


def test_changed_base_is_refused(tmp_path):
    base_dir = make_base(tmp_path)
    run, _, _ = make_lora_run(tmp_path, base_dir)
    weights = base_dir / "checkpoint" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # the last bytes of the last tensor
    weights.write_bytes(bytes(data))
    with pytest.raises(InputError, match="not the one these adapters were trained on") as e:
        sources.resolve(run)
    assert "\n" not in str(e.value) and "model.safetensors changed" in str(e.value)
