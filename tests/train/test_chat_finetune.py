"""``attnlm train --init-from SPEC --chat-data FILE.jsonl``: conversations rendered with the
model's chat template, the loss on assistant tokens only, bad records refused by line, and a
fine-tune that teaches a tiny ChatML model the reply style of ``fixtures/chat/ahoy.jsonl``."""

from __future__ import annotations

import json

import pytest
import torch
from tests.support import FIXTURES
from tests.support_chat import tiny_chat_llama

pytestmark = pytest.mark.usefixtures("one_thread")
AHOY = FIXTURES / "chat" / "ahoy.jsonl"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return tiny_chat_llama(tmp_path_factory.mktemp("chat") / "model")


def _conversations():
    return [json.loads(line)["messages"] for line in AHOY.read_text().splitlines()]


def _runs(mask):
    """``[start, end)`` of each run of True."""
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_loss_mask_covers_exactly_the_assistant_turns(chat_model):
    """The counted tokens decode to each assistant content plus its ``<|im_end|>``; the ids
    are those of ``transformers``' ``apply_chat_template`` (the same rendered string)."""
    transformers = pytest.importorskip("transformers")
    from attnlm.data.chat import encode_conversation
    from attnlm.loading.sources import resolve
    from attnlm.train.chat_data import end_tokens

    _, tok, info = resolve(chat_model)
    hf = transformers.AutoTokenizer.from_pretrained(chat_model)
    ends = end_tokens(tok, info.chat_template)
    assert "<|im_end|>" in ends
    for messages in _conversations():
        ids, mask = encode_conversation(tok, info.chat_template, messages, ends)
        rendered = hf.apply_chat_template(messages, tokenize=False)
        assert tok.decode(ids) == rendered
        assert ids == hf(rendered, add_special_tokens=False)["input_ids"]
        spans = [tok.decode(ids[a:b]) for a, b in _runs(mask)]
        assert spans == [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]


def test_batches_predict_only_assistant_tokens(chat_model):
    from attnlm.data.chat import encode_conversation
    from attnlm.loading.sources import resolve
    from attnlm.models.base import IGNORE_INDEX
    from attnlm.train.chat_data import ChatExamples, end_tokens

    _, tok, info = resolve(chat_model)
    ends = end_tokens(tok, info.chat_template)
    examples = [encode_conversation(tok, info.chat_template, m, ends) for m in _conversations()[:3]]
    batch = next(ChatExamples(examples, 512).sequential(3))
    for r, (ids, mask) in enumerate(examples):
        want = [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
        got = batch["targets"][r].tolist()
        assert got[: len(want)] == want
        assert set(got[len(want) :]) <= {IGNORE_INDEX}  # padding
        assert batch["ids"][r, : len(ids) - 1].tolist() == ids[:-1]


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", "not valid JSON"),
        ('{"turns": []}', '"messages"'),
        ('{"messages": [{"role": "pirate", "content": "arr"}]}', "role 'pirate'"),
        ('{"messages": [{"role": "user", "content": 3}]}', "'content' must be a string"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
        ('{"messages": [{"role": "assistant", "content": "\\ud800"}]}', "lone surrogate"),
    ],
)
def test_bad_records_name_their_line(cli, tmp_path, chat_model, line, problem):
    data = tmp_path / "chat.jsonl"
    good = AHOY.read_text().splitlines()[:2]
    data.write_text("\n".join([*good, line]) + "\n")
    r = cli("train", "--init-from", chat_model, "--chat-data", data, "--out", tmp_path / "run",
            "--max-iters", "1", "--no-progress")  # fmt: skip
    assert r.code == 2
    assert "chat.jsonl:3: " in r.err and problem in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1


def test_model_without_chat_template_is_refused(cli, tmp_path):
    folder = tiny_chat_llama(tmp_path / "plain", template=None)
    r = cli("train", "--init-from", folder, "--chat-data", AHOY, "--out", tmp_path / "run",
            "--max-iters", "1")  # fmt: skip
    assert r.code == 2 and "chat template" in r.err and len(r.err.strip().splitlines()) == 1


def test_chat_data_needs_init_from(cli, tmp_path):
    r = cli("train", "--chat-data", AHOY, "--out", tmp_path / "run", "--max-iters", "1")
    assert r.code == 2 and "--init-from" in r.err


def _reply_logprob(model, tok, template, question, reply):
    """log p(reply | conversation with the generation prompt), summed over the reply's tokens."""
    prompt = tok.encode(template.render([{"role": "user", "content": question}], True))
    answer = tok.encode(reply)
    x = torch.as_tensor([prompt + answer])
    with torch.no_grad():
        logp = model(ids=x).logits.log_softmax(-1)[0]
    return sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(answer))


def test_chat_fine_tune_learns_the_reply_style(cli, tmp_path, chat_model):
    """After 60 steps on ahoy.jsonl, the reply to a question it never saw starts with
    "Ahoy!" (greedy, through ``attnlm chat`` on the run: the template is kept in the run) and
    its log-probability rose clearly over the base model's; the run resumes."""
    from attnlm.loading.sources import resolve

    run = tmp_path / "run"
    r = cli("train", "--init-from", chat_model, "--chat-data", AHOY, "--out", run, "--lr",
            "1e-2", "--max-iters", "60", "--eval-interval", "30", "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "assistant tokens in the loss" in r.out
    base, tuned = resolve(chat_model), resolve(run)
    assert tuned.info.chat_template is not None
    question = "What do sheep eat?"
    before = _reply_logprob(base.model, base.tokenizer, base.info.chat_template, question, "Ahoy!")
    after = _reply_logprob(tuned.model, tuned.tokenizer, tuned.info.chat_template, question,
                           "Ahoy!")  # fmt: skip
    assert after > before + 5.0, (before, after)
    r = cli("chat", "--model", run, "--message", question, "--max-new-tokens", "6",
            "--temperature", "0")  # fmt: skip
    assert r.code == 0, r.err
    assert r.out.strip().startswith("Ahoy!"), r.out
    r = cli("train", "--resume", run, "--max-iters", "62", "--no-progress")
    assert r.code == 0 and "resuming" in r.out, r.err
