"""GGUF files loaded into decode-time weight formats (:mod:`attnlm.models.gguf.quantized`):
Q8_0 / Q4_0 / Q4_1 matrices keep the file's values exactly, other types equal "dequantize
then quantize"; the default format is the file's precision class; ``--weights`` on the
commands."""

from __future__ import annotations

import pytest
import torch

from attnlm.cli import main
from attnlm.loading.sources import resolve
from attnlm.models.gguf import load_model
from attnlm.quant.layers import QuantEmbedding, QuantLinear

transformers = pytest.importorskip("transformers")
from gguf_support import write_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _hf_llama(tied: bool):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_weights")
    out = {}
    for name, types, tied in [("q8", ("Q8_0",), True), ("q4", ("Q4_0", "Q4_1"), False),
                              ("mixed", ("Q8_0", "Q4_1", "F16", "Q4_0"), False)]:  # fmt: skip
        write_llama(d / f"{name}.gguf", _hf_llama(tied), types=types)
        out[name] = d / f"{name}.gguf"
    return out


def _quant_modules(model):
    for name, m in model.named_modules(remove_duplicate=False):  # a tied head too
        if isinstance(m, QuantEmbedding):
            yield name + ".weight", m.table
        elif isinstance(m, QuantLinear) and not name.endswith(".table"):
            yield name + ".weight", m


@pytest.mark.parametrize("name,fmt", [("q8", "q8"), ("q4", "q4"), ("mixed", "q4"), ("mixed", "q8")])
def test_direct_load_keeps_the_files_values(files, name, fmt):
    """Every matrix of the file's own type in ``fmt`` holds exactly the float32 loader's
    values (q and k rows moved back from the rotary order as codes); the others equal
    quantizing the float32 loader's matrix; and the logits follow."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.models.gguf.llama import parts

    path = files[name]
    ref = load_model(path)  # float32, every tensor dequantized
    model = load_model(path, fmt)
    header = GGUFFile(path)
    layers = dict(_quant_modules(model))
    ref_params = dict(ref.named_parameters())
    seen = 0
    for part in parts(ref.config, header):
        if part.ours not in layers and part.ours == "tok_emb.weight":
            continue
        targets = [part.ours] if part.ours in layers else []
        if part.ours == "tok_emb.weight" and ref.config.tie_embeddings:
            targets.append("lm_head.weight")
        for target in targets:
            layer = layers[target]
            start, stop = part.rows or (0, layer.out_features)
            got = layer.dequantized()[start:stop]
            float_rows = ref_params[part.ours].detach()[start:stop]
            kind = header.tensors[part.gguf].type_name
            if kind in {"q8": {"Q8_0"}, "q4": {"Q4_0", "Q4_1"}}[layer.fmt]:
                assert torch.equal(got, float_rows), (target, kind)
                seen += 1
            else:
                again = QuantLinear.from_float(float_rows, None, layer.fmt).dequantized()
                assert torch.equal(got, again), (target, kind)
    assert seen > 0
    ids = torch.randint(0, 320, (1, 12))
    with torch.no_grad():
        diff = (model(ids).logits - ref(ids).logits).abs().max().item()
    assert diff < {"q8": 0.05, "q4": 0.5}[fmt]


def test_default_format_is_the_files_precision_class(files):
    from attnlm.base.ggufio import GGUFFile
    from attnlm.models.gguf import precision_class

    assert precision_class(GGUFFile(files["q8"])) == "q8"
    assert precision_class(GGUFFile(files["q4"])) == "q4"
    found = resolve(files["q4"])
    assert found.info.details["weights"] == "q4"
    assert isinstance(found.model.lm_head, QuantLinear)
    assert resolve(files["q8"], weights="f32").info.details["weights"] == "f32"
    bf = resolve(files["q8"], weights="bf16")
    assert bf.model.lm_head.fmt == "bf16"


def test_requantized_types_are_said_on_stderr(files, capsys):
    found = resolve(files["mixed"], weights="q4")
    err = capsys.readouterr().err
    assert "re-quantized" in err and "Q8_0" in err and "F16" in err
    assert "Q4_1" not in found.info.details["weights_note"]


@pytest.mark.parametrize("fmt", ["f32", "bf16", "q8", "q4"])
def test_generate_with_each_format(files, capsys, fmt):
    rc = main(["generate", "--model", str(files["q4"]), "--prompt", "ab", "--max-new-tokens",
               "5", "--weights", fmt, "--device", "cpu"])  # fmt: skip
    assert rc == 0
    assert capsys.readouterr().out.strip()


def test_bad_weights_value_exits_2(files, capsys):
    rc = main(["generate", "--model", str(files["q4"]), "--prompt", "ab", "--weights", "q3"])
    assert rc == 2
    assert "q3" in capsys.readouterr().err


def test_families_without_a_weights_format_are_refused_in_one_line(tmp_path):
    from attnlm.base.errors import InputError
    from attnlm.loading.sources import ModelInfo, Resolved
    from attnlm.loading.weights import apply_weights
    from attnlm.models import registry

    model, _, family = registry.build({"type": "rnn", "vocab_size": 10, "n_embd": 32})
    found = Resolved(model, None, ModelInfo("x", "run", tmp_path, family))
    with pytest.raises(InputError, match="only gpt and llama"):
        apply_weights(found, "q8")
    assert apply_weights(found, None).info.details["weights"] == "f32"


@pytest.mark.slow
def test_smollm2_q4_default_keeps_the_files_values_and_q8_stays_close():
    """The SmolLM2 file (Q4_1 matrices, a Q8_0 embedding and tied head) loads as q4 with every
    value of the float32 load; its logits follow the float32 model's, q8's (Q4_1 re-quantized)
    stay close, and the greedy answer is the same."""
    from attnlm.generate import SamplingConfig
    from attnlm.generate.text import generate_text
    from gguf_support import smollm2_file

    path = smollm2_file(fetch=True)
    f32 = resolve(path, weights="f32")
    q4 = resolve(path)
    assert q4.info.details["weights"] == "q4" and "weights_note" not in q4.info.details
    ref = dict(f32.model.named_parameters())
    for name, layer in _quant_modules(q4.model):
        source = "tok_emb.weight" if name == "lm_head.weight" else name
        assert torch.equal(layer.dequantized(), ref[source].detach()), name
    ids = torch.tensor([q4.tokenizer.encode("The capital of France is Paris, and the")])
    with torch.no_grad():
        base = f32.model(ids).logits
        assert (q4.model(ids).logits - base).abs().max() < 1e-3
        q8 = resolve(path, weights="q8").model
        assert (q8(ids).logits - base).abs().max() < 1.0
    prompt = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    answers = [generate_text(m.model, m.tokenizer, prompt, sampling=greedy)[0] for m in (f32, q4)]
    assert answers[0] == answers[1] and "Paris" in answers[0]


def test_served_and_evaluated_with_a_format(files, tmp_path, capsys):
    from attnlm.web.service import load_service

    service = load_service(model=str(files["q4"]), weights="q8")
    assert service.model.lm_head.fmt == "q8"
    text = tmp_path / "t.txt"
    text.write_text("the bank of the river " * 20, encoding="utf-8")
    outs = {}
    for fmt in ("f32", "q4"):
        rc = main(["eval", "--model", str(files["q4"]), "--text", str(text), "--weights", fmt,
                   "--json", "--device", "cpu"])  # fmt: skip
        assert rc == 0
        import json

        outs[fmt] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the Q4_x embedding is re-quantized to q8 rows: close, not equal
    assert outs["f32"]["loss"] == pytest.approx(outs["q4"]["loss"], abs=1e-2)
