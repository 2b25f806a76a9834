"""Chat templates render exactly as ``transformers``' ``apply_chat_template(..., tokenize=False)``
on real templates (ChatML in SmolLM2's form, Llama 3's, Mistral's and Gemma's with
``raise_exception``, Qwen2.5's with tools, a multi-line one using ``tojson``, ``namespace`` and
``{% generation %}``), with and without the generation prompt, inside the bounded sandbox
(attnlm.tokenizers.template_bounds); templates from a Hugging Face folder; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlm.base.errors import InputError
from attnlm.tokenizers.chat_template import ChatTemplate, from_file, from_hf_folder, from_string
from support_chat import CHATML  # SmolLM2-Instruct's template (ChatML, default system prompt)

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()

# Llama 3 Instruct's template
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Mistral Instruct v0.1's template (no system role: it raises)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)
# multi-line: trim_blocks/lstrip_blocks matter, tojson, namespace, loop controls, generation
MULTILINE = """{% set ns = namespace(n=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' %}
<<SYS>>{{ message['content'] | tojson }}<</SYS>>
    {% elif message['role'] == 'assistant' %}
{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}
    {% else %}
        {% set ns.n = ns.n + 1 %}
[{{ ns.n }}] {{ message['content'] }}
    {% endif %}
    {% if message['content'] == 'STOP' %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}
>>>
{% endif %}
"""

CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Italy?"},
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": '  Tell me a joke <about> "cats" & dogs, café 猫 🐈  '},
    ],
    "system multi-turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "STOP"},
        {"role": "assistant", "content": "after the break"},
    ],
}


def hf_tokenizer(template: str):
    """A ``PreTrainedTokenizerFast`` built offline from a tiny word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=template,
    )


FIXTURES = Path(__file__).parent.parent / "fixtures" / "chat"
QWEN25 = (FIXTURES / "qwen2.5-instruct.jinja").read_text()  # tools, tool calls and responses
GEMMA = (FIXTURES / "gemma-instruct.jinja").read_text()  # no system role: it raises
SMOLLM3 = (FIXTURES / "smollm3.jinja").read_text()  # reasoning mode, /think and /no_think
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "multiline": MULTILINE, "qwen2.5": QWEN25,
             "smollm3": SMOLLM3}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
@pytest.mark.parametrize("gen", [False, True])
def test_renders_as_transformers(name, conv, gen):
    template = TEMPLATES[name]
    ref = hf_tokenizer(template).apply_chat_template(
        CONVERSATIONS[conv], tokenize=False, add_generation_prompt=gen
    )
    ours = from_string(template, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert ours.render(CONVERSATIONS[conv], add_generation_prompt=gen) == ref


@pytest.mark.parametrize("conv", ["one user turn", "multi-turn"])
def test_mistral_template_as_transformers(conv):
    ref = hf_tokenizer(MISTRAL).apply_chat_template(CONVERSATIONS[conv], tokenize=False)
    ours = from_string(MISTRAL, bos_token="<s>", eos_token="</s>")
    assert ours.render(CONVERSATIONS[conv]) == ref


@pytest.mark.parametrize("conv", ["one user turn", "multi-turn"])
def test_gemma_template_as_transformers(conv):
    for gen in (False, True):
        ref = hf_tokenizer(GEMMA).apply_chat_template(
            CONVERSATIONS[conv], tokenize=False, add_generation_prompt=gen
        )
        assert from_string(GEMMA, bos_token="<s>").render(CONVERSATIONS[conv], gen) == ref
    with pytest.raises(InputError, match="System role not supported"):
        from_string(GEMMA).render(CONVERSATIONS["system"])


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, today",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris and Lyon?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}},
    ]},
    {"role": "tool", "content": "18 C, sunny"},
    {"role": "tool", "content": "21 C, café weather"},
]  # fmt: skip


