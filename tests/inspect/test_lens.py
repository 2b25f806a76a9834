"""The logit lens: on tiny GPT and Llama models the last row equals the model's own output;
every row equals an independent computation from ``transformers``' hidden states read through
its final norm and LM head; a hand check on a one-layer model; the command (table, JSON, PNG)
and its one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.cli import main
from attnlm.inspect.lens import logit_lens, logit_lens_ids
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.models.llama import Llama, LlamaConfig
from attnlm.tokenizers import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "the cat sat on the mat"


def tiny(kind: str, tok: CharTokenizer, layers: int = 3):
    torch.manual_seed(0)
    if kind == "gpt":
        cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=layers, n_head=2,
                        n_embd=16, dropout=0.0)  # fmt: skip
        return GPT(cfg).eval()
    cfg = LlamaConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=layers, n_head=4,
                      n_kv_head=2, n_embd=16)  # fmt: skip
    return Llama(cfg).eval()


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_last_row_is_the_model_output(kind):
    tok = CharTokenizer.train(TEXT)
    model = tiny(kind, tok)
    lens = logit_lens(model, tok, TEXT, k=3)
    ids = tok.encode(TEXT)
    assert lens.top_ids.shape == (4, len(ids), 3) and lens.layers[0] == "embed"
    with torch.no_grad():
        probs = torch.softmax(model(ids=torch.tensor([ids])).logits[0], -1)
    ref_p, ref_i = probs.topk(3, -1)
    torch.testing.assert_close(lens.top_probs[-1], ref_p)
    assert torch.equal(lens.top_ids[-1], ref_i)
    assert lens.top_tokens[-1][0][0] == tok.decode([int(ref_i[0, 0])])
    names, labels, probs = lens.grid()  # what the table and the picture show
    assert names[0] == "layer 3" and names[-1] == "embed"
    for r, layer in enumerate(reversed(range(4))):
        assert labels[r] == [tok.decode([int(i)]) for i in lens.top_ids[layer, :, 0]]
        assert probs[r] == lens.top_probs[layer, :, 0].tolist()


def test_hand_check_one_layer_gpt():
    """Row 0 by hand: ``softmax(W_head · LayerNorm(E[id] + P[pos]))`` with our own layer
    norm formula, no attention involved."""
    tok = CharTokenizer.train("abc")
    model = tiny("gpt", tok, layers=1)
    ids = tok.encode("cab")
    probs, top = logit_lens_ids(model, ids, k=tok.vocab_size)
    with torch.no_grad():
        x = model.tok_emb.weight[ids] + model.pos_emb.weight[: len(ids)]  # (T, C)
        mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        ln = model.ln_f
        normed = (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + (
            ln.bias if ln.bias is not None else 0
        )
        p = torch.softmax(normed @ model.lm_head.weight.T, -1)  # (T, V)
    full = torch.zeros_like(p).scatter(-1, top[0], probs[0])
    torch.testing.assert_close(full, p)
    assert torch.allclose(probs.sum(-1), torch.ones(2, len(ids)))  # k = V: all of it


def test_rows_match_transformers_hidden_states(tmp_path):
    """Every layer against ``transformers``: its hidden states (the last one is already
    normed there, so it is read through the head alone) through its norm and head."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    transformers.logging.set_verbosity_error()
    from attnlm.loading.sources import resolve
    from support_chat import tiny_chat_llama

    folder = tiny_chat_llama(tmp_path / "llama")
    model, tok, _ = resolve(folder)
    ref = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    ids = tok.encode("the capital of France is Paris")
    probs, top = logit_lens_ids(model, ids, k=4)
    with torch.no_grad():
        hs = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states
        rows = [ref.model.norm(h) for h in hs[:-1]] + [hs[-1]]  # HF: the last is normed
        ref_probs = torch.softmax(ref.lm_head(torch.cat(rows)), -1)  # (L + 1, T, V)
    ref_p, ref_i = ref_probs.topk(4, -1)
    torch.testing.assert_close(probs, ref_p, atol=1e-5, rtol=1e-4)
    assert torch.equal(top[:, :, 0], ref_i[:, :, 0])


def test_lens_command(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry

    tok = CharTokenizer.train(TEXT)
    model = tiny("llama", tok, layers=2)
    family = registry.family_of(model)
    config = {"step": 0, "model": registry.config_table(family, model.config), "train": {}}
    save_checkpoint(tmp_path / "run" / "checkpoint", model, config, tok, {"step": 0})
    run = str(tmp_path / "run")
    assert main(["lens", "--model", run, "the cat"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 4 and table[1].startswith("layer 2") and table[3].startswith("embed")
    (tmp_path / "t.txt").write_text("the cat\n")
    out = tmp_path / "lens.png"
    rc = main(["lens", "--model", run, "--text", str(tmp_path / "t.txt"), "--json",
               "--top", "2", "--out", str(out)])  # fmt: skip
    assert rc == 0 and out.stat().st_size > 1000
    doc = json.loads(capsys.readouterr().out)
    ref = logit_lens(model, tok, "the cat", k=2)
    assert doc["tokens"] == list("the cat") and len(doc["layers"]) == 3
    assert [c["id"] for c in doc["layers"][-1]["positions"][-1]] == ref.top_ids[-1, -1].tolist()
    assert main(["lens", "--model", run]) == 2
    assert "give the text" in capsys.readouterr().err
    assert main(["lens", "--model", run, "t" * 40]) == 2
    assert "window is 32" in capsys.readouterr().err


def test_lens_refuses_an_encoder():
    from attnlm.models.bert import Bert, BertConfig

    model = Bert(BertConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8))
    with pytest.raises(InputError, match="final norm and LM head"):
        logit_lens_ids(model, [1, 2, 3])
