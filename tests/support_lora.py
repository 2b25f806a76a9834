"""A LoRA run folder made by hand for the tests: a small random Llama saved as an attnlm run
(the base) and adapters over it with random values, saved as a LoRA run."""

from __future__ import annotations

import torch

from attnlm.loading import sources
from attnlm.loading.checkpoint import save_checkpoint
from attnlm.lora.layers import LoRAConfig, apply_lora
from attnlm.lora.run import lora_table
from attnlm.models import registry
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
