"""Hugging Face GPT-2 interop against ``transformers`` itself: random GPT2LMHeadModels from
small configs, saved offline with ``save_pretrained``, load into our GPT with the same logits,
attention weights and hidden states; our export loads back into ``transformers``."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.models import save_hf
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.hf import gpt2 as hf_gpt2

transformers = pytest.importorskip("transformers", reason="transformers is the GPT-2 reference")
transformers.logging.set_verbosity_error()

SHAPES = [
    dict(n_embd=32, n_layer=2, n_head=4),
    dict(n_embd=48, n_layer=3, n_head=3, n_inner=80, activation_function="gelu"),
    dict(n_embd=16, n_layer=1, n_head=2, activation_function="relu", layer_norm_epsilon=1e-6,
         tie_word_embeddings=False),
    dict(n_embd=64, n_layer=2, n_head=8, activation_function="gelu_pytorch_tanh"),
]  # fmt: skip


def make_hf(vocab=71, n_positions=24, eager=True, **shape):
    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_positions=n_positions, bos_token_id=0, eos_token_id=0, **shape
    )
    if eager:
        cfg._attn_implementation = "eager"  # the SDPA default returns no attention weights
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped key would show
        for name, p in model.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.set_num_threads(1)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"L{s['n_layer']}d{s['n_embd']}")
def test_load_hf_and_export_back(tmp_path, shape):
    hf = make_hf(**shape)
    hf.save_pretrained(tmp_path / "hf")
    ours = hf_gpt2.load(tmp_path / "hf")
    assert not ours.training
    assert ours.config.tie_embeddings == shape.get("tie_word_embeddings", True)
    ids = torch.randint(0, 71, (3, 20))
    with torch.no_grad():
        ref = hf(ids, output_attentions=True, output_hidden_states=True)
        out = ours(ids, return_attention=True, return_hidden=True)
        fast = ours(ids)
    assert (ref.logits - out.logits).abs().max() < 1e-4
    assert (ref.logits - fast.logits).abs().max() < 1e-4
    for a, b in zip(ref.attentions, out.attentions, strict=True):
        assert (a - b).abs().max() < 1e-5
    # HF's hidden states: embeddings, blocks 1..L-1, and the last block after ln_f
    for a, b in zip(ref.hidden_states[:-1], out.hidden_states[:-1], strict=True):
        assert (a - b).abs().max() < 1e-4
    assert (ref.hidden_states[-1] - ours.ln_f(out.hidden_states[-1])).abs().max() < 1e-4

    save_hf(ours, tmp_path / "ours")
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert (back(ids).logits - out.logits).abs().max() < 1e-4
    tied = back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()
    assert tied == ours.config.tie_embeddings


def test_loss_matches_hf(tmp_path):
    hf = make_hf(eager=False, **SHAPES[0])
    hf.save_pretrained(tmp_path)
    ours = hf_gpt2.load(tmp_path)
    ids = torch.randint(0, 71, (2, 16))
    with torch.no_grad():
        ref = hf(ids, labels=ids).loss  # HF shifts labels inside
        loss = ours(ids[:, :-1], targets=ids[:, 1:]).loss
    assert abs(ref.item() - loss.item()) < 1e-5


def test_our_random_model_exports(tmp_path):
    cfg = GPTConfig(vocab_size=50, block_size=12, n_layer=2, n_head=2, n_embd=16, d_ff=40)
    ours = GPT(cfg).eval()
    save_hf(ours, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "gpt2" and saved["n_inner"] == 40
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids).logits).abs().max() < 1e-4
    again = hf_gpt2.load(tmp_path)
    for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_pytorch_model_bin_and_bare_keys(tmp_path):
    """Older layout: pickled ``pytorch_model.bin`` (read with weights_only=True), keys without
    the ``transformer.`` prefix, and the causal-mask buffers ``attn.bias`` stored alongside."""
    hf = make_hf(**SHAPES[0])
    hf.config.save_pretrained(tmp_path)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    state.pop("lm_head.weight", None)
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, 24, 24).tril()
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = hf_gpt2.load(tmp_path)
    ids = torch.randint(0, 71, (2, 10))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids).logits).abs().max() < 1e-4


def test_errors(tmp_path):
    with pytest.raises(InputError, match="config.json"):
        hf_gpt2.load(tmp_path)
    hf = make_hf(**SHAPES[0])
    hf.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    with pytest.raises(InputError, match="model.safetensors"):
        hf_gpt2.load(tmp_path)
    (tmp_path / "elsewhere.safetensors").rename(tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_embd": 64}))
    with pytest.raises(InputError, match="shape"):
        hf_gpt2.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(ConfigError, match="gpt2"):
        hf_gpt2.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "scale_attn_weights": False}))
    with pytest.raises(ConfigError, match="scale_attn_weights"):
        hf_gpt2.load(tmp_path)
    rope = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8,
                         positions="rope"))  # fmt: skip
    with pytest.raises(ConfigError, match="model.positions"):
        save_hf(rope, tmp_path / "rope")
