"""The GPU preset: nanoGPT's shakespeare_char recipe with bf16 autocast and torch.compile."""

from __future__ import annotations

from attnlm.models import registry
from attnlm.train.config import load_spec

# nanoGPT config/train_shakespeare_char.py, written out by hand
NANOGPT = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "dropout": 0.2}
NANOGPT_TRAIN = {"batch_size": 64, "lr": 1e-3, "min_lr": 1e-4, "max_iters": 5000,
                 "warmup_iters": 100, "beta2": 0.99, "eval_interval": 250,
                 "eval_iters": 200}  # fmt: skip


def test_gpu_preset_is_nanogpts_recipe_with_bf16_and_compile():
    spec = load_spec("shakespeare-char-gpu")
    family, cfg = registry.make_config({**spec.model, "vocab_size": 65})
    assert family.type == "gpt"
    assert {k: getattr(cfg, k) for k in NANOGPT} == NANOGPT
    train = spec.train
    assert {k: getattr(train, k) for k in NANOGPT_TRAIN} == NANOGPT_TRAIN
    assert (train.dtype, train.compile, train.device) == ("bfloat16", True, "cuda")
    assert train.fused
    assert "shakespeare-char-gpu" in registry.presets_of("gpt")
