"""A LoRA run folder (:mod:`attnlm.lora.run`): adapters only on disk, the base found again by
its SPEC through ``--model RUN`` (:func:`attnlm.loading.sources.resolve`), the same logits as the
adapted model in memory, and a changed base refused in one line."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.loading import sources
from attnlm.loading.checkpoint import load_checkpoint
from attnlm.lora.layers import lora_state_dict
from support_lora import TEXT, make_base, make_lora_run


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
    unmerged, _, _ = sources.load_lora_run(run, "cpu", merge=False)
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
