"""Decode-time weight formats (:mod:`attnlm.quant.layers`): every kernel against the
dequantized float32 matrix, the kernel rule, the format read off a model's layers, and whole
models (gpt, llama) against a float32 copy holding the dequantized weights: logits within a
tolerance and the same greedy tokens over 64 steps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from attnlm.base.errors import InputError
from attnlm.models import registry
from attnlm.quant import layers as quant
from attnlm.quant.blocks import pack_int4
from attnlm.quant.layers import (
    GROUP,
    QuantEmbedding,
    QuantLinear,
    quantize_weights,
    unpack_int4,
    weights_format,
)

pytestmark = pytest.mark.usefixtures("one_thread")

#: logits: largest absolute difference from the float32 model holding the dequantized weights
#: (float32 kernels differ only in summation order; bf16 rounds the activations too)
TOLERANCE = {"bf16": 5e-2, "q8": 1e-4, "q4": 1e-4}


@pytest.mark.parametrize("n,k", [(64, 32), (960, 576), (50, 64)])
def test_pack_int4_is_torchs_layout_and_unpacks(n, k):
    torch.manual_seed(0)
    u = torch.randint(0, 16, (n + (-n % 64), k))
    packed = torch.from_numpy(pack_int4(u.numpy()))
    assert torch.equal(unpack_int4(packed), u.to(torch.uint8))
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        pytest.skip("PyTorch packs int4 for its AVX-512 kernel in this layout, for others not")
    torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.int(), 8)
    assert torch.equal(packed, torch_packed)


def test_formats_follow_their_formulas():
    """q8: s = max|w| / 127 and q = round(w / s) per group of 32; q4: Q4_1's rule (min, max)
    as d u + m, checked by hand on one group; the scales stored as float16 (as ggml's blocks
    store them); bf16: rounding to bfloat16."""
    w = torch.linspace(-1.0, 2.1, 2 * GROUP).view(1, 2 * GROUP).repeat(64, 1)
    q8 = QuantLinear.from_float(w, None, "q8")
    s = w[0, :GROUP].abs().max() / 127
    assert q8.scales.dtype == torch.float16 and q8.scales[0, 0] == s.half()
    assert torch.equal(q8.qweight[0, :GROUP], torch.round(w[0, :GROUP] / s).to(torch.int8))
    q4 = QuantLinear.from_float(w, None, "q4")
    lo, hi = w[0, :GROUP].min(), w[0, :GROUP].max()
    d = (hi - lo) / 15
    u = torch.round((w[0, :GROUP] - lo) / d)
    stored = u * d.half().float() + lo.half().float()
    assert torch.allclose(q4.dequantized()[0, :GROUP], stored, atol=1e-6)
    assert (q4.dequantized() - w).abs().max() <= d / 2 + 2e-3  # + the scales' float16 rounding
    with pytest.raises(InputError, match="float16 scales"):
        QuantLinear.from_float(w * 1e7, None, "q8")
    b = QuantLinear.from_float(w, None, "bf16")
    assert torch.equal(b.dequantized(), w.bfloat16().float())


@pytest.mark.parametrize("fmt", ["bf16", "q8", "q4"])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_every_kernel_equals_the_dequantized_product(fmt, rows):
    torch.manual_seed(1)
    w, b = torch.randn(96, 64), torch.randn(96)
    layer = QuantLinear.from_float(w, b, fmt)
    x = torch.randn(rows, 64)
    ref = F.linear(x, layer.dequantized(), b)
    for name in ("dequant", "bf16") if fmt == "bf16" else ("dequant",):
        got = quant.KERNELS[name](layer, x) + b
        atol = 0.1 if name == "bf16" else 1e-4
        torch.testing.assert_close(got, ref, atol=atol, rtol=1e-3, msg=f"{fmt}/{name}")
    got = layer(x.view(1, rows, 64))
    torch.testing.assert_close(got, ref.view(1, rows, 96), atol=0.1, rtol=1e-3)


@pytest.mark.parametrize("fmt", ["bf16", "q8", "q4"])
def test_the_kernel_is_a_rule_of_format_and_device(fmt):
    """No timing: bf16 on the CPU takes its bfloat16 GEMM, everything else dequantizes, for
    one row as for many (the forward calls what :func:`kernel_for` names)."""
    layer = QuantLinear.from_float(torch.randn(64, 64), None, fmt)
    assert quant.kernel_for(layer) == ("bf16" if fmt == "bf16" else "dequant")
    x = torch.randn(3, 64)
    assert torch.equal(layer(x), quant.KERNELS[quant.kernel_for(layer)](layer, x))


def test_the_weights_format_is_read_off_the_layers():
    """Nothing is set on the model: its QuantLinear layers tell (in q4 the head and the
    embedding are q8, the blocks q4)."""
    for fmt in ("bf16", "q8", "q4"):
        model = _tiny("llama", 1)
        assert weights_format(model) == "f32"
        quantize_weights(model, fmt)
        assert weights_format(model) == fmt and "weights_format" not in vars(model)


def test_embedding_rows_equal_the_dequantized_table():
    torch.manual_seed(2)
    table = QuantLinear.from_float(torch.randn(40, 64), None, "q8")
    ids = torch.tensor([[0, 5, 39], [7, 7, 1]])
    assert torch.equal(QuantEmbedding(table)(ids), table.dequantized()[ids])


def _tiny(family: str, seed: int):
    torch.manual_seed(seed)
    table = {"type": family, "vocab_size": 70, "block_size": 96, "n_layer": 2, "n_head": 4,
             "n_embd": 64, "d_ff": 96}  # fmt: skip
    if family == "llama":
        table.update(n_kv_head=2, tie_embeddings=seed % 2 == 0)
    model, _, _ = registry.build(table)
    return model.eval()


def _reference(quantized, float_model):
    """``float_model`` with every quantized weight replaced by its dequantized values."""
    ref = copy.deepcopy(float_model)
    with torch.no_grad():
        for name, module in quantized.named_modules(remove_duplicate=False):
            if isinstance(module, QuantLinear) and not name.endswith("tok_emb.table"):
                ref.get_submodule(name).weight = torch.nn.Parameter(module.dequantized())
            elif isinstance(module, QuantEmbedding):
                ref.get_submodule(name).weight = torch.nn.Parameter(module.table.dequantized())
    return ref


def _greedy(model, prompt, steps):
    state = model.new_state()
    ids, out = prompt, []
    with torch.no_grad():
        for _ in range(steps):
            nxt = model.step(ids, state)[:, -1].argmax(-1, keepdim=True)
            out.append(int(nxt))
            ids = nxt
    return out


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("fmt", ["bf16", "q8", "q4"])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_logits_and_64_greedy_tokens_equal_the_dequantized_reference(family, fmt, seed):
    model = _tiny(family, seed)
    original = copy.deepcopy(model)
    quantize_weights(model, fmt)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert not list(model.tok_emb.parameters(recurse=False))  # no float32 table left
    ref = _reference(model, original)
    ids = torch.randint(0, 70, (2, 24))
    with torch.no_grad():
        diff = (model(ids).logits - ref(ids).logits).abs().max().item()
    assert diff < TOLERANCE[fmt]
    if fmt != "bf16":  # bf16 rounds activations too: the same tokens are not promised
        prompt = torch.randint(0, 70, (1, 8))
        assert _greedy(model, prompt, 64) == _greedy(ref, prompt, 64)
    # and the quantized model stays close to the original float32 one
    with torch.no_grad():
        err = (model(ids).logits - original(ids).logits).abs().max().item()
    assert err < {"bf16": 0.05, "q8": 0.05, "q4": 0.5}[fmt]


def test_f32_is_a_no_op_and_bad_formats_are_one_line_errors():
    model = _tiny("gpt", 0)
    assert quantize_weights(model, "f32") is model
    assert isinstance(model.lm_head, torch.nn.Linear)
    with pytest.raises(InputError, match="q3"):
        quantize_weights(model, "q3")
    quantize_weights(model, "q8")
    with pytest.raises(InputError, match="already q8"):
        quantize_weights(model, "q4")


@pytest.mark.parametrize("fmt", ["bf16", "q8", "q4"])
def test_dequantizing_kernel_in_row_pieces_equals_the_whole_product(fmt, monkeypatch):
    """The dequantizing kernel works a few thousand output rows at a time (an LM head's float32
    copy is never whole): with pieces of 64 rows, the same product as the whole matrix."""
    torch.manual_seed(3)
    layer = QuantLinear.from_float(torch.randn(200, 64), None, fmt)
    x = torch.randn(5, 64)
    whole = F.linear(x, layer.dequantized())
    monkeypatch.setattr(quant, "ROWS_AT_ONCE", 64)
    torch.testing.assert_close(quant._dequant_gemm(layer, x), whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(layer.dequantized(64, 128), layer.dequantized()[64:128])


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_a_tied_head_shares_the_embeddings_codes(fmt):
    """One q8 table serves the token lookup and the LM head (llama.cpp reads one tensor): the
    codes are stored once, and both uses still equal the dequantized reference."""
    model = _tiny("llama", 0)  # seed 0: tied
    original = copy.deepcopy(model)
    quantize_weights(model, fmt)
    assert model.lm_head is model.tok_emb.table and model.lm_head.fmt == "q8"
    ids = torch.randint(0, 70, (2, 12))
    with torch.no_grad():
        diff = (model(ids).logits - _reference(model, original)(ids).logits).abs().max()
    assert diff < TOLERANCE[fmt]
    untied = _tiny("llama", 1)
    quantize_weights(untied, fmt)
    assert untied.lm_head is not untied.tok_emb.table
