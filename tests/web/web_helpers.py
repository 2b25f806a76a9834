"""Shared by the explorer tests: a tiny random GPT saved with the checkpoint code, a server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

import torch

from attnlm.loading.checkpoint import save_checkpoint
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.tokenizers.char import CharTokenizer
from attnlm.tokenizers.word import WordTokenizer

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,!?'\n"
WORDS = (
    "the central bank raised interest rates again . she sat on the river bank and watched "
    "the water rise , then the bank closed early ."
)


def tiny_checkpoint(
    path: Path,
    seed: int = 0,
    n_layer: int = 2,
    n_head: int = 4,
    block: int = 64,
    words: bool = False,
) -> Path:
    """Save a randomly initialised GPT (characters, or words of :data:`WORDS`) with sharpened
    attention; return its run folder.

    The query/key projections are scaled up so each head attends to few tokens (random
    weights otherwise give nearly uniform attention).
    """
    tok = WordTokenizer.train(WORDS) if words else CharTokenizer.train(ALPHABET)
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=tok.vocab_size, block_size=block, n_layer=n_layer, n_head=n_head, n_embd=32
    )
    model = GPT(cfg)
    with torch.no_grad():
        for block_ in model.blocks:
            w = block_.attn.qkv_proj.weight  # (3C, C): q rows, k rows, v rows
            w[: 2 * cfg.n_embd].mul_(8.0)
    config = {"model_type": "gpt", "step": 0, "model": asdict(cfg), "train": {}}
    save_checkpoint(path / "checkpoint", model, config, tok, {"step": 0})
    return path


def request(url: str, body: object = None, raw: bytes | None = None, method: str | None = None):
    """(status, parsed JSON) of a GET (body None) or POST to ``url``."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text)


def serving(services):
    """A server of ``services`` on a free loopback port, in a thread, for a ``yield``-fixture
    (``yield from serving([...])``); shut down afterwards."""
    from attnlm.web import server as S

    srv = S.make_server(services, "127.0.0.1", 0)
    S.serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def post(server, endpoint: str, body: object):
    """(status, parsed JSON) of ``POST /api/ENDPOINT``."""
    return request(server.url + "api/" + endpoint, body)
