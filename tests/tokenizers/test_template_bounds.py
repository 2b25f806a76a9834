"""A chat template's work and output are bounded (attnlm.tokenizers.template_bounds): loops that
render without end, strings that double on every line, one operation asked to build a
gigabyte, each stopped in one line naming the template, within seconds and at bounded memory;
real templates render as before (tests/generate/test_chat_template.py compares them with
``transformers``)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import pytest

from attnlm.base.errors import InputError
from attnlm.tokenizers import template_bounds as bounds
from attnlm.tokenizers.chat_template import ChatTemplate, from_hf_folder
from support import attnlm_process

CONV = [{"role": "user", "content": "hello"}]
# the issue's case: 10**10 iterations (jinja2's sandbox caps one range at 100,000 items)
NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
NS = "{% set ns = namespace(s='x', n=3, l=[]) %}"
LOOP = "{% for i in range(100000) %}"
HOSTILE = {
    "nested loops, no output": NESTED.replace("x", ""),
    "a counter in nested loops": NS + NESTED.replace("x", "{% set ns.n = ns.n + 1 %}"),
    "a list grown by one": NS + LOOP + "{% set ns.l = ns.l + [i] %}{% endfor %}",
    "output without end": NESTED.replace("x", "x" * 100),
    "a string doubled by ~": NS + LOOP + "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "a string doubled by +": NS + LOOP + "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "an integer squared": NS + LOOP + "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n }}",
    "a repeated string": "{{ 'x' * 10**9 }}",
    "a repeated list": "{{ [1, 2] * 10**9 }}",
    "a power": "{{ 7 ** (10 ** 8) }}",
    "center filter": "{{ 'x'|center(10**9) }}",
    "ljust method": "{{ 'x'.ljust(10**9) }}",
    "indent": "{{ ('a\n' * 100000)|indent(1000) }}",
    "printf width": "{{ '%1000000000d' % 1 }}",
    "printf star": "{{ '%*d' % (10**9, 1) }}",
    "format filter": "{{ '%1000000000s'|format('x') }}",
    "str.format width": "{{ '{:>1000000000}'.format('x') }}",
    "str.format nested width": "{{ '{:{w}}'.format('x', w=10**9) }}",
    "replace squaring": NS + LOOP + "{% set ns.s = ns.s|replace('x', ns.s ~ ns.s) %}{% endfor %}",
    "replace method": "{{ ('x' * 10000).replace('', 'y' * 10000) }}",
    "join separator": "{{ range(100000)|list|join('x' * 10000) }}",
    "lipsum": "{{ lipsum(n=10**6) }}",
}


def _peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


@pytest.fixture
def quick(monkeypatch):
    """Bounds a tenth as large, so that the cases that run to a bound take a fraction of a
    second (the full-size bounds: test_the_issues_nested_loop_is_stopped_in_seconds)."""
    monkeypatch.setattr(bounds, "MAX_STEPS", 300_000)
    monkeypatch.setattr(bounds, "MAX_SECONDS", 1.0)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_is_stopped_in_one_line(quick, name):
    template = ChatTemplate(HOSTILE[name], origin="evil/tokenizer_config.json: chat_template")
    before, start = _peak_mb(), time.monotonic()
    with pytest.raises(InputError) as e:
        template.render(CONV)
    took, grew = time.monotonic() - start, _peak_mb() - before
    message = str(e.value)
    assert "\n" not in message and message.startswith("evil/tokenizer_config.json: chat_template")
    assert "stopped" in message or "failed" in message, message
    assert took < 4.0, (name, took)  # 1 s of budget, on a busy machine
    assert grew < 200, (name, grew)


def test_the_issues_nested_loop_is_stopped_in_seconds():
    """The defaults: the nested loop ends at the step bound or the clock, within seconds."""
    start = time.monotonic()
    with pytest.raises(InputError, match="the template was stopped: it (took|ran)"):
        ChatTemplate(NESTED, origin="m.gguf: tokenizer.chat_template").render(CONV)
    assert time.monotonic() - start < bounds.MAX_SECONDS + 2


def test_the_bounds_leave_the_renderer_as_it_was(quick):
    """Tracing is this render's alone: the thread's previous trace function is back after a
    render, stopped or not, and a later render of a real template works."""
    from support_chat import CHATML

    def mine(frame, event, arg):
        return None

    sys.settrace(mine)
    try:
        with pytest.raises(InputError):
            ChatTemplate(NESTED).render(CONV)
        assert sys.gettrace() is mine
        assert ChatTemplate(CHATML).render(CONV).endswith("<|im_start|>user\nhello<|im_end|>\n")
        assert sys.gettrace() is mine
    finally:
        sys.settrace(None)


def test_long_conversations_and_large_but_sane_templates_render():
    """The bounds are far from what real use needs: a 2,000-turn conversation (output grows
    with the conversation) and a loop of 50,000 lines render in full."""
    from support_chat import CHATML

    conv = [{"role": ("user", "assistant")[i % 2], "content": "word " * 200} for i in range(2000)]
    text = ChatTemplate(CHATML).render(conv)
    assert text.count("<|im_start|>") == 2001 and len(text) > 2_000_000
    many = "{% for i in range(50000) %}{{ i % 10 }}{% endfor %}"
    assert ChatTemplate(many).render(CONV) == "0123456789" * 5000
    formats = "{{ '%05d|%-3s|' % (42, 'a') }}{{ '{:>6}'.format('b') }}"
    assert ChatTemplate(formats).render(CONV) == "00042|a  |     b"


def test_the_line_names_the_file(quick, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": NESTED}))
    template = from_hf_folder(tmp_path)
    assert template is not None
    with pytest.raises(InputError) as e:
        template.render(CONV)
    where = f"{tmp_path / 'tokenizer_config.json'}: chat_template: the template was stopped"
    assert str(e.value).startswith(where)


@pytest.mark.slow
def test_chat_with_a_hostile_template_in_tokenizer_config(tmp_path):
    """As a new user meets it: ``attnlm chat`` on a folder whose tokenizer_config.json holds the
    nested loop ends in seconds with one line naming the file, exit 2."""
    pytest.importorskip("transformers")
    from support_chat import tiny_chat_llama

    folder = tiny_chat_llama(tmp_path / "m", template=NESTED)
    start = time.monotonic()
    try:
        r = attnlm_process("chat", "--model", folder, "--message", "hi", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the template was not stopped within 60 s")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "tokenizer_config.json: chat_template" in r.stderr and "stopped" in r.stderr
    assert time.monotonic() - start < 30
