"""Every Llama-family GGUF architecture x tensor type against llama.cpp, from the committed
fixtures of ``tests/fixtures/gguf_arch/`` (made by its ``make_fixtures.py``: small models
trained briefly on a fixed text, converted by llama.cpp's ``convert_hf_to_gguf.py`` and
quantized by llama.cpp's quantizer; llama.cpp's logits, greedy ids and tokenization recorded
with llama-cpp-python 0.3.36). No llama.cpp at test time.

Two llama.cpp references per file: its logits on the quantized file itself, and on the
file's float32 twin (every tensor dequantized by llama.cpp's quantizer). attnlm's PyTorch path
dequantizes the file to float32 and computes in float32, like llama.cpp on the twin: equal
within 1e-3 of the logit range. On the quantized file llama.cpp also rounds the activations
to 8-bit blocks before each product (``Q8_0`` / ``Q8_K``), which moves its logits by about
0.5% of their range on these models: :data:`QUANTIZED_TOL`. Greedy ids: equal to the twin's
for 32 steps, and to the quantized file's up to llama.cpp's first near-tie (:data:`TIE`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf import load, read_config
from attnlm.models.gguf.common import YARN_KEYS

HERE = Path(__file__).resolve().parents[2] / "fixtures" / "gguf_arch"
DOC = json.loads((HERE / "llamacpp.json").read_text(encoding="utf-8"))
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_M", "Q2_K", "IQ4_XS", "IQ4_NL",
         "MXFP4_MOE")  # fmt: skip
#: every architecture in every type, and variants (``gemma3-linear``: linear rotary scaling and
#: a final soft-cap) in one type
CASES = [
    (arch, kind) for arch in sorted(DOC["archs"]) for kind in TYPES if kind in DOC["archs"][arch]
]
#: attnlm (float32 arithmetic on the file's numbers) vs llama.cpp on the quantized file, whose
#: products round the activations to 8 bits: relative to the logit range
QUANTIZED_TOL = 1e-2
#: a top-1 / top-2 margin of llama.cpp on the quantized file below this fraction of the logit
#: range is within its activations' rounding: a near-tie
TIE = 5e-3
_LOADED: dict[tuple[str, str], tuple] = {}


def _load(arch: str, kind: str):
    if (arch, kind) not in _LOADED:
        _LOADED.clear()  # one model at a time
        _LOADED[arch, kind] = load(HERE / f"{arch}-{kind}.gguf")
    return _LOADED[arch, kind]


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / (ref.max() - ref.min()))


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_logits_equal_llama_cpp(arch, kind):
    rec = DOC["archs"][arch][kind]
    model, _ = _load(arch, kind)
    with torch.no_grad():
        ours = model(torch.tensor([rec["prompt"]])).logits[0].numpy()
    twin = np.asarray(rec["dequantized"]["logits"], dtype=np.float32)
    same_file = np.asarray(rec["logits"], dtype=np.float32)
    assert ours.shape == twin.shape
    assert _rel(ours, twin) < 1e-3, f"{arch} {kind}: {_rel(ours, twin):.2e} of the range"
    assert _rel(ours, same_file) < QUANTIZED_TOL, f"{arch} {kind}: {_rel(ours, same_file):.2e}"


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_greedy_ids_equal_llama_cpp(arch, kind):
    """32 greedy steps through the KV cache (the prompt in one step, then one token a step:
    the sliding windows of Gemma's local layers are crossed after 8 positions): the same ids
    as llama.cpp on the float32 twin for all 32 steps, and as llama.cpp on the quantized file
    up to its first near-tie (a top-1 / top-2 margin under :data:`TIE` of the logit range),
    where its own 8-bit activations decide (on some files llama.cpp's ids on the quantized
    file and on its twin part there). A mixture of experts is compared with the twin alone:
    a near-tie between two experts' router scores turns the 8-bit activations' rounding into
    another expert, not a nearby logit (the C engine, which rounds as llama.cpp does, follows
    the quantized file: ``tests/runtime/test_engine_llamacpp.py``)."""
    rec = DOC["archs"][arch][kind]
    model, _ = _load(arch, kind)
    state, ids = model.new_state(), []
    with torch.no_grad():
        logits = model.step(torch.tensor([rec["prompt"]]), state)[0, -1]
        for _ in range(DOC["new_tokens"]):
            ids.append(int(logits.argmax()))
            logits = model.step(torch.tensor([[ids[-1]]]), state)[0, -1]
    assert ids == rec["dequantized"]["greedy"]
    if getattr(model.config, "n_expert", None):
        return
    prompt = np.asarray(rec["logits"])
    tie = TIE * (prompt.max() - prompt.min())
    decided = next((i for i, m in enumerate(rec["margins"]) if m < tie), len(ids))
    assert ids[:decided] == rec["greedy"][:decided]
    if decided == len(ids):
        assert ids == rec["greedy"]


@pytest.mark.parametrize("arch", sorted(DOC["archs"]))
def test_tokenizer_encodes_as_llama_cpp(arch):
    _, tok = _load(arch, "Q8_0")
    assert tok.encode(DOC["test_text"]) == DOC["archs"][arch]["Q8_0"]["test_ids"]


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_tensor_types_are_what_gguf_py_read(arch, kind):
    """Our header reader sees the types gguf-py recorded; each file really holds blocks of
    its named type (widths are multiples of 256, so no K-quant falls back to another)."""
    header = GGUFFile(HERE / f"{arch}-{kind}.gguf")
    types = {name: info.type_name for name, info in header.tensors.items()}
    assert types == DOC["archs"][arch][kind]["types"]
    # Q4_K_M: Q4_K blocks (and others); MXFP4_MOE: the experts in MXFP4 (the rest Q8_0)
    assert kind.removesuffix("_M").removesuffix("_MOE") in types.values()


def _f32(values: list[float]) -> list[float]:
    return [float(np.float32(v)) for v in values]


#: LongRoPE's two sets of the phi3-longrope fixture (make_fixtures.py's formulas)
LONGROPE_SHORT = [round(1.0 + 0.2 * (i / 31) ** 2, 4) for i in range(32)]
LONGROPE_LONG = [round(1.0 + 39.0 * (i / 31) ** 3 + 0.5 * (i % 3), 4) for i in range(32)]


#: what the Hugging Face configs of make_fixtures.py imply, written out by hand
EXPECTED = {
    "llama": {"arch": None, "tie_embeddings": True},
    "mistral": {"arch": None, "tie_embeddings": False, "rope_theta": 1e6},
    "qwen2": {"arch": "qwen2", "qkv_bias": True, "tie_embeddings": False, "rope_theta": 1e6},
    "qwen3": {"arch": "qwen3", "qk_norm": True, "d_head": 128, "n_kv_head": 1},
    "phi3": {"arch": "phi3", "tie_embeddings": False},
    "gemma2": {"arch": "gemma2", "sliding_window": 8, "attn_softcap": 20.0,
               "final_softcap": 15.0, "post_norms": True, "mlp_act": "gelu_tanh",
               "embed_scale": 16.0, "layer_types": ["sliding_attention", "full_attention"]},
    "gemma3": {"arch": "gemma3", "sliding_window": 8, "qk_norm": True, "n_head": 2,
               "rope_theta": 1e6, "rope_local_theta": 10000.0, "embed_scale": 16.0,
               "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
    "gemma3-linear": {"arch": "gemma3", "final_softcap": 20.0, "rope_local_theta": 10000.0,
                      "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "qwen3moe": {"arch": "qwen3moe", "qk_norm": True, "d_head": 128, "n_expert": 8,
                 "n_expert_used": 2, "d_ff": 256, "moe_norm_topk": True},
    "mixtral": {"arch": "mixtral", "n_expert": 4, "n_expert_used": 2, "d_ff": 256,
                "moe_norm_topk": True, "tie_embeddings": False, "rope_theta": 1e6},
    "smollm3": {"arch": "smollm3", "nope_layers": [3], "tie_embeddings": True, "n_layer": 4},
    "mistral-nemo": {"arch": None, "d_head": 128, "n_head": 4, "n_embd": 256},
    # the converter's factors (float32) and scale sqrt(1 + ln 32 / ln 8), which is LongRoPE's
    # default: no attention_factor kept
    "phi3-longrope": {"arch": "phi3", "block_size": 256,
                      "rope_scaling": {"rope_type": "longrope",
                                       "short_factor": _f32(LONGROPE_SHORT),
                                       "long_factor": _f32(LONGROPE_LONG),
                                       "original_max_position_embeddings": 8, "factor": 32.0}},
    # Phi-4 mini's shape: 48 of 64 features rotate, 24 factors per set, a tied head
    "phi4-mini": {"arch": "phi3", "rotary_dim": 48, "tie_embeddings": True,
                  "rope_scaling": {"rope_type": "longrope",
                                   "short_factor": _f32(LONGROPE_SHORT[:24]),
                                   "long_factor": _f32(LONGROPE_LONG[:24]),
                                   "original_max_position_embeddings": 8, "factor": 32.0}},
    # OLMo 3: OLMo 2's parts, sliding layers 0-2 of 4 turned by the global base, YaRN global
    "olmo3": {"arch": "olmo3", "pre_norms": False, "qk_norm_all": True, "sliding_window": 4,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
              "rope_theta": 500000.0, "rope_local_theta": 500000.0,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32}},
    # gpt-oss: sinks, q/k/v/o biases, every even layer sliding, 2 of 4 experts with biases, the
    # softmax of the top 2 logits, the clamped SwiGLU; YaRN with the ramp llama.cpp rounds
    "gptoss": {"arch": "gptoss", "qkv_bias": True, "attn_out_bias": True, "attn_sinks": True,
               "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
               "n_expert": 4, "n_expert_used": 2, "moe_bias": True,
               "moe_gating": "topk_softmax", "moe_norm_topk": False, "mlp_act": "swiglu_oai",
               "rope_theta": 150000.0,
               "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 32}},
    "qwen3-yarn": {"arch": "qwen3", "block_size": 128,
                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32}},
    "granite": {"arch": "granite", "embed_scale": 12.0, "attn_scale": 0.015625,
                "residual_scale": 0.22, "logit_scale": 8.0, "tie_embeddings": True},
    "olmo2": {"arch": "olmo2", "pre_norms": False, "post_norms": True, "qk_norm": True,
              "qk_norm_all": True, "tie_embeddings": False, "rope_theta": 500000.0},
    "llama3": {"arch": None, "rope_theta": 10000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
}  # fmt: skip


def test_smollm3s_fourth_layer_has_no_positions_as_in_llama_cpp():
    """The fixture's fourth layer is unrotated in llama.cpp too: rotating it as well moves
    the logits far from llama.cpp's."""
    rec = DOC["archs"]["smollm3"]["Q8_0"]
    model, _ = load(HERE / "smollm3-Q8_0.gguf")
    assert [b.attn.nope for b in model.blocks] == [False, False, False, True]
    twin = np.asarray(rec["dequantized"]["logits"], dtype=np.float32)
    model.blocks[3].attn.nope = False
    with torch.no_grad():
        rotated = model(torch.tensor([rec["prompt"]])).logits[0].numpy()
    assert _rel(rotated, twin) > 1e-2, _rel(rotated, twin)


def test_llama3_factors_are_hugging_faces_scaled_frequencies():
    """The converter's factors (``llama3_factors``, what ``rope_freqs`` holds) divide the plain
    frequencies into Llama 3.1's scaled ones as ``transformers`` computes them
    (``attnlm.nn.positional.llama3_frequencies``, Hugging Face's formula): two formulas, one
    result. The fixture's file holds them."""
    from attnlm.models.gguf.common import ROPE_FREQS, llama3_factors
    from attnlm.nn.positional import llama3_frequencies

    scaling = EXPECTED["llama3"]["rope_scaling"]
    keys = {k: v for k, v in scaling.items() if k != "rope_type"}
    inv = 1.0 / (1e4 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    factors = llama3_factors(1e4, 64, scaling)
    want = llama3_frequencies(inv, **keys)
    assert torch.allclose(inv / torch.from_numpy(factors).double(), want, rtol=1e-6)
    assert sorted({float(f) for f in factors})[0] == 1.0 and factors.max() == 8.0
    assert 1.0 < factors[3] < 8.0  # a pair in the band between
    header = GGUFFile(HERE / "llama3-Q8_0.gguf")
    stored = np.frombuffer(header.raw(ROPE_FREQS), np.float32)
    np.testing.assert_allclose(stored, factors, rtol=1e-6)


@pytest.mark.parametrize(("at", "value"), [(3, 2.5), (0, 0.0), (5, float("nan"))])
def test_factors_of_no_llama3_scaling_are_refused_in_one_line(tmp_path, at, value):
    from attnlm.models.gguf.common import ROPE_FREQS

    raw = bytearray((HERE / "llama3-Q8_0.gguf").read_bytes())
    info = GGUFFile(HERE / "llama3-Q8_0.gguf").tensors[ROPE_FREQS]
    raw[info.offset + 4 * at : info.offset + 4 * at + 4] = np.float32(value).tobytes()
    path = tmp_path / "edited.gguf"
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="rope_freqs.weight' holds rotary frequency factors") as e:
        load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_metadata_decides_the_config(arch):
    table = read_config(HERE / f"{arch}-Q8_0.gguf")
    for key, value in EXPECTED[arch].items():
        got = table.get(key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key


# -- refusals: one line naming the file and the key -------------------------------------------


def _edited(tmp_path, arch, key, vtype, value):
    import hostile_gguf

    g = hostile_gguf.parse((HERE / f"{arch}-Q8_0.gguf").read_bytes())
    path = tmp_path / f"{arch}-edited.gguf"
    path.write_bytes(g.set(key, vtype, value).to_bytes())
    return path


@pytest.mark.parametrize(
    ("arch", "key", "vtype", "value", "message"),
    [
        ("qwen2", "qwen2.expert_count", 4, b"\x08\x00\x00\x00", "qwen2.expert_count is not"),
        # a YaRN beta llama.cpp's qwen3 graph would not read
        ("qwen3-yarn", "qwen3.rope.scaling.yarn_beta_fast", 6, b"\x00\x00\x80\x41",
         "yarn_beta_fast = 16.0: not 32"),
        # OLMo 3's sliding layers turn by the global base in llama.cpp: another is refused
        ("olmo3", "olmo2.rope.freq_base_swa", 6, b"\x00\x40\x1c\x46",
         "freq_base_swa = 10000.0: not the global base"),
        ("gptoss", "gpt-oss.rope.freq_base_swa", 6, b"\x00\x40\x1c\x46",
         "freq_base_swa = 10000.0: not the global base"),
        ("gptoss", "gpt-oss.expert_count", 4, b"\x00\x00\x00\x00", "needs experts"),
        ("gemma2", "gemma2.attention.sliding_window", 4, b"\x00\x00\x00\x00",
         "gemma2.attention.sliding_window must be a positive integer"),
        ("gemma3", "gemma3.rope.scaling.type", 8, "yarn", "'yarn' is not supported"),
        ("phi3", "phi3.rope.dimension_count", 4, b"\x31\x00\x00\x00", "not an even width"),
        ("qwen3", "qwen3.rope.dimension_count", 4, b"\x30\x00\x00\x00", "partial rotary"),
        # LongRoPE's tensors without its original context
        ("phi3-longrope", "phi3.rope.scaling.original_context_length", 8, "eight",
         "original_context_length"),
        ("gemma3", "gemma3.attention.sliding_window_pattern", 8, "6",
         "sliding_window_pattern must be a positive integer"),
        ("qwen3", "general.architecture", 8, "qwen2moe", "mixture of experts"),
        ("qwen3moe", "qwen3moe.expert_used_count", 4, b"\x09\x00\x00\x00",
         "more than the 8 experts"),
        ("mixtral", "llama.expert_weights_scale", 6, b"\x00\x00\x80\x40",
         "llama.expert_weights_scale is not supported"),
    ],
)  # fmt: skip
def test_bad_metadata_is_refused_in_one_line(tmp_path, arch, key, vtype, value, message):
    import hostile_gguf

    if isinstance(value, str):
        value = hostile_gguf.s(value)
    path = _edited(tmp_path, arch, key, vtype, value)
    with pytest.raises(InputError, match=message) as e:
        load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe",
                                  "smollm3", "granite", "olmo2", "gptoss"])  # fmt: skip
