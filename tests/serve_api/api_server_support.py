"""What the API tests share: a tiny chat model whose template offers tools the way Qwen2.5's
does (ChatML, a ``<tools>`` list in the system turn, replies calling them with
``<tool_call>{json}</tool_call>``), its weights scaled up so that greedy picks are clear-cut,
and the server run on loopback in a thread (:class:`~attnlm.api.run.Background`)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from support_chat import tiny_chat_llama

# ChatML with tools, after Qwen2.5's template (its conventions, written anew and short)
TOOLS_CHATML = (
    "{% if tools %}<|im_start|>system\n"
    "{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.' }}"
    "\n\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    'Call a function as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>'
    "<|im_end|>\n{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] != 'system' %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tools_model(folder: Path, scale: float = 4.0) -> Path:
    """:func:`support_chat.tiny_chat_llama` with :data:`TOOLS_CHATML`, every matrix
    multiplied by ``scale`` (a random tiny model's logits are otherwise nearly tied)."""
    import torch
    from safetensors.torch import load_file, save_file

    tiny_chat_llama(folder, template=TOOLS_CHATML, seed=3)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    for name, t in tensors.items():
        if t.dim() == 2:
            tensors[name] = (t * scale).contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})
    config_file = folder / "config.json"  # room for tool schemas spelt out byte by byte
    config = json.loads(config_file.read_text())
    config["max_position_embeddings"] = 2048
    config_file.write_text(json.dumps(config, indent=1))
    del torch
    return folder


@contextmanager
def serving(spec, api_key=None, **options):
    """``(served, url)`` of the API over ``spec`` on 127.0.0.1 (a free port) until the block
    ends; ``options`` go to :class:`~attnlm.api.served.Served` (``parallel``, ``limits``)."""
    from attnlm.api.app import make_app
    from attnlm.api.run import Background
    from attnlm.api.served import Served

    served = Served(str(spec), **options)
    bg = Background(make_app(served, api_key))
    try:
        yield served, bg.url
    finally:
        bg.stop()
        served.close()


@contextmanager
def reuse_seen(scheduler):
    """A list that gets, for every request the scheduler places in a slot until the block
    ends, how many of its prompt ids that slot's cache already held (prompt caching)."""
    seen: list[int] = []
    original = scheduler._place

    def spy(slot, job):
        original(slot, job)
        seen.append(job.reused)

    scheduler._place = spy
    try:
        yield seen
    finally:
        scheduler._place = original


def client(url, key="none", **options):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, **options)
