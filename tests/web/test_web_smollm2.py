"""The explorer serving the real SmolLM2-135M-Instruct GGUF file (30 layers x 9 heads, 49,152
tokens): the sample's attention (every layer and head, within the answer limit), a logit-lens
request whose last row is the model's own next-token prediction, a chat turn that names Paris,
and a long text refused in one line. Slow; skipped when the file is not in attnlm's cache."""

from __future__ import annotations

import pytest
from web_helpers import post, request, serving

pytest.importorskip("gguf")
from attnlm.web.service import MAX_ATTENTION_VALUES, load_service  # noqa: E402
from gguf_support import smollm2_file  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    path = smollm2_file(fetch=False)
    yield from serving([load_service(model=str(path), name="smollm2")])


def test_smollm2_attention_lens_and_chat(server):
    info = request(server.url + "api/models/smollm2")[1]
    assert (info["family"], info["n_layer"], info["n_head"]) == ("llama", 30, 9)
    assert info["vocab_size"] == 49152 and info["chat"] is True and info["lens"] is True
    sample = info["sample"]
    assert sample["note"] == "" and sample["text"]  # the whole sample, untrimmed

    status, rec = post(server, "attention", {"text": sample["text"]})
    assert status == 200, rec
    t = len(rec["tokens"])
    assert len(rec["attention"]) == 30 and all(len(layer) == 9 for layer in rec["attention"])
    assert all(len(m) == t and all(len(r) == t for r in m) for layer in rec["attention"]
               for m in layer)  # fmt: skip
    assert 30 * 9 * t * t <= MAX_ATTENTION_VALUES
    row = rec["attention"][29][8][t - 1]
    assert sum(row) == pytest.approx(1.0, abs=1e-4)

    text = "The capital of France is"
    status, lens = post(server, "lens", {"text": text, "k": 3})
    assert status == 200, lens
    assert len(lens["layers"]) == 31 and lens["layers"][0]["layer"] == "embed"
    nxt = post(server, "next_tokens", {"text": text, "k": 3})[1]["next"]
    last = lens["layers"][-1]["positions"]
    assert [[c["id"] for c in p] for p in last] == [[c["id"] for c in p] for p in nxt]
    assert last[-1][0]["token"] == " Paris"

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    status, reply = post(server, "chat", {"messages": msgs, "max_new_tokens": 24})
    assert status == 200, reply
    assert "Paris" in reply["reply"] and reply["finish"] == "end of turn"

    long = "the central bank raised interest rates again and again. " * 30
    status, err = post(server, "attention", {"text": long})
    assert status == 413 and "weights; the limit is" in err["error"]
    status, err = post(server, "lens", {"text": long})
    assert status == 413 and "logits; the limit is" in err["error"]
