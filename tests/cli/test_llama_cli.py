"""The Llama family through the commands: ``attnlm train --preset llama-char``, ``generate``,
``attention`` heatmaps and the explorer's JSON API, with a Hugging Face ``LlamaForCausalLM``
folder plus a byte-level BPE ``tokenizer.json`` converted into a checkpoint."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from attnlm.cli import main
from attnlm.generate import SamplingConfig, decode
from attnlm.inspect.record import inspect
from attnlm.loading.checkpoint import load_checkpoint, save_checkpoint
from attnlm.models import from_hf, registry

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = "the bank of the river"


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A random LlamaForCausalLM (GQA: 4 query heads, 2 key/value heads) and a byte-level
    BPE tokenizer.json, loaded through our loaders and saved as an attnlm checkpoint."""
    from attnlm.tokenizers import load as load_tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    base = tmp_path_factory.mktemp("llama")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(["the bank of the river, the bank of the town"] * 20, trainer)
    tok.save(str(base / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64)  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(base / "hf")
    model = from_hf(base / "hf")
    family = registry.family_of(model)
    config = {"step": 0, "model": registry.config_table(family, model.config), "train": {}}
    tokenizer = load_tokenizer(base / "tokenizer.json")
    save_checkpoint(base / "run" / "checkpoint", model, config, tokenizer, {"step": 0})
    return base / "run", model, tokenizer


def test_generate_and_attention_commands(hf_run, tmp_path, capsys):
    run, model, tok = hf_run
    ck = load_checkpoint(run)
    assert registry.family_of(ck.model).type == "llama" and ck.model.config.n_kv_head == 2
    ids = tok.encode(PROMPT)
    (expected,) = decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=12))
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(run), "--prompt", PROMPT, "--temperature", "0",
                 "--max-new-tokens", "12"]) == 0  # fmt: skip
    assert capsys.readouterr().out.rstrip("\n") == PROMPT + tok.decode(expected)

    grid, one = tmp_path / "grid.png", tmp_path / "one.png"
    assert main(["attention", "--checkpoint", str(run), PROMPT, "--out",
                 str(grid)]) == 0  # fmt: skip
    assert "2 layer(s) x 4 head(s)" in capsys.readouterr().out  # query heads, not kv heads
    assert main(["attention", "--checkpoint", str(run), PROMPT, "--out", str(one),
                 "--layer", "1", "--head", "3"]) == 0  # fmt: skip
    assert grid.read_bytes()[:4] == b"\x89PNG" and one.read_bytes()[:4] == b"\x89PNG"
    rec = inspect(model, tok, PROMPT)
    assert rec.family == "llama" and rec.attentions[0].shape == (4, len(ids), len(ids))
    # heads 0, 1 share key/value head 0 but have their own queries: different maps
    assert not torch.allclose(rec.attentions[0][0], rec.attentions[0][1])


def request(url, body=None):
    """(status, JSON) of a GET or POST to the explorer (its errors are not tested here)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


def test_explorer_serves_the_family(hf_run):
    from attnlm.web import server as S
    from attnlm.web.service import load_service

    run, model, tok = hf_run
    srv = S.make_server([load_service(run, name="llama")], "127.0.0.1", 0)
    S.serve_in_thread(srv)
    try:
        status, data = request(srv.url + "api/models")
        (info,) = data["models"]
        assert info["family"] == "llama" and info["capabilities"] == ["generate"]
        assert (info["n_layer"], info["n_head"]) == (2, 4)
        status, data = request(srv.url + "api/attention", {"text": PROMPT, "model": "llama"})
        assert status == 200
        got = torch.tensor(data["attention"])  # (L, H, T, T)
        want = torch.stack(inspect(model, tok, PROMPT).attentions)
        assert got.shape == want.shape and torch.allclose(got, want, atol=2e-5)
        body = {"text": PROMPT, "temperature": 0, "max_new_tokens": 6, "model": "llama"}
        status, data = request(srv.url + "api/generate", body)
        (expected,) = decode(
            model, [tok.encode(PROMPT)], SamplingConfig(temperature=0, max_new_tokens=6)
        )
        assert status == 200 and data["continuation"] == tok.decode(expected)
    finally:
        srv.shutdown()
        srv.server_close()


def test_train_the_llama_char_preset(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "llama-char", "--text", str(corpus), "--out", str(out),
                 "--max-iters", "3", "--no-progress", "--threads", "1", "--set",
                 "model.n_layer=1", "--set", "model.block_size=32"]) == 0  # fmt: skip
    ck = load_checkpoint(out)
    assert registry.family_of(ck.model).type == "llama"
    assert (ck.model.config.n_head, ck.model.config.n_kv_head) == (4, 2)
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--prompt", "First", "--max-new-tokens",
                 "40", "--temperature", "0"]) == 0  # fmt: skip  # 45 > block 32: slides
    assert capsys.readouterr().out.startswith("First")
