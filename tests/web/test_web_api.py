"""The explorer's JSON API: status codes, shapes, values against independent computations,
limits, bad requests, concurrency; the ``attnlm serve`` command."""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from web_helpers import ALPHABET, post, request, serving, tiny_checkpoint

from attnlm.cli import main
from attnlm.loading.checkpoint import load_checkpoint
from attnlm.web import server as S
from attnlm.web.service import load_service
from support import SRC

BLOCK = 32  # window of the char model
TEXT = "the bank raised rates"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    char = tiny_checkpoint(base / "char", seed=0, block=BLOCK)
    words = tiny_checkpoint(base / "words", seed=1, n_layer=3, n_head=2, words=True)
    return char, words


@pytest.fixture(scope="module")
def server(runs):
    services = [
        load_service(runs[0], name="char", max_chars=200),
        load_service(runs[1], name="words"),
    ]
    yield from serving(services)


@pytest.fixture(scope="module")
def char_model(runs):
    return load_checkpoint(runs[0]).model.eval()


def char_ids(text: str) -> list[int]:
    """Ids of the char tokenizer, computed independently: code-point order of the alphabet."""
    alphabet = sorted(set(ALPHABET))
    return [alphabet.index(c) for c in text]


# -- models ----------------------------------------------------------------------------------


def test_models_list_and_info(server):
    status, data = request(server.url + "api/models")
    assert status == 200
    assert [m["name"] for m in data["models"]] == ["char", "words"] and data["default"] == "char"
    char = data["models"][0]
    assert char["family"] == "gpt" and char["capabilities"] == ["generate"]
    assert (char["n_layer"], char["n_head"], char["window"]) == (2, 4, BLOCK)
    assert char["vocab_size"] == len(set(ALPHABET)) and char["max_chars"] == 200
    assert request(server.url + "api/models/words")[1]["n_layer"] == 3
    status, err = request(server.url + "api/models/nope")
    assert status == 404 and "nope" in err["error"]


def test_each_model_opens_on_a_sample_that_fits_its_window(server):
    """The page's first screen draws for every model: the sample sentence is trimmed by whole
    words to the char model's 32-token window (and says so); the word model takes it whole."""
    from attnlm.web.service.model import SAMPLE_TEXT

    assert len(SAMPLE_TEXT) > BLOCK  # one token per character: the whole sample cannot fit
    char, words = request(server.url + "api/models")[1]["models"]
    fit = " ".join(SAMPLE_TEXT.split()[: len(char["sample"]["text"].split())])
    assert char["sample"]["text"] == fit and len(fit) <= BLOCK
    assert len(" ".join(SAMPLE_TEXT.split()[: len(fit.split()) + 1])) > BLOCK  # the most that fits
    assert "trimmed" in char["sample"]["note"] and str(BLOCK) in char["sample"]["note"]
    assert post(server, "attention", {"text": fit, "model": "char"})[0] == 200
    assert words["sample"] == {"text": SAMPLE_TEXT, "note": ""}


def test_tokens(server):
    status, data = post(server, "tokens", {"text": TEXT})
    assert status == 200
    assert data["tokens"] == list(TEXT) and data["ids"] == char_ids(TEXT)
    status, data = post(server, "tokens", {"text": "the river bank", "model": "words"})
    assert status == 200 and data["tokens"] == ["the", "river", "bank"]


# -- attention -------------------------------------------------------------------------------


def _layer0_attention(model, ids):
    """Layer-0 attention computed by hand from the weights: LN, Q/K projection, causal softmax."""
    c = model.config
    x = model.tok_emb.weight[ids] + model.pos_emb.weight[: len(ids)]  # (T, C)
    blk = model.blocks[0]
    h = torch.nn.functional.layer_norm(x, (c.n_embd,), blk.ln_1.weight, blk.ln_1.bias, 1e-5)
    qkv = h @ blk.attn.qkv_proj.weight.T + blk.attn.qkv_proj.bias  # (T, 3C)
    q, k = qkv[:, : c.n_embd], qkv[:, c.n_embd : 2 * c.n_embd]
    d = c.n_embd // c.n_head
    out = []
    for head in range(c.n_head):
        qs, ks = q[:, head * d : (head + 1) * d], k[:, head * d : (head + 1) * d]
        scores = qs @ ks.T / math.sqrt(d)
        mask = torch.triu(torch.ones(len(ids), len(ids), dtype=torch.bool), 1)
        out.append(torch.softmax(scores.masked_fill(mask, float("-inf")), -1))
    return torch.stack(out)  # (H, T, T)


