"""Packed conversations (``attnlm.train.chat_data.pack``, ``segments`` in the decoder): several
conversations per training row, each with exactly the loss it has alone (the reference: each
run by itself, unpacked), the block-causal mask and per-segment positions checked by hand,
and the LM head of an adapted model run on the counted rows only (checked against the
cross-entropy of the full logits)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from attnlm.models import registry
from attnlm.models.base import IGNORE_INDEX
from attnlm.nn.masks import segment_mask, segment_positions
from attnlm.train.chat_data import ChatExamples, pack

pytestmark = pytest.mark.usefixtures("one_thread")
V = 40


def head_rows(monkeypatch) -> list[int]:
    """A list that gets the number of rows each call of the chunked head loss takes."""
    from attnlm.nn import fused

    rows: list[int] = []
    real = fused.chunked_head_loss

    def spy(h, weight, targets, *args):
        rows.append(h.shape[0])
        return real(h, weight, targets, *args)

    monkeypatch.setattr(fused, "chunked_head_loss", spy)
    return rows


def test_segment_mask_and_positions_by_hand():
    seg = torch.tensor([[1, 1, 2, 2, 2, 3]])
    allowed = segment_mask(seg)[0, 0] == 0
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, want)
    assert segment_positions(seg).tolist() == [[0, 1, 0, 1, 2, 0]]


def test_pack_puts_every_example_once_within_the_room():
    rng = random.Random(3)
    lengths = [rng.randint(1, 40) for _ in range(300)] + [64, 64]
    rows = pack(lengths, 64)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
    # first fit fills rows: fewer than one row per 1.2 rows of perfect packing
    assert len(rows) < 1.2 * sum(lengths) / 64 + 2


def _examples(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 14, (1,), generator=g))
        ids = torch.randint(V, (length,), generator=g).tolist()
        cut = int(torch.randint(1, length - 1, (1,), generator=g))
        out.append((ids, [False] * cut + [True] * (length - cut)))  # an answer after a prompt
    return out


@pytest.mark.parametrize("family", ["llama", "gpt"])  # rotary; learned absolute positions
def test_a_packed_row_gives_each_conversation_its_own_loss(family):
    torch.manual_seed(0)
    table = dict(type=family, vocab_size=V, block_size=64, n_layer=2, n_head=2, n_embd=32)
    model, _, _ = registry.build(table)
    model.eval()
    examples = _examples(12)
    packed = ChatExamples(examples, 48, packed=True)
    assert any(len(row) > 1 for row in packed.rows)
    alone = ChatExamples(examples, 48)
    with torch.no_grad():
        want = sum(float(model(**b).loss_sum) for b in alone.sequential(1))
        batches = list(packed.sequential(4))
        assert all("segments" in b for b in batches)
        got = sum(float(model(**b).loss_sum) for b in batches)
        counted = sum(int(model(**b).n_targets) for b in batches)
    assert counted == sum(sum(m[1:]) for _, m in examples)
    assert got == pytest.approx(want, rel=1e-5)
    # without the segments the conversations see each other: the loss differs
    with torch.no_grad():
        crossed = sum(float(model(ids=b["ids"], targets=b["targets"]).loss_sum) for b in batches)
    assert abs(crossed - want) > 1e-3


def test_the_head_of_an_adapted_model_runs_on_counted_rows_only(monkeypatch):
    from attnlm.lora.layers import LoRAConfig, apply_lora

    torch.manual_seed(0)
    table = dict(type="llama", vocab_size=V, block_size=64, n_layer=2, n_head=2, n_embd=32)
    model, _, _ = registry.build(table)
    apply_lora(model, LoRAConfig(4))  # the head frozen: the chunked loss
    batch = next(ChatExamples(_examples(6), 48, packed=True).sequential(3))
    rows = head_rows(monkeypatch)
    out = model(**batch)
    counted = int((batch["targets"] != IGNORE_INDEX).sum())
    assert rows == [counted] and counted < batch["targets"].numel() and out.logits is None
    with torch.no_grad():
        full = model.lm_head(model.ln_f(_hidden(model, batch)))
    want = F.cross_entropy(full.reshape(-1, V), batch["targets"].reshape(-1), reduction="sum")
    assert float(out.loss_sum.detach()) == pytest.approx(float(want), rel=1e-5)
    out.loss_sum.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in model.named_parameters() if "lora" in n)  # fmt: skip


def _hidden(model, batch):
    """The final hidden states of ``batch`` by the model's own return_hidden path."""
    out = model(ids=batch["ids"], segments=batch["segments"], return_hidden=True)
    return out.hidden_states[-1]


