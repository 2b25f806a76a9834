"""Fuzz target: a chat template (the Jinja text a model ships) through
:class:`attnlm.tokenizers.chat_template.ChatTemplate`, rendered over a short conversation in
the sandbox with its bounds (time, memory, output). Jinja's own parser is instrumented too, so
the fuzzer learns its grammar. Policy: fuzz/fuzzkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import fuzzkit  # noqa: E402

with fuzzkit.instrumented("jinja2"):
    from attnlm.base.errors import InputError
    from attnlm.tokenizers.chat_template import ChatTemplate

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def target(data: bytes) -> None:
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8") from None  # the readers refuse such a file first
    out = ChatTemplate(source, SPECIAL, origin="fuzz").render(MESSAGES, True)
    assert isinstance(out, str)


if __name__ == "__main__":
    sys.exit(fuzzkit.main(target))