def test_every_key_of_the_wrong_type_is_one_line(tmp_path, arch):
    """Each ``<arch>.`` key the adapter reads, set to a string: refused in one line naming the
    file (never a traceback from a comparison or a conversion)."""
    import importlib

    import hostile_gguf

    module = importlib.import_module(f"attnlm.models.gguf.{arch}")
    raw = (HERE / f"{arch}-Q8_0.gguf").read_bytes()
    for key in sorted(module.READ):
        g = hostile_gguf.parse(raw).set(f"{module.ARCH}.{key}", hostile_gguf.STRING,
                                        hostile_gguf.s("x"))  # fmt: skip
        path = tmp_path / f"{key}.gguf"
        path.write_bytes(g.to_bytes())
        try:
            read_config(path)
        except InputError as e:
            assert "\n" not in str(e) and str(path) in str(e), key
        else:  # only keys the architecture reads solely together with another may pass
            # (YaRN's: with rope.scaling.type = yarn; OLMo 3's pattern: with a window)
            alone = ("rope.scaling.factor", "rope.freq_base_swa", *YARN_KEYS)
            assert (
                key in alone
                or key == "attention.sliding_window_pattern"
                and arch in ("olmo2", "gptoss")
            )


@pytest.mark.parametrize("arch", sorted(DOC["archs"]))
def test_blocks_kept_as_codes_give_the_same_logits(arch, kind="Q8_0", weights="q8"):
    """``weights = q8`` on a Q8_0 file (every matrix Q8_0, the embedding and head too): the
    matrices are its codes and scales, not re-quantized (Qwen2's q/k/v biases filled by rows).
    (A Q4_0 file keeps its head in Q6_K, which q4 re-quantizes.)"""
    from attnlm.models.gguf import load_model

    rec = DOC["archs"][arch][kind]
    model = load_model(HERE / f"{arch}-{kind}.gguf", weights=weights)
    with torch.no_grad():
        ours = model(torch.tensor([rec["prompt"]])).logits[0].float().numpy()
    twin = np.asarray(rec["dequantized"]["logits"], dtype=np.float32)
    assert _rel(ours, twin) < 1e-3, f"{arch} {kind} {weights}: {_rel(ours, twin):.2e}"