def test_a_chat_runs_validation_is_every_held_out_conversation_once(tmp_path, capsys):
    """A split of a few conversations is evaluated whole, not drawn from at random: the
    step-0 validation loss is the mean over the held-out conversations' assistant tokens,
    each run alone through the starting model."""
    pytest.importorskip("transformers")
    import json

    from attnlm.data.chat import encode_conversation, read_conversations
    from attnlm.loading.sources import resolve
    from attnlm.train.chat_data import end_tokens
    from support import FIXTURES, run_cli
    from support_chat import tiny_chat_llama

    model_dir = tiny_chat_llama(tmp_path / "model")
    data = FIXTURES / "chat" / "ahoy.jsonl"
    run = tmp_path / "run"
    got = run_cli(capsys, "train", "--init-from", model_dir, "--chat-data", data, "--lora",
                  "2", "--max-iters", "1", "--eval-iters", "50", "--block-size", "64",
                  "--set", "train.val_fraction=0.3", "--out", run, "--no-progress")  # fmt: skip
    assert got.code == 0, got.err
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    model, tok, info = resolve(model_dir)
    ends = end_tokens(tok, info.chat_template)
    conversations = read_conversations(data)
    held = conversations[-max(1, int(len(conversations) * 0.3)) :]
    total, count = 0.0, 0
    with torch.no_grad():
        for conv in held:
            ids, mask = encode_conversation(tok, info.chat_template, conv.messages, ends)
            ids, mask = ids[:65], mask[:65]  # cut to the window, as the run does
            x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
            y = torch.where(torch.tensor([mask[1:]]), y, IGNORE_INDEX)
            out = model(ids=x, targets=y)
            total, count = total + float(out.loss_sum), count + int(out.n_targets)
    assert first["step"] == 0 and first["val_loss"] == pytest.approx(total / count, rel=1e-5)


def test_a_trainable_head_also_runs_on_counted_rows_with_the_same_gradients(monkeypatch):
    """Full fine-tuning (the tied head trains): with positions left out, the loss runs the
    head on the counted rows only, and every gradient equals the full logits' cross-entropy
    (the model's own return_hidden path, which computes all logits)."""
    torch.manual_seed(0)
    table = dict(type="llama", vocab_size=V, block_size=64, n_layer=2, n_head=2, n_embd=32,
                 tie_embeddings=True)  # fmt: skip
    model, _, _ = registry.build(table)
    batch = next(ChatExamples(_examples(6), 48, packed=True).sequential(3))
    rows = head_rows(monkeypatch)
    out = model(**batch)
    out.loss_sum.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    counted = int((batch["targets"] != IGNORE_INDEX).sum())
    assert rows == [counted] and out.logits is None
    model.zero_grad()
    ref = model(**batch, return_hidden=True)  # all logits, token_loss
    assert ref.logits is not None and rows == [counted]
    ref.loss_sum.backward()
    assert float(out.loss_sum.detach()) == pytest.approx(float(ref.loss_sum.detach()), rel=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, atol=1e-5, rtol=1e-4), n
    model.zero_grad()  # text windows (every position counted): the full logits, as before
    full = model(ids=batch["ids"], targets=batch["ids"])
    assert full.logits is not None and rows == [counted]
