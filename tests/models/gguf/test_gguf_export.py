"""GGUF export (``attnlm export --gguf``, :mod:`attnlm.models.gguf.writer`; its quantizers
against ``gguf.quants`` are in ``tests/quant/test_quant_blocks.py``): round trips through our
own GGUF loader against independently dequantized reference models, the metadata llama.cpp
reads, refusals, and llama.cpp's greedy continuation (the committed fixture in every run; live
in a ``slow`` test where ``llama_cpp`` imports)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlm.base.ggufio import GGUFFile
from attnlm.loading.checkpoint import save_checkpoint
from attnlm.loading.sources import resolve
from attnlm.models.gguf.writer import export_gguf
from attnlm.models.registry import build, config_table, family_of
from gguf_export_support import NEW_TOKENS, PROMPT, greedy, tiny_model, tiny_run
from support import run_cli

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gguf"
SCRIPT = FIXTURES / "make_export_fixtures.py"


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


# -- round trips -----------------------------------------------------------------------------------


def _reference(model, kind):
    """A copy of ``model`` whose matrices hold what a ``kind`` file holds, computed with
    ``gguf.quants`` (independent of our quantizers); vectors stay float32."""
    ref, _, _ = build(config_table(family_of(model), model.config))
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for _, p in ref.named_parameters():
            if p.dim() < 2 or kind == "f32":
                continue
            w = p.numpy()
            if kind == "f16" or w.shape[-1] % 32:
                held = w.astype(np.float16).astype(np.float32)
            else:
                raw = gguf.quants.quantize(w, Q[kind.upper()])
                held = gguf.quants.dequantize(raw, Q[kind.upper()]).reshape(w.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(held, dtype=np.float32)))
    return ref.eval()


@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0", "q4_0"])
def test_round_trip_through_our_loader(tmp_path, family, kind):
    model, tok = tiny_model(family)
    path = tmp_path / "m.gguf"
    summary = export_gguf(model, tok, path, kind)
    loaded, tok2, info = resolve(path, weights="f32")
    assert info.kind == "gguf" and family_of(loaded).type == family
    ids = tok.encode(PROMPT)
    assert tok2.encode(PROMPT) == ids
    got = _logits(loaded, ids)
    if kind == "f32":
        assert torch.allclose(got, _logits(model, ids), atol=1e-5, rtol=0)
    else:
        assert not torch.allclose(got, _logits(model, ids), atol=1e-5, rtol=0)
        assert torch.allclose(got, _logits(_reference(model, kind), ids), atol=1e-5, rtol=0)
        assert summary["types"][kind.upper()] > 0


def test_rows_not_multiple_of_32_stay_f16(tmp_path):
    model, tok = tiny_model("llama")
    table = {**config_table(family_of(model), model.config), "n_embd": 40, "n_head": 4,
             "n_kv_head": 2, "d_ff": 64}  # fmt: skip
    small, _, _ = build(table)
    small.eval()
    path = tmp_path / "m.gguf"
    export_gguf(small, tok, path, "q8_0")
    header = GGUFFile(path)
    types = {n: i.type_name for n, i in header.tensors.items()}
    assert types["blk.0.attn_q.weight"] == "F16"  # rows of 40
    assert types["blk.0.ffn_down.weight"] == "Q8_0"  # rows of 64
    assert types["blk.0.attn_norm.weight"] == "F32"
    ids = tok.encode(PROMPT)
    got = _logits(resolve(path, weights="f32").model, ids)
    assert torch.allclose(got, _logits(_reference(small, "q8_0"), ids), atol=1e-5, rtol=0)


def test_metadata_llama_cpp_reads(tmp_path):
    model, tok = tiny_model("llama")
    path = tmp_path / "m.gguf"
    export_gguf(model, tok, path, "f32", chat_template="{{ messages }}")
    h = GGUFFile(path)
    c = model.config
    assert h.get("general.architecture") == "llama"
    expected = {"context_length": c.block_size, "embedding_length": c.n_embd,
                "block_count": c.n_layer, "feed_forward_length": c.d_ff,
                "attention.head_count": c.n_head, "attention.head_count_kv": c.n_kv_head,
                "rope.dimension_count": c.n_embd // c.n_head,
                "vocab_size": c.vocab_size}  # fmt: skip
    for key, value in expected.items():
        assert h.get(f"llama.{key}") == value, key
    assert h.get("llama.rope.freq_base") == pytest.approx(c.rope_theta)
    assert h.get("llama.attention.layer_norm_rms_epsilon") == pytest.approx(c.rms_norm_eps)
    tokens = h.get("tokenizer.ggml.tokens")
    types = list(h.get("tokenizer.ggml.token_type"))
    assert h.get("tokenizer.ggml.model") == "gpt2" and h.get("tokenizer.ggml.pre") == "gpt-2"
    assert len(tokens) == c.vocab_size == tok.vocab_size + 4
    assert types[-4:] == [5] * 4 and types[0] == 1  # padded rows: unused
    eos = tokens.index("<|endoftext|>")
    assert types[eos] == 3 and h.get("tokenizer.ggml.eos_token_id") == eos
    assert tokens[tok.encode(" quick")[0]] == "Ġquick"  # GPT-2's byte alphabet: space is Ġ
    assert len(h.get("tokenizer.ggml.merges")) == len(tok.merges)
    assert h.get("tokenizer.chat_template") == "{{ messages }}"
    assert "output.weight" in h.tensors  # untied Llama


def test_tied_gpt_stores_no_output_and_unbiased_gets_zero_biases(tmp_path):
    model, tok = tiny_model("gpt")
    table = {**config_table(family_of(model), model.config), "tie_embeddings": True,
             "bias": False}  # fmt: skip
    tied, _, _ = build(table)
    tied.eval()
    path = tmp_path / "m.gguf"
    export_gguf(tied, tok, path, "f32")
    h = GGUFFile(path)
    assert "output.weight" not in h.tensors and "blk.0.attn_qkv.bias" in h.tensors
    ids = tok.encode(PROMPT)
    assert torch.allclose(
        _logits(resolve(path, weights="f32").model, ids), _logits(tied, ids), atol=1e-5
    )


# -- the command ---------------------------------------------------------------------------------


def test_cli_run_to_gguf_and_hf_folder(tmp_path, capsys):
    run = tiny_run(tmp_path / "run", "llama")
    out = tmp_path / "out" / "m.gguf"  # a missing folder is created, as other writers do
    r = run_cli(capsys, "export", "--model", str(run), "--gguf", str(out), "--type", "q8_0",
                "--json")  # fmt: skip
    assert r.code == 0, r.err
    summary = json.loads(r.out.strip().splitlines()[-1])
    assert summary["architecture"] == "llama" and summary["types"]["Q8_0"] == 16
    again = run_cli(capsys, "export", "--model", str(run), "--gguf", str(out))
    assert again.code == 2 and "--overwrite" in again.err and len(again.err.splitlines()) == 1
    assert run_cli(capsys, "export", "--model", str(run), "--gguf", str(out),
                   "--overwrite").code == 0  # fmt: skip
    hf = tmp_path / "hf"
    assert run_cli(capsys, "export", "--model", str(run), "--out", str(hf)).code == 0
    assert (hf / "tokenizer.json").is_file() and (hf / "config.json").is_file()
    model, tok = tiny_model("llama")
    loaded = resolve(hf, weights="f32")
    ids = tok.encode(PROMPT)
    assert loaded.tokenizer.encode(PROMPT) == ids
    assert torch.allclose(_logits(loaded.model, ids), _logits(model, ids), atol=1e-5)
    # and the Hugging Face folder exports on to GGUF with its tokenizer
    again = tmp_path / "from-hf.gguf"
    assert run_cli(capsys, "export", "--model", str(hf), "--gguf", str(again)).code == 0
    assert torch.allclose(
        _logits(resolve(again, weights="f32").model, ids), _logits(model, ids), atol=1e-5
    )


def test_cli_gguf_to_hf_folder_writes_the_same_tokenizer_json(tmp_path, capsys):
    """A GGUF file exported on to a Hugging Face folder: its tokenizer (read from the file,
    numpy values: json refused numpy bools) is written with the run's tokens and gives the
    run's ids, as the run's own export does."""
    run = tiny_run(tmp_path / "run", "llama")
    gguf = tmp_path / "m.gguf"
    assert run_cli(capsys, "export", "--model", str(run), "--gguf", str(gguf)).code == 0
    for source, hf in ((run, tmp_path / "hf-run"), (gguf, tmp_path / "hf-gguf")):
        r = run_cli(capsys, "export", "--model", str(source), "--out", str(hf))
        assert r.code == 0, r.err
    from tokenizers import Tokenizer

    docs = {k: json.loads((tmp_path / k / "tokenizer.json").read_text(encoding="utf-8"))
            for k in ("hf-run", "hf-gguf")}  # fmt: skip
    run_vocab, gguf_vocab = docs["hf-run"]["model"]["vocab"], docs["hf-gguf"]["model"]["vocab"]
    # the GGUF file lists a token for every embedding row: the rows past the tokenizer's are
    # unused names, the others the run's own tokens
    assert {t: i for t, i in gguf_vocab.items() if i < len(run_vocab)} == run_vocab
    assert all(t.startswith("<|unused") for t, i in gguf_vocab.items() if i >= len(run_vocab))
    tok = tiny_model("llama")[1]
    texts = [PROMPT, "the  cat sat\n\nand ran", "12345 tokens, once!", "naïve café"]
    for text in texts:
        want = tok.encode(text)
        for k in docs:
            got = Tokenizer.from_file(str(tmp_path / k / "tokenizer.json")).encode(
                text, add_special_tokens=False
            )
            assert got.ids == want, (k, text)
    ids = tok.encode(PROMPT)
    assert resolve(tmp_path / "hf-gguf", weights="f32").tokenizer.encode(PROMPT) == ids


def test_cli_gguf_to_gguf_keeps_the_chat_template(tmp_path, capsys):
    model, tok = tiny_model("gpt")
    src = tmp_path / "src.gguf"
    template = "{% for m in messages %}{{ m['content'] }}<|endoftext|>{% endfor %}"
    export_gguf(model, tok, src, "f32", chat_template=template)
    out = tmp_path / "out.gguf"
    assert run_cli(capsys, "export", "--model", str(src), "--gguf", str(out), "--type",
                   "f16").code == 0  # fmt: skip
    h = GGUFFile(out)
    assert h.get("tokenizer.chat_template") == template
    assert h.get("tokenizer.ggml.tokens") == GGUFFile(src).get("tokenizer.ggml.tokens")


def _char_run(path: Path, table: dict) -> Path:
    from attnlm.tokenizers.char import CharTokenizer

    tok = CharTokenizer("abcdefgh ")
    model, _, family = build({**table, "vocab_size": tok.vocab_size})
    config = {"model_type": family.type, "step": 0, "model": config_table(family, model.config),
              "train": {}}  # fmt: skip
    save_checkpoint(path / "checkpoint", model, config, tok, {"step": 0})
    return path


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"type": "rnn"}, "a rnn model cannot be exported to GGUF"),
        ({"type": "gpt", "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 32},
         "tokenizer kind 'char' cannot be written to GGUF"),
    ],
)  # fmt: skip
def test_cli_refuses_other_families_and_tokenizers(tmp_path, capsys, table, message):
    run = _char_run(tmp_path / "run", table)
    r = run_cli(capsys, "export", "--model", str(run), "--gguf", str(tmp_path / "x.gguf"))
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "x.gguf").exists()


def test_refuses_gpt_settings_llama_cpp_lacks_and_other_patterns(tmp_path):
    from attnlm.base.errors import InputError
    from attnlm.tokenizers.bpe import BPETokenizer

    model, tok = tiny_model("gpt")
    rope, _, _ = build({**config_table(family_of(model), model.config), "positions": "rope"})
    with pytest.raises(InputError, match="model.positions = 'rope'"):
        export_gguf(rope, tok, tmp_path / "x.gguf")
    cl100k = BPETokenizer.train("the quick brown fox " * 10, 280, "cl100k")
    with pytest.raises(InputError, match="pattern cl100k has no llama.cpp pre-tokenizer"):
        export_gguf(model, cl100k, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_cli_bad_arguments(tmp_path, capsys):
    run = tiny_run(tmp_path / "run", "gpt")
    r = run_cli(capsys, "export", "--model", str(run), "--gguf", str(tmp_path / "x.gguf"),
                "--type", "q5_k")  # fmt: skip
    assert r.code == 2 and "invalid choice: 'q5_k'" in r.err
    r = run_cli(capsys, "export", "--model", str(run), "--out", str(tmp_path / "d"), "--type",
                "f16")  # fmt: skip
    assert r.code == 2 and "--type applies to --gguf only" in r.err
    (tmp_path / "file").write_text("x")
    r = run_cli(capsys, "export", "--model", str(run), "--gguf", str(tmp_path / "file" / "x"))
    assert r.code == 2 and "is not a folder" in r.err


# -- llama.cpp -------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_exported_file_continues_as_llama_cpp_did(tmp_path, family):
    """The committed fixture holds llama.cpp's greedy continuation on this very export."""
    fixture = json.loads((FIXTURES / "llamacpp-export.json").read_text(encoding="utf-8"))
    expected = fixture["families"][family]
    model, tok = tiny_model(family)
    path = tmp_path / "m.gguf"
    export_gguf(model, tok, path, "f32")
    loaded, tok2, _ = resolve(path, weights="f32")
    ids = tok2.encode(fixture["prompt"])
    assert ids == expected["prompt_ids"]
    tokens, _ = greedy(loaded, ids, fixture["new_tokens"])
    assert tokens == expected["tokens"]
    logits = _logits(loaded, ids)[-1]
    # llama.cpp's float32 path is not bit-exact with torch: ggml's GELU reads a float16 table
    # (the gpt2 logits differ by up to ~1.5e-3); the llama logits agree to ~1e-5
    tolerance = {"llama": 1e-4, "gpt": 5e-3}[family]
    for i, value in expected["top5"]:
        assert logits[i].item() == pytest.approx(value, abs=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_llama_cpp_live_greedy_equals_ours(tmp_path, family):
    pytest.importorskip("llama_cpp")
    model, tok = tiny_model(family)
    path = tmp_path / "m.gguf"
    export_gguf(model, tok, path, "f32")
    ids = tok.encode(PROMPT)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--probe", str(path), json.dumps(ids), str(NEW_TOKENS)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["tokens"] == greedy(model, ids)[0]
