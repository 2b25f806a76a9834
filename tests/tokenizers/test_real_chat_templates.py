"""The chat templates of the real models render in attnlm exactly as ``transformers``'
``apply_chat_template`` renders them (its Jinja renderer, ``render_jinja_template``, given the
same template text and special tokens): Qwen2.5-Coder's (default system prompt, a system
message, several turns, its ``# Tools`` section with JSON function schemas, assistant tool calls
and tool responses) and Gemma 3's (system text folded into the first user turn, trimmed
contents, the roles it refuses). The Qwen templates are the files' own
(``tests/fixtures/real_models``, written from the GGUF metadata; the slow-free test on the
cached files reads them from the GGUF itself); Gemma 3 270M is a base model whose file has no
template, so Gemma 3's instruction-tuned template is a committed fixture."""

from __future__ import annotations

import json

import pytest

from attnlm.base.errors import InputError
from attnlm.tokenizers.chat_template import ChatTemplate
from support import FIXTURES
from support_real import real_file

HERE = FIXTURES / "real_models"
QWEN = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
GEMMA = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}
TEMPLATES = {
    "qwen2.5-coder-0.5b-instruct": (HERE / "qwen2.5-coder-0.5b-instruct.chat_template.jinja", QWEN),
    "qwen2.5-coder-1.5b-instruct": (HERE / "qwen2.5-coder-1.5b-instruct.chat_template.jinja", QWEN),
    "gemma3": (HERE / "gemma3.chat_template.jinja", GEMMA),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "run_python", "description": "Run code <safely> & return stdout.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}},
]  # fmt: skip

USER = [{"role": "user", "content": "Write a Python function that reverses a string."}]
SYSTEM = [{"role": "system", "content": "You are a terse coder."}] + USER
TURNS = SYSTEM + [
    {"role": "assistant", "content": "  def rev(s): return s[::-1]\n\n"},
    {"role": "user", "content": " Now in C, with ünïcödé 日本語 and emoji 😀 \n"},
]
TOOL_CALLS = [
    {"role": "user", "content": "Weather in Paris and Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": '{"temp": 15}'},
    {"role": "assistant", "content": "Paris 21 °C, Zürich 15 °C."},
    {"role": "user", "content": "Thanks!"},
]  # fmt: skip

QWEN_CASES = [(USER, None), (SYSTEM, None), (TURNS, None), (USER, TOOLS), (SYSTEM, TOOLS),
              (TOOL_CALLS, TOOLS), (TOOL_CALLS, None)]  # fmt: skip
GEMMA_CASES = [(USER, None), (SYSTEM, None), (TURNS, None)]


def reference(source: str, special: dict, messages, tools, add_generation_prompt: bool) -> str:
    """What ``apply_chat_template(messages, tools=tools, tokenize=False)`` renders."""
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = utils.render_jinja_template(
        [json.loads(json.dumps(messages))], tools=tools, chat_template=source,
        add_generation_prompt=add_generation_prompt, **special)  # fmt: skip
    return rendered[0]


def _cases():
    for name in TEMPLATES:
        cases = GEMMA_CASES if name == "gemma3" else QWEN_CASES
        for k, (messages, tools) in enumerate(cases):
            for gen in (True, False):
                yield pytest.param(name, messages, tools, gen, id=f"{name}-{k}-{gen}")


@pytest.mark.parametrize("name, messages, tools, gen", list(_cases()))
def test_renders_as_transformers(name, messages, tools, gen) -> None:
    path, special = TEMPLATES[name]
    source = path.read_text("utf-8")
    want = reference(source, special, messages, tools, gen)
    got = ChatTemplate(source, special).render(messages, add_generation_prompt=gen, tools=tools)
    assert got == want


def test_qwen_default_system_and_tools_section() -> None:
    """What the Qwen renderings hold (so the comparison above compares something)."""
    path, special = TEMPLATES["qwen2.5-coder-0.5b-instruct"]
    t = ChatTemplate(path.read_text("utf-8"), special)
    plain = t.render(USER, add_generation_prompt=True)
    assert plain.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                            "helpful assistant.<|im_end|>\n<|im_start|>user\nWrite")  # fmt: skip
    assert plain.endswith("<|im_end|>\n<|im_start|>assistant\n")
    tools = t.render(TOOL_CALLS, add_generation_prompt=True, tools=TOOLS)
    assert "# Tools" in tools and '"description": "Run code <safely> & return stdout."' in tools
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"' in tools
    assert (
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>'
        in tools
    )


def test_gemma_folds_the_system_text_and_trims() -> None:
    path, special = TEMPLATES["gemma3"]
    got = ChatTemplate(path.read_text("utf-8"), special).render(TURNS, add_generation_prompt=True)
    assert got == (
        "<bos><start_of_turn>user\nYou are a terse coder.\n\nWrite a Python function that "
        "reverses a string.<end_of_turn>\n<start_of_turn>model\ndef rev(s): return s[::-1]"
        "<end_of_turn>\n<start_of_turn>user\nNow in C, with ünïcödé 日本語 and emoji 😀"
        "<end_of_turn>\n<start_of_turn>model\n"
    )


def test_gemma_refuses_roles_that_do_not_alternate() -> None:
    path, special = TEMPLATES["gemma3"]
    messages = USER + USER
    jinja2 = pytest.importorskip("jinja2")
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        reference(path.read_text("utf-8"), special, messages, None, True)
    with pytest.raises(InputError, match="the template refused the conversation: Conversation "
                       "roles must alternate") as e:  # fmt: skip
        ChatTemplate(path.read_text("utf-8"), special, origin="gemma3").render(messages)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "tools, messages, match",
    [
        ("get_weather", USER, "tools: expected a list of JSON function schemas"),
        ([{"f": {1, 2}}], USER, "tools: not JSON data"),
        (None, [{"role": "assistant", "content": "", "tool_calls": "x"}],
         r"messages\[0\]: 'tool_calls' must be a list of objects"),
        (None, [{"role": "tool", "content": "1", "tool_call_id": 5}],
         r"messages\[0\]: 'tool_call_id' must be a string"),
    ],
)  # fmt: skip
def test_bad_tools_are_one_line_errors(tools, messages, match) -> None:
    path, special = TEMPLATES["qwen2.5-coder-0.5b-instruct"]
    with pytest.raises(InputError, match=match) as e:
        ChatTemplate(path.read_text("utf-8"), special).render(messages, tools=tools)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_gguf_template_and_prompt_ids(name) -> None:
    """On the cached real file: the template attnlm's chat takes from the GGUF (with the
    file's special tokens) renders as transformers renders the GGUF's template text, and the
    chat prompt of the recorded llama.cpp reference encodes to llama.cpp's ids."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.tokenizers.gguf import GGUFTokenizer, gguf_chat_setup

    path = real_file(name)
    source = GGUFFile(path).get("tokenizer.chat_template")
    assert source == TEMPLATES[name][0].read_text("utf-8")
    tok = GGUFTokenizer.from_gguf(path)
    template, stops = gguf_chat_setup(tok, str(path))
    assert template.special_tokens == QWEN and tok.eos_id in stops
    for messages, tools in QWEN_CASES:
        want = reference(source, QWEN, messages, tools, True)
        assert template.render(messages, add_generation_prompt=True, tools=tools) == want
    refs = json.loads((HERE / "llamacpp-references.json").read_text("utf-8"))["greedy"]["chat"]
    prompt = template.render(refs["messages"], add_generation_prompt=True)
    assert prompt == refs["prompt"]
    if name == refs["model"]:
        assert tok.encode(prompt) == refs["prompt_ids"]
