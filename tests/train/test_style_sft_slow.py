"""Issue 49's style check, on the real models (slow): 64 conversations that answer sums in a
fixed style ("Hoot! 3 and 4 make 7, says the owl."), at most 120 s of ``attnlm train
--chat-data ... --lora 8`` with the defaults, then ``attnlm chat`` on sums whose numbers no
training conversation has: the reply must be in the style.

The SmolLM2 check is the issue's bar: 30 steps of the old defaults (r 8 on q, v at 1e-4,
8 x 256 tokens) left "The sum of 3 and 4 is 7."; the measured 2-core recipe (every linear
layer at 1e-3, 4 x 128 tokens: ``attnlm.train.defaults``) answers in the style.
Qwen2.5-Coder-0.5B-Instruct is checked for what must hold already: its chat template's
rendering (the reference: the committed template rendered by jinja2 itself) with the loss
on exactly the assistant turns, and a short ``--chat-data --lora 8`` run on q,v (biased
projections) that ``attnlm chat`` then loads."""

from __future__ import annotations

import json
import random

import pytest

from support import FIXTURES, attnlm_process

pytestmark = pytest.mark.slow
QWEN = "qwen2.5-coder-0.5b-instruct"
QWEN_TEMPLATE = FIXTURES / "real_models" / f"{QWEN}.chat_template.jinja"
UNSEEN = [(71, 86), (93, 64), (88, 97)]  # sums of numbers above any training number


def style(a: int, b: int) -> str:
    return f"Hoot! {a} and {b} make {a + b}, says the owl."


def write_conversations(path, n: int = 64, seed: int = 0) -> None:
    """``n`` conversations "Add A and B." -> the style, with A, B in 2..60."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        messages = [{"role": "user", "content": f"Add {a} and {b}."},
                    {"role": "assistant", "content": style(a, b)}]  # fmt: skip
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _chat(run, a, b):
    r = attnlm_process("chat", "--model", run, "--message", f"Add {a} and {b}.",
                       "--max-new-tokens", 30, threads=2, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_smollm2_follows_a_style_after_120_seconds(tmp_path):
    from gguf_support import smollm2_file

    smollm2_file(fetch=True)
    data = tmp_path / "owl.jsonl"
    write_conversations(data)
    run = tmp_path / "run"
    r = attnlm_process("train", "--init-from", "smollm2-135m-instruct", "--chat-data", data,
                       "--lora", "8", "--time-budget", "120s", "--out", run, "--no-progress",
                       threads=2, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for a, b in UNSEEN:
        reply = _chat(run, a, b)
        assert reply.startswith("Hoot!") and reply.endswith("says the owl."), reply


def test_qwen_chat_data_masks_the_assistant_turns_as_its_template_renders():
    jinja2 = pytest.importorskip("jinja2")
    from attnlm.data.chat import encode_conversation
    from attnlm.loading.sources import resolve
    from attnlm.train.chat_data import end_tokens
    from support_real import real_file

    real_file(QWEN, fetch=True)
    _, tok, info = resolve(QWEN)
    ends = end_tokens(tok, info.chat_template)
    assert "<|im_end|>" in ends
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(QWEN_TEMPLATE.read_text(encoding="utf-8"))
    for a, b in [(3, 4), (12, 30)]:
        messages = [{"role": "user", "content": f"Add {a} and {b}."},
                    {"role": "assistant", "content": style(a, b)}]  # fmt: skip
        ids, mask = encode_conversation(tok, info.chat_template, messages, ends)
        want = template.render(messages=messages, add_generation_prompt=False)
        assert tok.decode(ids) == want
        counted = tok.decode([i for i, m in zip(ids, mask) if m])
        assert counted == style(a, b) + "<|im_end|>"


def test_qwen_chat_data_lora_trains_and_chats(tmp_path):
    from support_real import real_file

    real_file(QWEN, fetch=True)
    data = tmp_path / "owl.jsonl"
    write_conversations(data, n=16)
    run = tmp_path / "run"
    r = attnlm_process("train", "--init-from", QWEN, "--chat-data", data, "--lora", "8",
                       "--max-iters", "2", "--batch-size", "2", "--eval-iters", "1",
                       "--out", run, "--no-progress", threads=2, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "held-out loss (nats/token):" in r.stdout
    config = json.loads((run / "checkpoint" / "config.json").read_text())
    assert config["lora"]["targets"] == ["q", "v"] and config["lora"]["r"] == 8
    assert _chat(run, *UNSEEN[0])  # the adapted run loads and answers
