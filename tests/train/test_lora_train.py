"""LoRA through the trainer (:mod:`attnlm.lora.training`): the optimizer holds the adapters only,
the base's tensors stay bit-identical, the checkpoint holds the adapters alone, ``--model RUN``
gives the trained model back, and a resumed run continues from the saved adapters."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from attnlm.loading import sources
from attnlm.loading.checkpoint import CHECKPOINT_DIR, load_weights
from attnlm.loading.objectives import make_objective
from attnlm.lora.layers import lora_state_dict
from attnlm.lora.training import adapt, resume_model
from attnlm.models import registry
from attnlm.train.config import TrainConfig
from attnlm.train.optim import make_optimizer
from attnlm.train.trainer import MetricsLog, Trainer, TrainJob, TrainState
from support_lora import TEXT, make_base


def trainer_for(model, tok, cfg, run_dir, table):
    objective = make_objective("causal", tok, model.config)
    ids = np.asarray(tok.encode(TEXT * 30), dtype=np.int64)
    model_table = registry.config_table(registry.family_of(model), model.config)
    job = TrainJob(
        model=model, optimizer=make_optimizer(model, cfg, "cpu"), config=cfg,
        train=objective.source(ids, 1.0, 32), val=objective.source(ids, 1.0, 32),
        run_dir=run_dir, tokenizer=tok, device=torch.device("cpu"), log=lambda *a: None,
        checkpoint_config={"preset": "", "model": model_table,
                           "train": dataclasses.asdict(cfg), "lora": table},
    )  # fmt: skip
    trainer = Trainer(job)
    trainer.state = TrainState()
    return trainer


def test_lora_run_trains_adapters_only(tmp_path):
    base_dir = make_base(tmp_path)
    model, tok, info = sources.resolve(base_dir)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = TrainConfig(lora=4, lora_alpha=8, lora_targets="q,v,down", max_iters=4, eval_interval=4,
                      eval_iters=1, batch_size=4, lr=1e-2, warmup_iters=0, progress=False,
                      device="cpu")  # fmt: skip
    table = adapt(model, cfg, str(base_dir), info.path)
    assert table["targets"] == ["q", "v", "down"] and table["base"] == str(base_dir.resolve())
    run = tmp_path / "run"
    trainer = trainer_for(model, tok, cfg, run, table)
    optimized = {id(p) for g in trainer.opt.param_groups for p in g["params"]}
    adapters = {id(p) for n, p in model.named_parameters() if ".lora_" in n}
    assert optimized == adapters
    trainer.fit(MetricsLog(run / "metrics.jsonl", True, None))
    after = model.state_dict()
    for key, value in base.items():
        assert torch.equal(after[key], value), key  # the base is bit-identical
    trained = {k: v.clone() for k, v in lora_state_dict(model).items()}
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in trained.items())

    saved = run / CHECKPOINT_DIR / "model.safetensors"
    assert saved.stat().st_size < sum(v.numel() * 4 for v in trained.values()) + 4096
    loaded, _, _ = sources.resolve(run)
    ids = torch.tensor([tok.encode(TEXT)])
    model.eval()
    with torch.no_grad():
        assert (loaded(ids).logits - model(ids).logits).abs().max() < 1e-5

    again, tok2, _ = resume_model(run)  # resume: base from SPEC, adapters from the checkpoint
    load_weights(again, run / CHECKPOINT_DIR)
    for key, value in lora_state_dict(again).items():
        assert torch.equal(value, trained[key]), key
    more = dataclasses.replace(cfg, max_iters=6)
    resumed = trainer_for(again, tok2, more, run, table)
    resumed.load_state_dict(torch.load(run / CHECKPOINT_DIR / "state.pt", weights_only=True))
    assert resumed.state.step == 4
    resumed.fit(MetricsLog(run / "metrics.jsonl", True, 4))
    assert resumed.state.step == 6
