"""The sparse mixture of experts (``attnlm.nn.moe.SparseMoE``) and a Llama built with it:
the routing and the mixture checked by hand (a loop over positions and experts, not the
module's batched gather), the renormalisation switch, the parameters, training's gradients,
the KV cache, and its trace (``mlp.hook_expert_weights`` / ``hook_expert_indices``: captured
bit-identically, and editable)."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import ConfigError
from attnlm.inspect.trace import hook_names, set_, trace
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.nn.moe import SparseMoE

CONFIG = dict(vocab_size=41, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=16,
              d_ff=12, n_expert=5, n_expert_used=2)  # fmt: skip


def _moe(norm: bool) -> SparseMoE:
    torch.manual_seed(0)
    moe = SparseMoE(16, 12, 5, 3, norm_topk=norm)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.4)
    return moe.eval()


@pytest.mark.parametrize("norm", [True, False])
def test_each_position_mixes_its_top_experts_by_hand(norm):
    moe = _moe(norm)
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = moe(x)
        for b in range(2):
            for t in range(7):
                row = x[b, t]
                probs = torch.softmax(row @ moe.router.weight.T, -1)
                order = sorted(range(5), key=lambda e: -float(probs[e]))[:3]
                weights = probs[order] / (probs[order].sum() if norm else 1.0)
                want = torch.zeros(16)
                for w, e in zip(weights, order):
                    expert = moe.experts[e]
                    gate, up = (row @ expert.fc.weight.T).chunk(2)
                    want += w * ((torch.nn.functional.silu(gate) * up) @ expert.proj.weight.T)
                assert torch.allclose(got[b, t], want, atol=1e-5), (b, t)


def test_llama_with_experts_parameters_gradients_and_cache():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**CONFIG))
    names = dict(model.named_parameters())
    assert names["blocks.0.mlp.router.weight"].shape == (5, 16)
    assert names["blocks.1.mlp.experts.4.fc.weight"].shape == (24, 16)
    assert names["blocks.1.mlp.experts.4.proj.weight"].shape == (16, 12)
    from attnlm.models.llama import describe_parts

    assert "5 experts, 2 per token" in describe_parts(model.config)
    ids = torch.randint(0, 41, (3, 10), generator=torch.Generator().manual_seed(2))
    model.train()
    model(ids, targets=ids).loss.backward()
    # every expert a token chose has a gradient; the router always has one
    assert names["blocks.0.mlp.router.weight"].grad is not None
    used = [n for n, p in names.items() if "experts" in n and p.grad is not None]
    assert len(used) >= 4
    model.eval()
    with torch.no_grad():
        full = model(ids).logits
        state = model.new_state()
        steps = [model(ids[:, :4], cache=state).logits]
        steps += [model(ids[:, t : t + 1], cache=state).logits for t in range(4, 10)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_bad_expert_configs_are_refused_naming_the_field():
    for extra, field in (({"n_expert_used": 6}, "n_expert_used"),
                         ({"n_expert_used": None}, "n_expert"),
                         ({"mlp_act": "gelu_tanh"}, "n_expert")):  # fmt: skip
        with pytest.raises(ConfigError, match=field) as e:
            LlamaConfig(**{**CONFIG, **extra})
        assert "\n" not in str(e.value)


def test_a_trace_captures_and_edits_the_routing():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**CONFIG)).eval()
    ids = torch.randint(0, 41, (2, 6), generator=torch.Generator().manual_seed(3))
    names = hook_names(model)
    assert "blocks.1.mlp.hook_expert_weights" in names
    assert not any(n.startswith("blocks.0.mlp.hook_pre") for n in names)
    with torch.inference_mode():
        plain = model(ids).logits
    t = trace(model, ids)
    assert list(t) == names
    assert torch.equal(t.logits, plain)
    weights, chosen = t["blocks.0.mlp.hook_expert_weights"], t["blocks.0.mlp.hook_expert_indices"]
    assert weights.shape == chosen.shape == (2, 6, 2)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 6))  # renormalised
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        rows = t["blocks.0.ln2.hook_normalized"] * model.blocks[0].ln_2.weight
        w, e = mlp.route(rows.reshape(-1, 16))
    assert torch.equal(e.reshape(2, 6, 2), chosen)
    zero = set_("blocks.0.mlp.hook_expert_weights", torch.zeros(2, 6, 2))
    edited = trace(model, ids, interventions=[zero])
    assert torch.equal(edited["blocks.0.hook_mlp_out"], torch.zeros(2, 6, 16))
    assert not torch.equal(edited.logits, plain)


def test_gguf_export_refuses_weights_llama_cpp_would_renormalise(tmp_path):
    """llama.cpp's ``qwen3moe`` graph always renormalises the chosen experts' weights: a
    model that does not (``norm_topk_prob = false``) would run as another model there."""
    import dataclasses
    from pathlib import Path

    from attnlm.base.errors import InputError
    from attnlm.models.gguf import load
    from attnlm.models.gguf.writer import export_gguf

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
    loaded, tok = load(fixtures / "qwen3moe-Q8_0.gguf")
    model = Llama(dataclasses.replace(loaded.config, moe_norm_topk=False))
    with pytest.raises(InputError, match="model.moe_norm_topk = False cannot be exported") as e:
        export_gguf(model, tok, tmp_path / "out.gguf")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out.gguf").exists()
