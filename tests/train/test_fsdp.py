"""FSDP2 (``parallel = "fsdp"``): sharding, sharded checkpoints, export, and training.

One process (a gloo group of one, in this process): which modules become units, and the
state-dict round trip (save the shards, load them back, export them to an ordinary
checkpoint). Two CPU processes under torchrun (gloo): the losses and weights of one process
with the same global batch, and a killed run resumed from its shards giving the uninterrupted
run's losses and weights exactly, its export continuing under DDP.
"""

import dataclasses
import json
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

from support import CITIZENS, loss_curve, losses, run_cli, torchrun, train

GPT = {"type": "gpt", "vocab_size": 20, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8}


@contextmanager
def one_process_group():
    """A gloo process group of this one process (FSDP needs a group; DCP uses it)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model(table):
    from attnlm.models import registry

    torch.manual_seed(0)
    return registry.build(table)


def _step(model, opt, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 20, (2, 8), generator=gen)
    model(ids=ids, targets=ids.roll(-1, 1)).loss.backward()
    opt.step()
    opt.zero_grad()


def test_each_block_is_a_unit_then_the_root():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from attnlm.train.fsdp import shard

    model, _, _ = _model(GPT)
    rnn, _, _ = _model({"type": "rnn", "vocab_size": 20, "n_layer": 2, "n_embd": 8})
    with one_process_group():
        assert shard(model, torch.device("cpu")) == 2
        assert shard(rnn, torch.device("cpu")) == 0  # no transformer blocks: the root only
    assert isinstance(model, FSDPModule)
    assert all(isinstance(b, FSDPModule) for b in model.blocks)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert model.lm_head.weight is model.tok_emb.weight  # still tied
    assert isinstance(rnn, FSDPModule) and not isinstance(rnn.layers[0], FSDPModule)


FAMILIES = {
    "gpt": GPT,
    "llama": {"type": "llama", "vocab_size": 20, "block_size": 8, "n_layer": 2, "n_head": 2,
              "n_kv_head": 1, "n_embd": 8, "multiple_of": 8},
    "bert": {"type": "bert", "vocab_size": 20, "block_size": 8, "n_layer": 2, "n_head": 2,
             "n_embd": 8},
    "rnn": {"type": "rnn", "vocab_size": 20, "n_layer": 2, "n_embd": 8},
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_sharded_model_trains_like_the_plain_one(family):
    """In a group of one, the sharded model (blocks and root as units, DTensor parameters,
    AdamW on the shards) takes the same steps as the plain model: same losses and weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from attnlm.train.config import TrainConfig
    from attnlm.train.fsdp import shard
    from attnlm.train.optim import make_optimizer

    cfg = TrainConfig()
    ids = torch.randint(0, 20, (3, 2, 8), generator=torch.Generator().manual_seed(1))

    def train(sharded):
        model, _, _ = _model(FAMILIES[family])
        if sharded:
            shard(model, torch.device("cpu"))
        opt = make_optimizer(model, cfg, "cpu")
        curve = []
        for batch in ids:
            loss = model(ids=batch, targets=batch.roll(-1, 1)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            curve.append(loss.item())
        return curve, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

    plain_curve, plain = train(False)
    with one_process_group():
        sharded_curve, weights = train(True)
    assert sharded_curve == pytest.approx(plain_curve, abs=1e-6)
    assert plain.keys() == weights.keys()
    assert max(float((plain[k] - weights[k]).abs().max()) for k in plain) < 1e-6


def test_sharded_checkpoint_round_trip_and_export(tmp_path):
    """Save the shards of a trained model, read them back into a fresh sharded model and
    optimizer (the same tensors), and export them in a process without a group: the
    ordinary checkpoint holds the same weights (as does the model.safetensors gathered at
    saving) and the same AdamW state, in AdamW's own layout."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from attnlm.loading.checkpoint import load_checkpoint, load_state
    from attnlm.models import registry
    from attnlm.tokenizers.char import CharTokenizer
    from attnlm.train.config import TrainConfig
    from attnlm.train.fsdp import export_checkpoint, load_sharded, save_sharded, shard
    from attnlm.train.optim import make_optimizer, param_groups

    cfg = TrainConfig(parallel="fsdp")
    config = {"preset": "", "train": dataclasses.asdict(cfg), "step": 3}
    tokenizer = CharTokenizer.train("abcdefghijklmnopqrs")
    run = tmp_path / "run"
    full = StateDictOptions(full_state_dict=True)
    with one_process_group():
        model, model_cfg, family = _model(GPT)
        config["model"] = registry.config_table(family, model_cfg)
        shard(model, torch.device("cpu"))
        opt = make_optimizer(model, cfg, "cpu")
        for seed in range(3):
            _step(model, opt, seed)
        ckpt = save_sharded(run / "checkpoint", model, opt, config, tokenizer, {"trainer": {}})
        weights = get_model_state_dict(model, options=full)
        adam = get_optimizer_state_dict(model, opt, options=full)["state"]

        fresh, _, _ = _model(GPT)
        torch.nn.init.zeros_(fresh.tok_emb.weight)  # differs from the saved model
        shard(fresh, torch.device("cpu"))
        fresh_opt = make_optimizer(fresh, cfg, "cpu")
        load_sharded(fresh, fresh_opt, ckpt)
        loaded = get_model_state_dict(fresh, options=full)
        loaded_adam = get_optimizer_state_dict(fresh, fresh_opt, options=full)["state"]
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["config.json", "model.safetensors", "shards", "state.pt", "tokenizer.json"]
    assert not list(run.glob(".*"))  # no temporary folder left
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    assert adam.keys() == loaded_adam.keys()
    for name, state in adam.items():
        for key, value in state.items():
            assert torch.equal(loaded_adam[name][key], value), (name, key)
    gathered = load_checkpoint(run).model.state_dict()  # model.safetensors
    assert all(torch.equal(gathered[k], weights[k]) for k in weights)

    out = export_checkpoint(run, tmp_path / "exported")
    exported = load_checkpoint(tmp_path / "exported")
    assert exported.step == 3 and exported.train_config["parallel"] == "ddp"
    assert not (out / "shards").exists()
    got = exported.model.state_dict()
    assert all(torch.equal(got[k], weights[k]) for k in weights)
    plain = load_state(out)["optimizer"]  # AdamW's layout: index i = i-th parameter of groups
    name_of = {id(p): n for n, p in exported.model.named_parameters()}
    order = [name_of[id(p)] for g in param_groups(exported.model, 0.1) for p in g["params"]]
    assert sorted(order) == sorted(adam)  # the tied matrix once
    for i, name in enumerate(order):
        for key, value in adam[name].items():
            assert torch.equal(plain["state"][i][key], value), (name, key)


def test_a_failed_sharded_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """Shards that cannot be written: a one-line CheckpointError, the previous checkpoint
    untouched and no temporary folder left (also none from an earlier killed save)."""
    import torch.distributed.checkpoint as dcp

    from attnlm.loading.checkpoint import CheckpointError, read_config
    from attnlm.models import registry
    from attnlm.tokenizers.char import CharTokenizer
    from attnlm.train.config import TrainConfig
    from attnlm.train.fsdp import save_sharded, shard
    from attnlm.train.optim import make_optimizer

    cfg = TrainConfig(parallel="fsdp")
    tokenizer = CharTokenizer.train("abcdefghijklmnopqrs")
    ckpt = tmp_path / "run" / "checkpoint"
    with one_process_group():
        model, model_cfg, family = _model(GPT)
        config = {"model": registry.config_table(family, model_cfg), "train": {}, "step": 1}
        shard(model, torch.device("cpu"))
        opt = make_optimizer(model, cfg, "cpu")
        _step(model, opt, 0)
        save_sharded(ckpt, model, opt, config, tokenizer, {})
        before = {str(p.relative_to(ckpt)): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
        killed = tmp_path / "run" / ".checkpoint.shards-tmp"  # as a killed save leaves it
        killed.mkdir()
        (killed / "__0_0.distcp").write_bytes(b"half")

        def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(dcp, "save", full_disk)
        _step(model, opt, 1)
        with pytest.raises(CheckpointError, match="previous checkpoint .* is intact") as e:
            save_sharded(ckpt, model, opt, {**config, "step": 2}, tokenizer, {})
        assert "\n" not in str(e.value)
    after = {str(p.relative_to(ckpt)): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    assert after == before and read_config(ckpt)["step"] == 1
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint"]


def test_export_refuses_an_ordinary_checkpoint_in_one_line(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    run = tmp_path / "run"
    r = run_cli(capsys, "train", "--preset", "tiny-test", "--text", corpus, "--max-iters", "2",
                "--eval-iters", "1", "--no-progress", "--out", run)  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli(capsys, "export-checkpoint", "--checkpoint", run, "--out", tmp_path / "x")
    assert r.code == 2 and "not a sharded checkpoint" in r.err and r.err.count("\n") == 1


def test_fsdp_setting_errors_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    common = ["train", "--preset", "tiny-test", "--text", corpus, "--out", tmp_path / "r"]
    r = run_cli(capsys, *common, "--parallel", "fsdp")  # not under torchrun
    assert r.code == 2 and "torchrun" in r.err and r.err.count("\n") == 1, r.err
    r = run_cli(capsys, *common, "--set", "train.parallel=zero")
    assert r.code == 2 and "train.parallel must be one of ddp, fsdp" in r.err, r.err
    assert r.err.count("\n") == 1
    r = run_cli(capsys, *common, "--parallel", "zero")
    assert r.code == 2 and r.err.count("\n") == 1, r.err


# -- two processes under torchrun (gloo) ---------------------------------------------------------


def _weights(run):
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoint" / "model.safetensors"))


@pytest.mark.slow
def test_two_fsdp_processes_match_one_process(tmp_path):
    """2 processes x 4 windows x 2 micro-steps = 1 process x 4 windows x 4 micro-steps: the
    same 16 windows per step, so the same losses and weights up to float summation order."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    common = ["--preset", "tiny-test", "--text", str(corpus), "--max-iters", "12"]
    common += ["--eval-interval", "6", "--set", "log_interval=1", "--batch-size", "4"]
    common += ["--grad-accum", "4"]
    one, two = tmp_path / "one", tmp_path / "two"
    proc = train([*common, "--out", str(one)])
    assert proc.returncode == 0, proc.stderr
    proc = torchrun([*common, "--parallel", "fsdp", "--out", str(two)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes, FSDP over 2 blocks + root" in proc.stdout
    a, b = loss_curve(one), loss_curve(two)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
    assert a[12] < a[1]
    wa, wb = _weights(one), _weights(two)
    assert sorted(wa) == sorted(wb)
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    assert (two / "checkpoint" / "shards" / ".metadata").is_file()


@pytest.mark.slow
def test_fsdp_resumes_exactly_and_exports(tmp_path, capsys):
    """Killed after step 25 (checkpoint at 20) and resumed from the shards: every logged loss
    and the final weights equal the uninterrupted run's. The step-20 checkpoint exported to
    the ordinary format holds the gathered weights, and resumed under DDP it continues the
    same trajectory (float tolerance). Ordinary tools read the FSDP run as it is."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    common = ["--preset", "tiny-test", "--text", str(corpus), "--max-iters", "30"]
    common += ["--eval-interval", "10", "--set", "log_interval=1", "--set", "model.dropout=0.2"]
    common += ["--batch-size", "4", "--grad-accum", "4"]
    full, killed, exported = tmp_path / "full", tmp_path / "killed", tmp_path / "exported"
    done = torchrun([*common, "--parallel", "fsdp", "--out", str(full)], timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    dead = torchrun([*common, "--parallel", "fsdp", "--out", str(killed)], killed=True)
    assert dead.returncode != 0
    assert json.loads((killed / "checkpoint" / "config.json").read_text())["step"] == 20

    r = run_cli(capsys, "export-checkpoint", "--checkpoint", killed, "--out", exported)
    assert r.code == 0, r.err
    at_20 = _weights(killed)
    assert all(torch.equal(at_20[k], v) for k, v in _weights(exported).items())

    r = run_cli(capsys, "train", "--resume", killed, "--parallel", "ddp")
    assert r.code == 2 and "export-checkpoint" in r.err and r.err.count("\n") == 1, r.err

    resumed = torchrun(["--resume", str(killed)], timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "from step 20" in resumed.stdout
    assert losses(killed) == losses(full)  # shards, optimizer and every rank's RNG continue
    wf, wk = _weights(full), _weights(killed)
    assert all(torch.equal(wf[k], wk[k]) for k in wf)

    ddp = torchrun(["--resume", str(exported)], timeout=180)
    assert ddp.returncode == 0, ddp.stderr[-4000:]
    a, b = loss_curve(full), loss_curve(exported)
    assert sorted(b) == list(range(21, 31))
    assert all(abs(a[s] - b[s]) < 1e-5 for s in b), [(s, a[s], b[s]) for s in b]

    r = run_cli(capsys, "generate", "--checkpoint", full, "--prompt", "First", "--max-new-tokens",
                "5", "--seed", "1")  # fmt: skip
    assert r.code == 0 and r.out.startswith("First"), r.err