def test_qwen25_with_tools_as_transformers():
    """The bounded sandbox renders Qwen2.5's tool branch (tools as JSON, tool calls, grouped
    tool responses) as ``transformers`` does."""
    from attnlm.tokenizers.chat_template import _compile
    from attnlm.tokenizers.template_bounds import bounded_render

    ref = hf_tokenizer(QWEN25).apply_chat_template(
        TOOL_TURNS, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    ours = bounded_render(_compile(QWEN25), 0, messages=TOOL_TURNS, tools=TOOLS,
                          documents=None, add_generation_prompt=True)  # fmt: skip
    assert ours == ref and '"arguments": {"city": "Lyon"}' in ours


def test_raise_exception_is_one_line_input_error():
    with pytest.raises(Exception, match="Conversation roles must alternate"):  # the reference
        hf_tokenizer(MISTRAL).apply_chat_template(CONVERSATIONS["system"], tokenize=False)
    t = from_string(MISTRAL, bos_token="<s>", eos_token="</s>")
    with pytest.raises(InputError, match="roles must alternate") as e:
        t.render(CONVERSATIONS["system"])
    assert "\n" not in str(e.value)


def test_strftime_now_and_tojson_match_transformers():
    template = "{{ strftime_now('%Y-%m-%d') }} {{ messages | tojson(indent=2) }}"
    conv = CONVERSATIONS["multi-turn"]
    ref = hf_tokenizer(template).apply_chat_template(conv, tokenize=False)
    assert from_string(template).render(conv) == ref


def test_bad_templates_and_messages():
    with pytest.raises(InputError, match="not a valid template"):
        from_string("{% for m in messages %}").render([{"role": "user", "content": "x"}])
    with pytest.raises(InputError, match="empty"):
        ChatTemplate("  ")
    with pytest.raises(InputError, match=r"messages\[1\]: 'content'"):
        from_string(CHATML).render([{"role": "user", "content": "a"}, {"role": "user"}])
    # the sandbox refuses access to Python internals
    with pytest.raises(InputError):
        from_string("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(InputError):
        from_string("{% set _ = messages.append(1) %}x").render([])
    # what a template computes fails in one line: a range over the sandbox's limit, 1 / 0, a
    # macro calling itself without end
    for body, what in (
        ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError"),
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ):
        with pytest.raises(InputError, match=f"the template failed \\({what}") as e:
            from_string(body).render([{"role": "user", "content": "x"}])
        assert "\n" not in str(e.value)


def test_template_from_hf_folder(tmp_path):
    hf = hf_tokenizer(CHATML)
    hf.save_pretrained(tmp_path / "a")
    conv = CONVERSATIONS["system multi-turn"]
    ref = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    t = from_hf_folder(tmp_path / "a")  # tokenizer_config.json or chat_template.jinja
    assert t is not None and t.render(conv, add_generation_prompt=True) == ref
    # a chat_template.jinja next to the config wins; special tokens come from the config
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "no"})
    )
    (tmp_path / "b" / "chat_template.jinja").write_text(MISTRAL)
    ref = hf_tokenizer(MISTRAL).apply_chat_template(CONVERSATIONS["multi-turn"], tokenize=False)
    assert from_hf_folder(tmp_path / "b").render(CONVERSATIONS["multi-turn"]) == ref
    # a list of named templates: the default one
    (tmp_path / "c").mkdir()
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": LLAMA3}]
    (tmp_path / "c" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "chat_template": named})
    )
    ref = hf_tokenizer(LLAMA3).apply_chat_template(CONVERSATIONS["system"], tokenize=False)
    assert from_hf_folder(tmp_path / "c").render(CONVERSATIONS["system"]) == ref
    (tmp_path / "d").mkdir()
    assert from_hf_folder(tmp_path / "d") is None
    f = tmp_path / "t.jinja"
    f.write_text(LLAMA3)
    assert from_file(f, {"bos_token": "<s>"}).render(CONVERSATIONS["system"]) == ref
