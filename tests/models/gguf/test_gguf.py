"""GGUF model files -> our models (attnlm.base.ggufio, attnlm.models.gguf), against independent
references: ``gguf``'s own reader and dequantizer, ``transformers`` models (the weights the file
holds loaded into them) and ``transformers``' own GGUF loading; the real SmolLM2 file (slow)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf import load, load_model, read_config, tensor_stats
from attnlm.quant.blocks import SUPPORTED
from gguf_support import (
    ALL_TYPES,
    MERGES,
    Q,
    Writer,
    add_bpe_tokenizer,
    byte_vocab,
    gguf,
    smollm2_file,
    write_gpt2,
    write_llama,
)
from support import SRC

transformers = pytest.importorskip("transformers", reason="transformers is the model reference")

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the header reader ----------------------------------------------------------------------------


def _small_file(path, **extra):
    w = Writer(path, "llama")
    w.w.add_uint32("llama.block_count", 1)
    w.w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.w.add_string("general.name", "tiny ünï")
    w.w.add_array("some.floats", [1.5, -2.0])
    w.w.add_array("some.strings", ["a", "", "日本"])
    w.w.add_bool("some.flag", True)
    for key, value in extra.items():
        w.w.add_uint64(key, value)
    w.tensor("a.weight", np.arange(64, dtype=np.float32).reshape(2, 32), "Q8_0")
    w.tensor("b.weight", np.ones(7, np.float32))
    return w.close()


def test_reader_equals_gguf_reader(tmp_path):
    path = _small_file(tmp_path / "s.gguf")
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.metadata) == keys
    for key in keys:
        value = ours.metadata[key]
        value = value.tolist() if isinstance(value, np.ndarray) else value
        assert value == pytest.approx(ref.fields[key].contents()), key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape))
        assert (info.type, info.offset, info.nbytes) == (
            int(t.tensor_type),
            t.data_offset,
            t.n_bytes,
        )
        assert np.array_equal(ours.raw(info), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_reader_equals_gguf_reader_on_smollm2():
    """Every metadata value (49,152 tokens, 48,900 merges, the chat template) and every
    tensor's shape, type, offset and size, as ``GGUFReader`` reads them."""
    path = smollm2_file(fetch=False)
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            value = ours.metadata[key]
            value = value.tolist() if isinstance(value, np.ndarray) else value
            assert value == pytest.approx(field.contents()), key
    assert [(n, i.shape, i.type, i.offset, i.nbytes) for n, i in ours.tensors.items()] == [
        (t.name, tuple(int(d) for d in reversed(t.shape)), int(t.tensor_type), t.data_offset,
         t.n_bytes)
        for t in ref.tensors
    ]  # fmt: skip
    assert ours.bytes_per_type() == {"Q8_0": (1, 30081024), "F32": (61, 140544),
                                     "Q4_1": (210, 66355200)}  # fmt: skip


def test_truncated_and_corrupt_files_are_one_line_errors(tmp_path):
    path = _small_file(tmp_path / "s.gguf")
    data = path.read_bytes()
    header_end = GGUFFile(path).data_offset
    cases = {
        "short": data[:10],
        "magic": b"GGML" + data[4:],
        "header": data[: header_end // 2],
        "tensor": data[: header_end + 40],
        "version": data[:4] + struct.pack("<I", 7) + data[8:],
    }
    for name, blob in cases.items():
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(blob)
        with pytest.raises(InputError) as e:
            GGUFFile(bad)
        assert "\n" not in str(e.value) and str(bad) in str(e.value), name


def test_absurd_array_length_is_refused_before_allocating(tmp_path):
    path = _small_file(tmp_path / "s.gguf")
    data = bytearray(path.read_bytes())
    key = b"some.strings"
    at = data.index(key) + len(key) + 4 + 4  # value type, item type, then the count
    data[at : at + 8] = struct.pack("<Q", 1 << 60)
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"some\.strings.*1,152,921,504,606,846,976 items"):
        GGUFFile(path)


# -- Llama ----------------------------------------------------------------------------------------


