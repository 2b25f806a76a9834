"""Tiny gpt and llama decoders and the weight formats the runtime's tests share
(tests/runtime, tests/native): the models, each format, and the float32 reference that holds a
quantized model's dequantized weights."""

from __future__ import annotations

import copy

import torch

from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.nn.layout import decoding_layout
from attnlm.quant.layers import QuantEmbedding, QuantLinear, quantize_weights

FORMATS = ["f32", "f32 column-major", "bf16", "q8", "q4"]


def gpt(V: int = 50, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, block_size=96, n_layer=2, n_head=4, n_embd=32)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def llama(V: int = 50, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, block_size=96, n_layer=2, n_head=4, n_embd=32, d_ff=48)
    model = Llama(LlamaConfig(**{**cfg, **kw})).eval()
    with torch.no_grad():  # norms away from 1 so a wrong gain shows
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.uniform_(0.5, 1.5)
    return model


def in_format(model, fmt):
    if fmt == "f32 column-major":
        return decoding_layout(model)
    return quantize_weights(model, fmt.split()[0])


def with_reference(model, fmt):
    """``model`` in ``fmt`` and the float32 model holding its dequantized weights (the
    PyTorch path's own bf16 kernel rounds activations too, so it is no reference)."""
    ref = copy.deepcopy(model)
    model = in_format(model, fmt)
    with torch.no_grad():
        for name, module in model.named_modules(remove_duplicate=False):  # a tied head too
            if isinstance(module, QuantLinear) and not name.endswith("tok_emb.table"):
                ref.get_submodule(name).weight = torch.nn.Parameter(module.dequantized())
            elif isinstance(module, QuantEmbedding):
                ref.get_submodule(name).weight = torch.nn.Parameter(module.table.dequantized())
    return model, ref


def hf_llama(tied: bool, vocab: int, width: int, ffn: int, seed: int):
    """A random 2-layer ``transformers`` Llama (4 query / 2 key-value heads), float32, eval."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=ffn, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()