def test_attention_shape_rows_and_values(server, char_model):
    status, data = post(server, "attention", {"text": TEXT})
    assert status == 200 and set(data) == {"tokens", "attention"}
    T = len(TEXT)
    att = data["attention"]
    assert data["tokens"] == list(TEXT)
    assert len(att) == 2 and all(len(layer) == 4 for layer in att)
    for layer in att:
        for head in layer:
            assert len(head) == T and all(len(row) == T for row in head)
            for q, row in enumerate(head):
                assert abs(sum(row) - 1.0) < 1e-5
                assert all(w == 0.0 for w in row[q + 1 :])  # causal
                assert all(w >= 0.0 for w in row)
    with torch.no_grad():
        ref = _layer0_attention(char_model, char_ids(TEXT))
    assert torch.allclose(torch.tensor(att[0]), ref, atol=2e-6)


def test_attention_of_the_second_model(server):
    status, data = post(server, "attention", {"text": "the river bank", "model": "words"})
    assert status == 200
    assert len(data["attention"]) == 3 and len(data["attention"][0]) == 2
    assert len(data["attention"][0][0]) == 3


# -- next tokens and generation ----------------------------------------------------------------


def test_next_tokens_match_the_models_softmax(server, char_model):
    V = len(set(ALPHABET))
    status, data = post(server, "next_tokens", {"text": "bank", "k": V})
    assert status == 200 and data["k"] == V and len(data["next"]) == 4
    with torch.no_grad():
        probs = torch.softmax(char_model(torch.tensor([char_ids("bank")])).logits[0], -1)
    alphabet = sorted(set(ALPHABET))
    for pos, cands in enumerate(data["next"]):
        ps = [c["prob"] for c in cands]
        assert ps == sorted(ps, reverse=True) and abs(sum(ps) - 1.0) < 1e-4
        for c in cands:
            assert c["token"] == alphabet[c["id"]]
            assert abs(c["prob"] - float(probs[pos, c["id"]])) < 2e-6
    status, data = post(server, "next_tokens", {"text": "bank"})
    assert status == 200 and data["k"] == 5 and all(len(c) == 5 for c in data["next"])


def test_generate_greedy_matches_argmax_chain(server, char_model):
    body = {"text": "the ", "temperature": 0, "max_new_tokens": 8}
    status, data = post(server, "generate", body)
    assert (
        status == 200 and data["prompt"] == "the " and data["text"] == "the " + data["continuation"]
    )
    alphabet = sorted(set(ALPHABET))
    ids = char_ids("the ")
    with torch.no_grad():
        for _ in range(8):
            ids.append(int(char_model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert data["continuation"] == "".join(alphabet[i] for i in ids[4:])


def test_generate_word_level_continuation_reads_after_the_prompt(server):
    body = {"text": "the river", "temperature": 0, "max_new_tokens": 4, "model": "words"}
    status, data = post(server, "generate", body)
    assert status == 200 and data["continuation"].startswith(" ")
    assert len(data["text"].split()) == 2 + 4


def test_generate_seeded_sampling_is_reproducible(server):
    body = {"text": "the ", "temperature": 1.0, "top_k": 10, "top_p": 0.9, "seed": 3}
    body["max_new_tokens"] = 20
    a, b = post(server, "generate", body), post(server, "generate", body)
    assert a[0] == 200 and a == b and len(a[1]["continuation"]) == 20
    c = post(server, "generate", {**body, "seed": 4})
    assert c[1]["continuation"] != a[1]["continuation"]


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 100000}, "max_new_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"max_new_tokens": True}, "max_new_tokens"),
    ],
)
def test_generate_rejects_bad_sampling(server, extra, needle):
    status, err = post(server, "generate", {"text": "the ", **extra})
    assert status == 400 and needle in err["error"]


# -- embeddings ------------------------------------------------------------------------------


def test_embeddings_cosine_per_layer(server, char_model):
    s1, s2 = "a river bank", "bank rates"
    status, data = post(server, "embeddings", {"word": "bank", "sentences": [s1, s2]})
    assert status == 200 and data["word"] == "bank"
    assert [f["positions"] for f in data["found"]] == [[8, 9, 10, 11], [0, 1, 2, 3]]
    assert data["found"][0]["tokens"] == list("bank")
    with torch.no_grad():
        h1 = char_model(torch.tensor([char_ids(s1)]), return_hidden=True).hidden_states
        h2 = char_model(torch.tensor([char_ids(s2)]), return_hidden=True).hidden_states
    ref = [
        float(torch.nn.functional.cosine_similarity(a[0, 8:12].mean(0), b[0, 0:4].mean(0), dim=0))
        for a, b in zip(h1, h2)
    ]
    assert len(data["cosine"]) == 3  # embeddings + 2 layers
    assert data["cosine"] == pytest.approx(ref, abs=1e-5)


