"""Parity of ``attnlm.inspect.trace`` and ``attnlm.inspect.experiments`` with TransformerLens 4
(its ``TransformerBridge`` on the same Hugging Face folder, raw numerics; ``support_tl.py``):
every classic hook of a random GPT-2 and a random Llama with grouped-query attention, same
shape and within 1e-5 (float32), the logits too; activation patching (residual stream x
position, heads) and direct logit attribution within 1e-4 of TransformerLens's own
(``run_with_hooks`` one patch at a time; the attribution's formula on its cache); and
(``slow``) every hook of every layer of SmolLM2-135M's Hugging Face export, within 1e-5 plus
1e-5 of the hook's largest magnitude (:data:`SMOL_REL`: 30 layers of float32 sums in other
orders), and the capital-of-France patching within 1e-3."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformer_lens")
pytest.importorskip("transformers")

import support_tl as tl  # noqa: E402
from attnlm.inspect.experiments import answer_id, attribution, patching  # noqa: E402
from attnlm.inspect.trace import hook_names, trace  # noqa: E402
from attnlm.loading.sources import resolve  # noqa: E402

TOL = 1e-5  # activations and logits, absolute, float32
EXPERIMENT_TOL = 1e-4  # patching fractions and attribution terms
#: the seeds give a clean - corrupt logit difference of 0.30 (gpt2) and 0.37 (llama) below
CONFIGS = {
    "gpt2": {"seed": 0, "n_layer": 3},  # 3 layers, width 64, 4 heads, vocabulary 300
    "llama": {"seed": 2},  # 2 layers, hidden 64, 4 heads, 2 key/value heads, intermediate 96
}
#: an indirect-object sentence pair: 29 tokens each under support_tl.bpe_tokenizer
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
ANSWER, WRONG = " Mary", " John"


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """``(kind, attnlm model, its tokenizer, bridge)`` on one random folder."""
    kind = request.param
    folder = tl.random_folder(kind, tmp_path_factory.mktemp(kind) / kind, **CONFIGS[kind])
    model, tok, _ = resolve(str(folder), "cpu", "f32")
    return kind, model, tok, tl.boot(folder)


def compare_hooks(model, bridge, ids) -> tuple[dict[str, float], float]:
    """The worst absolute difference of each hook (``blocks.L.`` folded: the worst over the
    layers) and of the logits; fails on a hook that one side has and the other lacks, or
    on a shape that differs."""
    ours = trace(model, ids)
    theirs = tl.cache(bridge, ids)
    results = tl.cache(bridge, ids, attn_result=True)  # hook_result needs it turned on
    theirs.update({n: a for n, a in results.items() if n.endswith("attn.hook_result")})
    assert set(ours) - {"hook_logits"} == set(theirs)
    assert set(ours) == set(hook_names(model))
    worst: dict[str, float] = {}
    for name, ref in theirs.items():
        got = ours[name].numpy()
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        key = ".".join(name.split(".")[2:]) if name.startswith("blocks.") else name
        worst[key] = max(worst.get(key, 0.0), float(np.abs(got - ref).max()))
    logits = float(np.abs(ours.logits.numpy() - tl.logits(bridge, ids)).max())
    return worst, logits


def test_every_hook_equals_transformer_lens(pair):
    kind, model, _, bridge = pair
    ids = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1)
    )
    worst, logits = compare_hooks(model, bridge, ids)
    expected = 24 if kind == "llama" else 22  # llama: rot_q/k, pre_linear; no pos_embed
    assert len(worst) == expected, sorted(worst)
    assert logits <= TOL
    bad = {name: diff for name, diff in worst.items() if diff > TOL}
    assert not bad, bad


def test_patching_equals_transformer_lens(pair):
    _, model, tok, bridge = pair
    ours = patching(model, tok, CLEAN, CORRUPT, ANSWER, WRONG)
    a, w = answer_id(tok, ANSWER, "answer"), answer_id(tok, WRONG, "wrong")
    theirs = tl.tl_patching(bridge, tok.encode(CLEAN), tok.encode(CORRUPT), a, w)
    # the fraction recovered divides by the span: a small one would magnify float32 rounding
    assert abs(theirs["clean_logit_diff"] - theirs["corrupt_logit_diff"]) > 0.25
    for key in ("clean_logit_diff", "corrupt_logit_diff"):
        assert ours[key] == pytest.approx(theirs[key], abs=EXPERIMENT_TOL)
    L, T, H = len(model.blocks), len(tok.encode(CLEAN)), model.blocks[0].attn.n_head
    for key, shape in (("resid", (L, T)), ("heads", (L, H))):
        got, ref = np.array(ours[key]), np.array(theirs[key])
        assert got.shape == ref.shape == shape
        assert np.abs(got - ref).max() <= EXPERIMENT_TOL, key
    assert np.abs(np.array(ours["heads"])).max() > 0.05  # the heads matter: not a 0 == 0 test


def test_attribution_equals_transformer_lens(pair):
    kind, model, tok, bridge = pair
    ours = attribution(model, tok, CLEAN, ANSWER)
    theirs = tl.tl_attribution(bridge, tok.encode(CLEAN), answer_id(tok, ANSWER, "answer"))
    for key in ("logit", "embed", "attn_bias", "bias", "total"):
        assert ours[key] == pytest.approx(theirs[key], abs=EXPERIMENT_TOL), key
    for key in ("heads", "mlps"):
        assert np.abs(np.array(ours[key]) - np.array(theirs[key])).max() <= EXPERIMENT_TOL, key
    assert ours["total"] == pytest.approx(ours["logit"], abs=EXPERIMENT_TOL)
    if kind == "gpt2":  # LayerNorm's bias and b_O are in play
        assert abs(theirs["bias"]) > 1e-3 and abs(theirs["attn_bias"]) > 1e-3


# -- SmolLM2-135M (slow) ------------------------------------------------------------------------

#: SmolLM2's residual stream reaches ~2e4 (a few massive dimensions) over 30 layers and its MLP
#: activations ~3e3, where float32's spacing is 2e-3 and 2e-4; the two sides sum in other
#: orders (BLAS blocking, fused kernels), so an absolute 1e-5 holds only for the embeddings and
#: the attention pattern (the worst measured: hook_resid_post 5.3e-4, logits 7.3e-5, hook_z
#: 1.5e-5; relative to the hook's largest magnitude at most 2.3e-6). Every hook is held to
#: SMOL_ABS + SMOL_REL x its largest magnitude (the test prints the worst per hook).
SMOL_ABS = 1e-5
SMOL_REL = 1e-5
SMOL_TEXT = "The quick brown fox jumps over the lazy dog because it was"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from attnlm.cli import main
    from gguf_support import smollm2_file

    smollm2_file(fetch=True)
    folder = tmp_path_factory.getbasetemp() / "smollm2-hf"
    if not (folder / "config.json").is_file():
        assert main(["export", "--model", "smollm2-135m-instruct", "--out", str(folder)]) == 0
    model, tok, _ = resolve(str(folder), "cpu", "f32")
    return model, tok, tl.boot(folder)


@pytest.mark.slow
def test_smollm2_every_hook_equals_transformer_lens(smollm2, capsys):
    model, tok, bridge = smollm2
    ids = torch.tensor([tok.encode(SMOL_TEXT)])
    ours = trace(model, ids)
    theirs = tl.cache(bridge, ids)
    results = tl.cache(bridge, ids, attn_result=True)
    theirs.update({n: a for n, a in results.items() if n.endswith("attn.hook_result")})
    assert set(ours) - {"hook_logits"} == set(theirs)
    worst: dict[str, tuple[float, float]] = {}  # hook -> (worst diff, largest |value|)
    for name, ref in theirs.items():
        got = ours[name].numpy()
        assert got.shape == ref.shape, name
        finite = ref > np.finfo(np.float32).min / 2  # masked scores: both the lowest float32
        diff = float(np.abs(got - ref)[finite].max())
        size = float(np.abs(ref[finite]).max())
        key = ".".join(name.split(".")[2:]) if name.startswith("blocks.") else name
        d, s = worst.get(key, (0.0, 0.0))
        worst[key] = (max(d, diff), max(s, size))
    lg = tl.logits(bridge, ids)
    worst["logits"] = (float(np.abs(ours.logits.numpy() - lg).max()), float(np.abs(lg).max()))
    with capsys.disabled():
        print("\nSmolLM2 vs TransformerLens, worst |diff| per hook over 30 layers (max |value|)")
        for key, (d, s) in worst.items():
            print(f"  {key:24s} {d:.2e}  ({s:.3g})")
    bad = {k: (d, s) for k, (d, s) in worst.items() if d > SMOL_ABS + SMOL_REL * s}
    assert not bad, bad


@pytest.mark.slow
def test_smollm2_france_patching_equals_transformer_lens(smollm2, capsys):
    model, tok, bridge = smollm2
    clean, corrupt = "The capital of France is", "The capital of Italy is"
    ours = patching(model, tok, clean, corrupt, " Paris", " Rome")
    a, w = answer_id(tok, " Paris", "answer"), answer_id(tok, " Rome", "wrong")
    theirs = tl.tl_patching(bridge, tok.encode(clean), tok.encode(corrupt), a, w)
    for key in ("clean_logit_diff", "corrupt_logit_diff"):
        assert ours[key] == pytest.approx(theirs[key], abs=1e-3)
    worst = {}
    for key in ("resid", "heads"):
        got, ref = np.array(ours[key]), np.array(theirs[key])
        assert got.shape == ref.shape
        worst[key] = float(np.abs(got - ref).max())
    with capsys.disabled():
        print(
            f"\nSmolLM2 France patching vs TransformerLens: worst |diff| {worst}, logit "
            f"differences {ours['clean_logit_diff']:.4f} / {theirs['clean_logit_diff']:.4f} "
            f"(clean), {ours['corrupt_logit_diff']:.4f} / {theirs['corrupt_logit_diff']:.4f}"
        )
    assert max(worst.values()) <= 1e-3, worst
