"""attnlm's LoRA against ``peft`` (the reference implementation): tiny Hugging Face Llama and
GPT-2 models, loaded into attnlm, with the same adapter values on both sides, give the same
logits; the targets ``q,v`` / ``all`` / ``qkv`` map onto peft's ``q_proj,v_proj`` /
``all-linear`` / GPT-2's fused ``c_attn``."""

from __future__ import annotations

import pytest
import torch

from attnlm.lora.layers import apply_lora, merge_lora
from attnlm.models import from_hf

transformers = pytest.importorskip("transformers", reason="transformers builds the base models")
peft = pytest.importorskip("peft", reason="peft is the LoRA reference")
transformers.logging.set_verbosity_error()
V = 64


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def hf_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


def hf_gpt2():
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    return transformers.GPT2LMHeadModel(cfg).eval()


# peft module name -> (attnlm layer attribute path inside block i, adapter name, rows)
LLAMA = {
    "self_attn.q_proj": ("attn.qkv_proj", "q"),
    "self_attn.k_proj": ("attn.qkv_proj", "k"),
    "self_attn.v_proj": ("attn.qkv_proj", "v"),
    "self_attn.o_proj": ("attn.out_proj", "o"),
    "mlp.gate_proj": ("mlp.fc", "gate"),
    "mlp.up_proj": ("mlp.fc", "up"),
    "mlp.down_proj": ("mlp.proj", "down"),
}
GPT2 = {
    "attn.c_attn": ("attn.qkv_proj", "qkv"),
    "attn.c_proj": ("attn.out_proj", "o"),
    "mlp.c_fc": ("mlp.fc", "up"),
    "mlp.c_proj": ("mlp.proj", "down"),
}


def copy_adapters(peft_model, ours, table, prefix):
    """Random B (and A) values on the peft side, copied into attnlm's adapters."""
    n = 0
    for name, module in peft_model.named_modules():
        if not hasattr(module, "lora_A") or "default" not in module.lora_A:
            continue
        with torch.no_grad():
            module.lora_B["default"].weight.normal_(0, 0.3)
        layer = int(name.split(f"{prefix}.")[1].split(".")[0])
        tail = name.split(f"{prefix}.{layer}.")[1]
        path, adapter = table[tail]
        target = ours.blocks[layer].get_submodule(path)
        with torch.no_grad():
            target.lora_A[adapter].copy_(module.lora_A["default"].weight)
            target.lora_B[adapter].copy_(module.lora_B["default"].weight)
        n += 1
    return n


@pytest.mark.parametrize(
    "targets, peft_targets, r, alpha",
    [("q,v", ["q_proj", "v_proj"], 4, 8), ("all", "all-linear", 8, 16)],
)
def test_llama_matches_peft(tmp_path, targets, peft_targets, r, alpha):
    hf = hf_llama()
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path).eval()
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=peft_targets, lora_dropout=0.0)
    ref = peft.get_peft_model(hf, cfg).eval()
    apply_lora(ours, r, alpha=alpha, targets=targets)
    n = copy_adapters(ref, ours, LLAMA, "layers")
    assert n == 2 * len(targets.split(",")) if targets != "all" else n == 14
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        want = ref(ids).logits
        got = ours(ids).logits
        assert (want - got).abs().max() < 1e-4
        merge_lora(ours)
        ref.merge_and_unload()
        assert (ours(ids).logits - want).abs().max() < 1e-4


def test_gpt2_fused_c_attn_matches_peft(tmp_path):
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path).eval()
    targets = ["c_attn", "c_proj", "c_fc"]  # c_proj: the attention's and the MLP's
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, fan_in_fan_out=True)
    ref = peft.get_peft_model(hf, cfg).eval()
    apply_lora(ours, 4, alpha=8, targets="qkv,o,up,down")
    assert copy_adapters(ref, ours, GPT2, "h") == 8
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert (ref(ids).logits - ours(ids).logits).abs().max() < 1e-4


def test_loss_gradients_match_peft(tmp_path):
    """One backward: the adapters' gradients are peft's."""
    hf = hf_llama()
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    ref = peft.get_peft_model(hf, cfg)
    apply_lora(ours, 4, alpha=8, targets="q,v")
    copy_adapters(ref, ours, LLAMA, "layers")
    ids = torch.randint(0, V, (2, 40))
    ref(ids, labels=ids).loss.backward()
    ours(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
    a_ref = ref.base_model.model.model.layers[1].self_attn.v_proj.lora_A["default"].weight.grad
    a_ours = ours.blocks[1].attn.qkv_proj.lora_A["v"].grad
    assert torch.allclose(a_ref, a_ours, atol=1e-5, rtol=1e-4)