def test_embeddings_on_word_tokens(server):
    body = {"word": "bank", "sentences": ["the river bank", "the central bank raised"]}
    status, data = post(server, "embeddings", {**body, "model": "words"})
    assert status == 200 and [f["tokens"] for f in data["found"]] == [["bank"], ["bank"]]
    assert len(data["cosine"]) == 4


def test_embeddings_static_word2vec_half(server, monkeypatch):
    """With word vectors (``attnlm serve --vectors``) the panel also gets the word's one static
    vector: cosine 1 between any two sentences, and its nearest words as WordVectors ranks
    them; a word the vectors lack says so in the answer rather than failing the request."""
    import numpy as np

    from attnlm.word2vec.vectors import WordVectors

    rng = np.random.default_rng(0)
    words = ["bank", "river", "money", "rates", "the"]
    vectors = WordVectors(words, rng.standard_normal((5, 8)).astype(np.float32))
    monkeypatch.setattr(server.explorer.services["words"], "static_vectors", vectors)
    body = {"word": "bank", "sentences": ["the river bank", "the central bank raised"]}
    status, data = post(server, "embeddings", {**body, "model": "words"})
    assert status == 200 and data["static"]["word"] == "bank"
    assert data["static"]["cosine"] == pytest.approx(1.0)
    expected = vectors.most_similar(["bank"], top=8)
    assert [w for w, _ in data["static"]["neighbours"]] == [w for w, _ in expected]
    assert data["cosine"][0] < 1.0 or len(data["cosine"]) == 4  # the contextual half is there
    body = {"word": "central", "sentences": ["the central bank", "central rates"]}
    status, data = post(server, "embeddings", {**body, "model": "words"})
    assert status == 200 and "no word2vec vector" in data["static"]["error"]


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"word": "cat", "sentences": ["a bank", "the bank"]}, 400, "does not occur"),
        ({"word": "bank", "sentences": ["a bank"]}, 400, "exactly two"),
        ({"word": "", "sentences": ["a bank", "bank"]}, 400, "word"),
        ({"word": "bank", "sentences": "a bank"}, 400, "sentences"),
        ({"word": "bank", "sentences": ["a bank", "b" * 300]}, 413, "limit"),
    ],
)
def test_embeddings_bad_requests(server, body, status, needle):
    got, err = post(server, "embeddings", body)
    assert got == status and needle in err["error"]


# -- capabilities, limits, bad requests ----------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["fill_mask", "translate"])
def test_missing_capabilities(server, endpoint):
    status, err = post(server, endpoint, {"text": "the bank"})
    assert status == 400 and "not supported by this model" in err["error"]


def test_limits(server):
    status, err = post(server, "attention", {"text": "a" * 201})  # over max_chars (200)
    assert status == 413 and "201 characters" in err["error"] and "200" in err["error"]
    status, err = post(server, "attention", {"text": "a" * (BLOCK + 1)})  # over the window
    assert status == 413 and f"window is {BLOCK}" in err["error"]
    assert post(server, "attention", {"text": "a" * BLOCK})[0] == 200
    for endpoint in ("tokens", "next_tokens", "generate"):
        assert post(server, endpoint, {"text": "a" * (BLOCK + 1)})[0] == 413
    status, err = post(server, "next_tokens", {"text": "ab", "k": 51})
    assert status == 400 and "k must be" in err["error"]


def test_attention_size_limit(server, monkeypatch):
    svc = server.explorer.services["char"]
    monkeypatch.setattr(svc, "max_attention_values", 2 * 4 * 10 * 10)  # L x H x 10 x 10
    assert post(server, "attention", {"text": "a" * 10})[0] == 200
    status, err = post(server, "attention", {"text": "a" * 11})
    assert status == 413 and "2 layers x 4 heads x 11 x 11 = 968 weights" in err["error"]