def _hf_llama(tied: bool, vocab=320):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=5000.0, tie_word_embeddings=tied,
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _load_held(model, held):
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in held.items()}, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_llama_every_type_logits_equal_reference(tmp_path, tied):
    """A Llama written with matrices in every supported type (q/k rows permuted as
    llama.cpp's converter does) loads into our Llama with the logits of the Hugging Face model
    holding the same weights."""
    hf = _hf_llama(tied)
    held = write_llama(tmp_path / "l.gguf", hf)
    types = {i.type_name for i in GGUFFile(tmp_path / "l.gguf").tensors.values()}
    assert types == set(ALL_TYPES)
    _load_held(hf, held)
    model = load_model(tmp_path / "l.gguf")
    assert model.config.tie_embeddings is tied and model.config.n_kv_head == 2
    ids = torch.randint(0, 320, (2, 17))
    with torch.no_grad():
        ours, ref = model(ids).logits, hf(ids).logits
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


def test_llama_logits_equal_transformers_gguf_loading(tmp_path):
    """``transformers``' own GGUF loader (its own un-permutation) reads the same file into the
    same logits: an independent check of the row order."""
    pytest.importorskip("accelerate")
    hf = _hf_llama(tied=False)
    write_llama(tmp_path / "l.gguf", hf, types=("F32", "Q8_0", "Q4_K", "Q6_K"))
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="l.gguf", dtype=torch.float32
    ).eval()
    model = load_model(tmp_path / "l.gguf")
    ids = torch.randint(0, 320, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=2e-5, rtol=1e-4)


def test_llama_config_from_metadata(tmp_path):
    write_llama(tmp_path / "l.gguf", _hf_llama(tied=True), types=("F32",))
    table = read_config(tmp_path / "l.gguf")
    assert table == {
        "type": "llama", "vocab_size": 320, "block_size": 64, "n_layer": 2, "n_head": 4,
        "n_kv_head": 2, "n_embd": 256, "d_ff": 512, "rope_theta": 5000.0, "rms_norm_eps": 1e-05,
        "tie_embeddings": True, "bos_id": 0, "eos_id": 0,
    }  # fmt: skip
    stats = tensor_stats(tmp_path / "l.gguf")
    hf_count = sum(p.numel() for p in _hf_llama(tied=True).parameters())
    assert stats["parameters"] == hf_count
    assert stats["by_type"]["F32"]["bytes"] == 4 * hf_count


def _rewrite(tmp_path, edit):
    """A tiny F32 Llama file with ``edit(writer)`` applied before writing."""
    hf = _hf_llama(tied=True)
    path = tmp_path / "e.gguf"
    w = Writer(path, "llama")
    c = hf.config
    kv = {"llama.context_length": 64, "llama.embedding_length": 256, "llama.block_count": 1,
          "llama.feed_forward_length": 512, "llama.attention.head_count": 4,
          "llama.attention.head_count_kv": 2}  # fmt: skip
    for k, v in kv.items():
        w.w.add_uint32(k, v)
    w.w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    add_bpe_tokenizer(w.w, byte_vocab(c.vocab_size - 256), MERGES)
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    w.tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.tensor("output_norm.weight", sd["model.norm.weight"])
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for g, h in names.items():
        w.tensor(f"blk.0.{g}.weight", sd[f"model.layers.0.{h}.weight"])
    edit(w)
    return w.close()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda w: None, None),
        (lambda w: w.w.add_string("llama.rope.scaling.type", "yarn"),
         r"llama\.rope\.scaling\.type 'yarn' is not supported"),
        (lambda w: w.w.add_uint32("llama.expert_count", 8),
         r"the GGUF metadata has no llama\.expert_used_count"),
        (lambda w: (w.w.add_uint32("llama.expert_count", 8),
                    w.w.add_uint32("llama.expert_used_count", 2)),
         r"tensor 'blk\.0\.ffn_gate_inp\.weight' is missing"),
        (lambda w: w.w.add_uint32("llama.rope.dimension_count", 32), r"dimension_count = 32"),
        (lambda w: w.tensor("rope_freqs.weight", np.linspace(1, 3, 32, dtype=np.float32)),
         r"'rope_freqs\.weight' holds rotary frequency factors of no Llama 3\.1 scaling"),
        (lambda w: w.tensor("rope_freqs.weight", np.ones(16, np.float32)),
         r"'rope_freqs\.weight' must be F32 with 32 values"),
        (lambda w: w.tensor("blk.0.attn_q.bias", np.ones(256, np.float32)),
         r"tensor 'blk\.0\.attn_q\.bias' is not part of a llama model"),
        (lambda w: w.tensor("blk.0.extra.weight", np.ones((2, 256), np.float32), "TQ1_0"),
         r"'blk\.0\.extra\.weight' has type TQ1_0, which is not supported"),
    ],
)  # fmt: skip
def test_unsupported_llama_files_are_refused_in_one_line(tmp_path, edit, message):
    path = _rewrite(tmp_path, edit)
    if message is None:
        assert load_model(path).config.n_layer == 1  # the unedited file loads
        return
    with pytest.raises(InputError, match=message) as e:
        load_model(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "arch, message",
    [("qwen2moe", "mixture of experts"), ("falcon", "supported: llama, qwen2, qwen3, gemma2")],
)
def test_unsupported_architecture(tmp_path, arch, message):
    w = Writer(tmp_path / "a.gguf", arch)
    w.tensor("token_embd.weight", np.ones((4, 32), np.float32))
    with pytest.raises(InputError, match=rf"architecture '{arch}' is not supported.*{message}"):
        load_model(w.close())


