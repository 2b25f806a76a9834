"""``attnlm export --model RUN --merge --out DIR`` on a LoRA run: a Hugging Face folder that
``transformers`` loads with the adapted model's logits; ``generate``-style loading through
``--model RUN``; without ``--merge`` a one-line refusal."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm.loading import sources
from support import run_cli
from support_lora import TEXT, make_base, make_lora_run

transformers = pytest.importorskip("transformers", reason="transformers loads the export")


def test_export_merged_loads_in_transformers(tmp_path, capsys):
    run, adapted, tok = make_lora_run(tmp_path, make_base(tmp_path))
    refused = run_cli(capsys, "export", "--model", run, "--out", tmp_path / "hf")
    assert refused.code == 2 and "add --merge" in refused.err
    done = run_cli(capsys, "export", "--model", run, "--merge", "--out", tmp_path / "hf")
    assert done.code == 0, done.err
    assert "merged" in done.out
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        assert (hf(ids).logits - adapted(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--lora", "0"], "--lora"),
        (["--lora", "2.5"], "--lora"),
        (["--lora", "4", "--lora-alpha", "-1"], "--lora-alpha"),
        (["--lora", "4", "--lora-dropout", "1"], "--lora-dropout"),
        (["--lora", "4", "--lora-targets", "q,w"], "unknown target 'w'"),
        (["--lora", "4", "--lora-targets", "qkv,v"], "qkv already covers"),
        (["--lora", "4"], "--init-from"),
    ],
)
def test_bad_lora_flags_exit_2(tmp_path, capsys, flags, match):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 20, encoding="utf-8")
    got = run_cli(capsys, "train", "--text", text, "--max-iters", "1", "--out", tmp_path / "r",
                  *flags)  # fmt: skip
    assert got.code == 2 and match in got.err, got.err
    assert len(got.err.strip().splitlines()) <= 2  # usage line + one error line at most
    assert not (tmp_path / "r" / "checkpoint").exists()


def test_generate_and_eval_take_a_lora_run(tmp_path, capsys):
    """``--model RUN`` on generate and eval: the base loaded from its SPEC with the adapters;
    eval's loss is the adapted model's own (computed here by hand from its logits)."""
    run, adapted, tok = make_lora_run(tmp_path, make_base(tmp_path))
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    got = run_cli(capsys, "eval", "--model", run, "--text", text, "--json")
    assert got.code == 0, got.err
    loss = json.loads(got.out)["loss"]
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        logits = adapted(ids[:, :-1]).logits[0]
    want = torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item()
    assert abs(loss - want) < 1e-4
    gen = run_cli(capsys, "generate", "--model", run, "--prompt", "to be", "--max-new-tokens",
                  "5", "--temperature", "0", "--seed", "0")  # fmt: skip
    assert gen.code == 0, gen.err
    assert gen.out.startswith("to be")


def test_train_lora_end_to_end(tmp_path, capsys):
    """``attnlm train --init-from BASE --lora 4``: adapters only in the run folder, the base
    untouched, ``--model RUN`` loads base + adapters, ``--resume`` continues, a changed base
    is refused in one line."""
    from attnlm.lora.layers import lora_state_dict

    base_dir = make_base(tmp_path)
    base_file = base_dir / "checkpoint" / "model.safetensors"
    before = base_file.read_bytes()
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 40, encoding="utf-8")
    run = tmp_path / "run"
    common = ["--text", text, "--block-size", "32", "--batch-size", "2", "--eval-iters", "1",
              "--no-progress", "--lr", "1e-2"]  # fmt: skip
    got = run_cli(capsys, "train", "--init-from", base_dir, "--lora", "4", "--lora-targets",
                  "q,v,down", "--max-iters", "3", "--out", run, *common)  # fmt: skip
    assert got.code == 0, got.err
    assert base_file.read_bytes() == before
    config = json.loads((run / "checkpoint" / "config.json").read_text())
    assert config["lora"]["targets"] == ["q", "v", "down"] and config["lora"]["r"] == 4
    loaded, tok, _ = sources.resolve(run)
    adapters = lora_state_dict(sources.load_lora_run(run, merge=False).model)
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapters.items())
    size = (run / "checkpoint" / "model.safetensors").stat().st_size
    assert size < sum(v.numel() * 4 for v in adapters.values()) + 4096 < len(before) / 5

    more = run_cli(capsys, "train", "--resume", run, "--max-iters", "5", "--no-progress")
    assert more.code == 0, more.err
    assert json.loads((run / "checkpoint" / "config.json").read_text())["step"] == 5
    gen = run_cli(capsys, "generate", "--model", run, "--prompt", "to", "--max-new-tokens", "3")
    assert gen.code == 0, gen.err

    data = bytearray(before)
    data[-7] ^= 0x55
    base_file.write_bytes(bytes(data))
    bad = run_cli(capsys, "generate", "--model", run, "--prompt", "to", "--max-new-tokens", "3")
    assert bad.code == 2 and "not the one these adapters were trained on" in bad.err