def _raw(server, method, path, body=b"", headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data, r


@pytest.mark.parametrize(
    "method, path, body, status, needle",
    [
        ("POST", "/api/attention", b"{not json", 400, "malformed JSON"),
        ("POST", "/api/attention", b"\xff\xfe", 400, "request body: looks like UTF-16"),
        ("POST", "/api/attention", b"", 400, "malformed JSON"),
        ("POST", "/api/attention", b'["the"]', 400, "JSON object"),
        ("POST", "/api/attention", b'{"text": "a", "layers": 1}', 400, "unknown field(s): layers"),
        ("POST", "/api/attention", b'{"text": 3}', 400, "text must be a string"),
        ("POST", "/api/attention", b'{"model": "char"}', 400, "missing field: text"),
        ("POST", "/api/attention", b'{"text": ""}', 400, "non-empty"),
        ("POST", "/api/attention", b'{"text": "ABC"}', 400, "cannot tokenize"),
        ("POST", "/api/attention", b'{"text": "a", "model": "gpt9"}', 404, "unknown model"),
        ("POST", "/api/nothing", b"{}", 404, "no such API endpoint"),
        ("GET", "/api/attention", b"", 405, "POST"),
        ("POST", "/api/models", b"{}", 405, "GET"),
        ("GET", "/nothing.html", b"", 404, "not found"),
        ("GET", "/static/../service.py", b"", 404, "not found"),
        ("GET", "/static/%2e%2e%2fservice.py", b"", 404, "not found"),
    ],
)
def test_bad_requests_get_one_line_errors(server, method, path, body, status, needle):
    got, data, _ = _raw(server, method, path, body, {"Content-Type": "application/json"})
    err = json.loads(data)["error"]
    assert got == status and needle in err and "\n" not in err and "Traceback" not in err
    assert post(server, "tokens", {"text": "ok"})[0] == 200  # still serving


def test_oversized_body_and_bad_host(server):
    got, data, _ = _raw(server, "POST", "/api/attention", b"x" * (S.MAX_BODY + 1))
    assert got == 413 and "body" in json.loads(data)["error"]
    got, data, _ = _raw(server, "GET", "/api/models", headers={"Host": "evil.example:80"})
    assert got == 403  # DNS rebinding: a page on another name cannot read the API
    assert request(server.url + "api/models")[0] == 200


def test_internal_errors_are_logged_not_sent(server, monkeypatch, caplog):
    svc = server.explorer.services["char"]

    def broken(text):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(svc, "tokens", broken)
    with caplog.at_level(logging.ERROR, logger="attnlm.web"):
        status, err = post(server, "tokens", {"text": "a"})
    assert status == 500 and "secret" not in err["error"] and "server log" in err["error"]
    assert "secret detail" in caplog.text and "Traceback" in caplog.text
    monkeypatch.undo()
    assert post(server, "tokens", {"text": "a"})[0] == 200


# -- page and static files -------------------------------------------------------------------


def test_page_and_static_files_are_offline(server):
    status, page, r = _raw(server, "GET", "/")
    assert status == 200 and b"<title>attnlm attention explorer</title>" in page
    csp = r.getheader("Content-Security-Policy")
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp
    for src in re.findall(rb'(?:src|href)="([^"]+)"', page):
        assert src.startswith(b"/static/")
        assert _raw(server, "GET", src.decode())[0] == 200
    static = Path(S.STATIC_DIR)
    for f in static.iterdir():
        text = f.read_text(encoding="utf-8")
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (f.name, urls)  # an XML name, not fetched
        assert "@import" not in text and "url(" not in text


# -- concurrency -------------------------------------------------------------------------------


def test_100_concurrent_requests(server):
    jobs = []
    for i in range(100):
        text = ["the bank", "rates rose", "a river"][i % 3]
        kind = ["attention", "next_tokens", "tokens", "generate"][i % 4]
        body = {"text": text}
        if kind == "generate":
            body.update(seed=i % 3, max_new_tokens=5)
        jobs.append((kind, body))
    barrier = threading.Barrier(100)

    def call(job):
        barrier.wait()
        return post(server, *job)

    with ThreadPoolExecutor(100) as pool:
        results = list(pool.map(call, jobs))
    assert [s for s, _ in results] == [200] * 100
    first: dict = {}
    for (kind, body), (_, data) in zip(jobs, results):  # same request, same answer
        key = (kind, json.dumps(body, sort_keys=True))
        assert first.setdefault(key, data) == data


# -- command line ------------------------------------------------------------------------------


def test_cli_port_in_use(runs, capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--checkpoint", str(runs[0]), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_cli_errors(capsys, tmp_path):
    assert main(["serve"]) == 2
    assert "nothing to serve" in capsys.readouterr().err
    assert main(["serve", "--model", "gpt2"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'gpt2'" in err and err.count("\n") == 1
    assert main(["serve", "--checkpoint", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "no such file or folder" in err and err.count("\n") == 1


@pytest.mark.slow  # a subprocess that imports torch: about 6 s on 2 cores
def test_cli_serves_and_warns_on_public_host(runs):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "attnlm", "serve", "--checkpoint", str(runs[0])]
    cmd += ["--checkpoint", str(runs[0]), "--host", "0.0.0.0", "--port", "0", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://0\.0\.0\.0:(\d+)/", line)
        assert m, line + proc.stderr.read()
        assert "char, char-2" in line  # the same folder twice: numbered names
        warning = proc.stderr.readline()
        assert "warning" in warning and "no authentication" in warning
        status, data = request(f"http://127.0.0.1:{m.group(1)}/api/models")
        assert status == 200 and [x["name"] for x in data["models"]] == ["char", "char-2"]
    finally:
        proc.terminate()
        proc.wait(10)