# -- GPT-2 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("output_copy", [False, True])
def test_gpt2_logits_equal_transformers(tmp_path, output_copy):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    write_gpt2(tmp_path / "g.gguf", hf, output_copy=output_copy)
    model, tok = load(tmp_path / "g.gguf")
    assert type(model).__name__ == "GPT" and model.config.tie_embeddings
    assert tok.vocab_size == 300
    ids = torch.randint(0, 300, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=2e-5, rtol=1e-4)


# -- the real model (slow) ------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_logits_and_greedy_answer_equal_transformers():
    pytest.importorskip("accelerate")
    path = smollm2_file(fetch=True)
    model, tok = load(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(prompt)
    assert ids == hf_tok(prompt, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        # float32 against float32: sums in another order (fused q/k/v, oneDNN matmuls) over 30
        # layers; on this 37-token prompt the largest difference is 1.2e-4 (one logit of 1.8M;
        # 16-token prompts stay under 5e-5), each side as far from its own float64 answer
        torch.testing.assert_close(model(x).logits, ref(x).logits, atol=2e-4, rtol=0)
        out = ref.generate(x, max_new_tokens=20, do_sample=False)[0, len(ids) :].tolist()
        mine, cache = [], model.new_state()
        logits = model.step(x, cache)
        for _ in range(20):
            nxt = int(logits[0, -1].argmax())
            mine.append(nxt)
            if nxt in (tok.eos_id,):
                break
            logits = model.step(torch.tensor([[nxt]]), cache)
    assert mine == out[: len(mine)]
    assert "Paris" in tok.decode(mine)
    with torch.no_grad():  # the mapping itself, without float32 rounding: both in float64
        # agree to 1e-4 (measured 1.2e-5: rotary tables are float32 on one side)
        torch.testing.assert_close(
            model.double()(x).logits, ref.double()(x).logits, atol=1e-4, rtol=0
        )


@pytest.mark.slow
def test_smollm2_load_peak_memory_within_1_2x_the_float32_model():
    path = smollm2_file(fetch=True)
    code = (
        "import resource, sys, torch, attnlm.models.llama\n"
        "from attnlm.models.gguf import load\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"model, tok = load({str(path)!r})\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "size = sum(p.numel() * 4 for p in model.parameters()) / 1024\n"
        "print((after - before) / size)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SRC)}
    )
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) <= 1.2


def test_tensor_stats_json_ready(tmp_path):
    path = _small_file(tmp_path / "s.gguf")
    stats = tensor_stats(path)
    assert json.loads(json.dumps(stats)) == stats
    assert stats["by_type"]["Q8_0"] == {"tensors": 1, "parameters": 64, "bytes": 68}
    assert stats["by_type"]["F32"] == {"tensors": 1, "parameters": 7, "bytes": 28}
    assert set(SUPPORTED) >= {int(Q[t]) for t in ALL_TYPES}
