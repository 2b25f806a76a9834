"""The experiments (``attnlm.inspect.experiments``) against their definitions computed one
intervention at a time, and the commands (``patch``, ``attribute``, ``heads``, ``ablate``,
``trace``) against the library."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.inspect.experiments import (
    ablation,
    attribution,
    head_scores,
    parse_heads,
    patching,
)
from attnlm.inspect.trace import Intervention, patch, trace, zero
from gguf_export_support import tiny_model, tiny_run

CLEAN, CORRUPT = "the quick brown fox", "the lazy brown fox"


def _diff(logits, a, w):
    return float(logits[0, -1, a] - logits[0, -1, w])


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("per_pass", [None, 3], ids=["one-pass", "3-rows-a-pass"])
def test_batched_patching_equals_one_patch_at_a_time(family, per_pass, monkeypatch):
    """Every batched row equals its patch run alone; with 3 rows a pass the passes cut across
    layers (the rows of one layer in two passes)."""
    from attnlm.inspect import experiments

    model, tok = tiny_model(family)
    if per_pass:
        monkeypatch.setattr(experiments, "PATCH_TOKENS", per_pass * len(tok.encode(CLEAN)))
    out = patching(model, tok, CLEAN, CORRUPT, " jumps", " dog")
    a, w = out["answer_token"], out["wrong_token"]
    c_ids, x_ids = torch.tensor([tok.encode(CLEAN)]), torch.tensor([tok.encode(CORRUPT)])
    clean_d = _diff(trace(model, c_ids, names=[]).logits, a, w)
    corrupt_d = _diff(trace(model, x_ids, names=[]).logits, a, w)
    assert out["clean_logit_diff"] == pytest.approx(clean_d, abs=1e-5)
    assert out["corrupt_logit_diff"] == pytest.approx(corrupt_d, abs=1e-5)
    src = trace(model, c_ids)
    T, H = c_ids.shape[1], model.blocks[0].attn.n_head
    assert len(out["resid"]) == len(model.blocks) and len(out["resid"][0]) == T
    for layer in range(len(model.blocks)):
        for pos in range(T):
            name = f"blocks.{layer}.hook_resid_pre"
            one = trace(model, x_ids, names=[], interventions=[patch(name, src, position=pos)])
            want = (_diff(one.logits, a, w) - corrupt_d) / (clean_d - corrupt_d)
            assert out["resid"][layer][pos] == pytest.approx(want, abs=1e-4)
        for h in range(H):
            name = f"blocks.{layer}.attn.hook_z"
            one = trace(model, x_ids, names=[], interventions=[patch(name, src, head=h)])
            want = (_diff(one.logits, a, w) - corrupt_d) / (clean_d - corrupt_d)
            assert out["heads"][layer][h] == pytest.approx(want, abs=1e-4)
    # the texts differ at one position: the first block's input there carries everything
    differs = [i for i, (p, q) in enumerate(zip(c_ids[0], x_ids[0])) if p != q]
    assert out["resid"][0] == [pytest.approx(1.0 if i in differs else 0.0, abs=1e-5)
                               for i in range(T)]  # fmt: skip


def test_patching_refuses_texts_of_different_lengths():
    model, tok = tiny_model("llama")
    n_clean, n_short = len(tok.encode(CLEAN)), len(tok.encode("a fox"))
    with pytest.raises(InputError, match=f"the clean text is {n_clean} tokens, the corrupt one "
                       f"{n_short}"):  # fmt: skip
        patching(model, tok, CLEAN, "a fox", " jumps", " dog")
    with pytest.raises(InputError, match="start with the same token"):
        patching(model, tok, CLEAN, CORRUPT, " jumps", " jumps")


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_attribution_adds_up_to_the_logit_and_each_head_by_hand(family):
    model, tok = tiny_model(family)
    out = attribution(model, tok, CLEAN, " jumps")
    assert out["total"] == pytest.approx(out["logit"], abs=1e-4)
    a = out["answer_token"]
    t = trace(model, torch.tensor([tok.encode(CLEAN)]))
    scale = t["ln_final.hook_scale"][0, -1]
    w_u = model.lm_head.weight[a].detach() * model.ln_f.weight.detach()
    r = t["blocks.1.attn.hook_result"][0, -1, 2]
    if family == "gpt":
        r = r - r.mean()
    assert out["heads"][1][2] == pytest.approx(float((r / scale) @ w_u), abs=1e-4)


@torch.no_grad()
def test_granites_scales_in_the_trace_and_the_attribution():
    """Residual and logit scales (Granite): the trace gives the model's logits, the
    attention's write (``hook_attn_out``) is the scaled output, and the attribution's parts
    still add up to the logit."""
    model, tok = tiny_model("llama")
    for block in model.blocks:
        block.residual_scale = 0.5
    model.logit_scale = 3.0
    ids = torch.tensor([tok.encode(CLEAN)])
    t = trace(model, ids)
    assert torch.equal(t.logits, model(ids).logits)
    mid, pre = t["blocks.0.hook_resid_mid"], t["blocks.0.hook_resid_pre"]
    assert torch.allclose(t["blocks.0.hook_attn_out"], mid - pre, atol=1e-6)
    out = attribution(model, tok, CLEAN, " jumps")
    assert out["total"] == pytest.approx(out["logit"], abs=1e-4)
    model.logit_scale = None  # the scale matters: the logit was a third
    assert float(model(ids).logits[0, -1, out["answer_token"]]) == pytest.approx(
        3 * out["logit"], abs=1e-4
    )


def test_induction_scores_by_hand():
    model, _ = tiny_model("llama")
    out = head_scores(model, "induction", length=6, batch=3, seed=5)
    g = torch.Generator().manual_seed(5)
    first = torch.randint(0, model.config.vocab_size, (3, 6), generator=g)
    ids = torch.cat([first, first], dim=1)
    pattern = trace(model, ids, names=["blocks.1.attn.hook_pattern"])["blocks.1.attn.hook_pattern"]
    head = 3
    want = sum(float(pattern[b, head, q, q - 6 + 1]) for b in range(3) for q in range(6, 12)) / 18
    assert out["scores"][1][head] == pytest.approx(want, abs=1e-6)
    prev = head_scores(model, "previous-token", length=6, batch=3, seed=5)["scores"]
    want = sum(float(pattern[b, head, q, q - 1]) for b in range(3) for q in range(1, 12)) / 33
    assert prev[1][head] == pytest.approx(want, abs=1e-6)


def test_ablation_against_a_trace_and_kl_by_hand():
    model, tok = tiny_model("gpt")
    out = ablation(model, tok, "the quick brown", parse_heads(["1.0", "0.2"], model), top=5)
    ids = torch.tensor([tok.encode("the quick brown")])
    plain = trace(model, ids, names=[]).logits[0, -1].log_softmax(-1)
    ivs = [zero("blocks.1.attn.hook_z", head=0), zero("blocks.0.attn.hook_z", head=2)]
    abl = trace(model, ids, names=[], interventions=ivs).logits[0, -1].log_softmax(-1)
    assert out["kl"] == pytest.approx(float((plain.exp() * (plain - abl)).sum()), abs=1e-5)
    first = out["top"][0]
    assert first["id"] == int(plain.argmax())
    assert first["p_ablated"] == pytest.approx(float(abl[first["id"]].exp()), abs=1e-6)
    mean = ablation(model, tok, "the quick brown", [(1, 0)], mean=True)
    assert mean["ablation"] == "mean" and mean["kl"] != out["kl"]
    for bad, message in (("9.0", "out of range"), ("1", "expected LAYER.HEAD")):
        with pytest.raises(InputError, match=message):
            parse_heads([bad], model)
    assert Intervention("blocks.0.attn.hook_z", "mean", head=1).op == "mean"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return str(tiny_run(tmp_path_factory.mktemp("interp") / "llama", "llama"))


def test_commands_json_equal_the_library(run, cli, tmp_path):
    from attnlm.loading.sources import resolve

    model, tok, _ = resolve(run, "cpu", "f32")
    r = cli("patch", "--model", run, "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " jumps",
            "--wrong", " dog", "--json", "--out", str(tmp_path / "p.png"))  # fmt: skip
    assert r.code == 0, r.err
    assert json.loads(r.out) == json.loads(json.dumps(
        patching(model, tok, CLEAN, CORRUPT, " jumps", " dog")))  # fmt: skip
    assert (tmp_path / "p.png").is_file() and (tmp_path / "p-heads.png").is_file()
    r = cli("attribute", "--model", run, CLEAN, "--answer", " jumps", "--json")
    assert json.loads(r.out)["heads"] == attribution(model, tok, CLEAN, " jumps")["heads"]
    r = cli("heads", "--model", run, "--induction", "--length", "8", "--json", "--out",
            str(tmp_path / "h.png"))  # fmt: skip
    assert json.loads(r.out)["scores"] == head_scores(model, "induction", length=8)["scores"]
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    r = cli("ablate", "--model", run, "the quick brown", "--head", "1.0", "--json")
    assert json.loads(r.out)["kl"] == pytest.approx(
        ablation(model, tok, "the quick brown", [(1, 0)])["kl"])  # fmt: skip
    r = cli("trace", "--model", run, "--names")
    assert "blocks.1.attn.hook_pattern" in r.out.splitlines()
    r = cli("trace", "--model", run, "the quick", "--hook", "blocks.0.attn.hook_z", "--json",
            "--save", str(tmp_path / "a.npz"))  # fmt: skip
    doc = json.loads(r.out)
    assert doc["activations"]["blocks.0.attn.hook_z"]["shape"][2:] == [4, 16]
    import numpy as np

    saved = np.load(tmp_path / "a.npz")
    want = trace(model, "the quick", tokenizer=tok, names=["blocks.0.attn.hook_z"])
    assert np.array_equal(saved["blocks.0.attn.hook_z"], want["blocks.0.attn.hook_z"].numpy())


BAD = [
    (["ablate", "the quick", "--head", "9.9"], "--head 9.9: out of range"),
    (["patch", "--clean", CLEAN, "--corrupt", "a fox", "--answer", " a", "--wrong", " b"],
     "the same length in tokens"),
    (["trace", "the quick", "--hook", "blocks.0.hook_nope"], "unknown hook name"),
    (["trace", "the quick"], "name the activations to capture with --hook"),
    (["heads"], "one of the arguments --induction --previous-token --duplicate-token"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_is_one_line(run, cli, argv, message):
    r = cli(argv[0], "--model", run, *argv[1:])
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
