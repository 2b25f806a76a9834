"""/v1/embeddings on an encoder (a tiny BERT run folder): the vectors in ``float`` and in
``base64`` (little-endian float32, what the ``openai`` client asks for by default and decodes)
equal :func:`attnlm.inspect.embeddings.sentence_embeddings`, and their cosines equal what
``attnlm embed --json`` prints; usage counts the inputs' tokens ([CLS] and [SEP] included);
the generating endpoints refuse an encoder in one line."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import torch

pytest.importorskip("openai")
from api_server_support import client, serving  # noqa: E402

from attnlm.inspect.embeddings import sentence_embeddings  # noqa: E402
from attnlm.loading.checkpoint import save_checkpoint  # noqa: E402
from attnlm.loading.sources import resolve  # noqa: E402
from attnlm.models import registry  # noqa: E402
from attnlm.tokenizers import WordPieceTokenizer  # noqa: E402

WORDS = (
    "the central bank raised interest rates again . she sat on the river bank and "
    "watched the water rise , then the bank closed early ."
)
SENTENCES = ["the bank raised rates", "she sat on the river bank", "the water closed early ."]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    tok = WordPieceTokenizer.train(WORDS, vocab_size=80)
    table = dict(
        type="bert",
        vocab_size=tok.vocab_size,
        block_size=24,
        n_layer=2,
        n_head=2,
        n_embd=16,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model, cfg, family = registry.build(table)
    config = {"step": 0, "model": registry.config_table(family, cfg), "train": {}}
    save_checkpoint(path / "checkpoint", model, config, tok, {"step": 0})
    return path


def test_embeddings_float_and_base64_equal_attnlm_embed(encoder, cli):
    model, tok, _ = resolve(str(encoder), "cpu")
    ref = sentence_embeddings(model, tok, SENTENCES, 24).numpy()
    out = cli("embed", "--model", encoder, *SENTENCES, "--json")
    assert out.code == 0, out.err
    cosine = np.array(json.loads(out.out)["cosine"])
    with serving(encoder) as (served, url):
        c = client(url)
        floats = c.embeddings.create(model=served.id, input=SENTENCES, encoding_format="float")
        default = c.embeddings.create(model=served.id, input=SENTENCES)  # base64 on the wire
        raw = httpx.post(
            url + "/v1/embeddings", json={"input": SENTENCES[0], "encoding_format": "base64"}
        ).json()
        for path, body in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            ("/v1/completions", {"prompt": "x"}),
        ]:
            r = httpx.post(url + path, json=body)
            assert r.status_code == 400 and "does not generate" in r.json()["error"]["message"]
        tokens = httpx.post(url + "/tokenize", json={"content": SENTENCES[0]}).json()
    got = np.array([d.embedding for d in floats.data], dtype=np.float32)
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.object == "list"
    np.testing.assert_allclose(got, ref, atol=1e-6)
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), ref, atol=1e-6)
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vec, got[0])
    np.testing.assert_allclose(got @ got.T, cosine, atol=1e-5)
    enc = tok.encode_batch_for_model(SENTENCES, None, 24)
    assert floats.usage.prompt_tokens == sum(map(sum, enc["attention_mask"]))
    assert floats.usage.total_tokens == floats.usage.prompt_tokens
    assert tokens["tokens"] == tok.encode(SENTENCES[0])


def test_embedding_inputs_are_checked(encoder):
    with serving(encoder) as (served, url):
        for body, param in [
            ({"input": []}, "input"),
            ({"input": [1, 2]}, "input"),
            ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
            ({"input": "x", "dimensions": 4}, "dimensions"),
        ]:
            r = httpx.post(url + "/v1/embeddings", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param
