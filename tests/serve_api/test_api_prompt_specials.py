"""``/v1/completions`` encodes a plain prompt with the special tokens its tokenizer adds (a
Gemma GGUF file asks for BOS first, as llama-server and ``attnlm generate`` encode it); a chat
is rendered by its template, which writes its own."""

from __future__ import annotations

from attnlm.api import protocol
from attnlm.api.served import Served


class BosTokenizer:
    bos_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([0] if add_special_tokens else []) + [ord(c) - 96 for c in text]


def test_a_completion_prompt_gets_the_bos_a_chat_render_does_not():
    served = Served.__new__(Served)  # only the tokenizer is needed to encode
    served.tokenizer = BosTokenizer()
    assert protocol.prompt_ids(served, {"prompt": "abc"}) == [0, 1, 2, 3]
    assert protocol.prompt_ids(served, {"prompt": ["abc"]}) == [0, 1, 2, 3]
    assert served.encode("abc") == [1, 2, 3]  # a rendered template: as written
