"""Constrained decoding for ``response_format`` (``json_object``, ``json_schema``) and forced
tool calls, by llguidance (https://github.com/guidance-ai/llguidance, MIT): a grammar compiled
from the JSON schema (or a Lark grammar around it), a token mask per step computed from the
tokenizer's byte strings, so only continuations the grammar allows can be picked.

The tokenizer is given to llguidance as the bytes of every id (ids of control tokens such as
``<|im_end|>`` marked with a leading 0xFF, which llguidance reads as "special"), the model's
end ids as its end-of-sequence tokens (allowed once the grammar accepts), and attnlm's own
encoder for the text it needs to re-tokenize."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from attnlm.base.errors import InputError


class _Wrapped:
    """The tokenizer in the shape llguidance's ``TokenizerWrapper`` reads."""

    def __init__(self, tokenizer: Any, n_vocab: int, stop_ids: list[int]) -> None:
        from attnlm.tokenizers import token_label

        special = set(getattr(tokenizer, "special_tokens", {}).values()) | set(stop_ids)
        size = int(tokenizer.vocab_size)
        tokens = []
        for i in range(n_vocab):
            if i >= size:
                tokens.append(b"")
                continue
            raw = (
                tokenizer.token_bytes(i)
                if hasattr(tokenizer, "token_bytes")
                else token_label(tokenizer, i).encode()
            )
            control = i in special and raw.startswith(b"<|") or i in stop_ids
            tokens.append(b"\xff" + raw if control else raw)
        self.tokens = tokens
        self.eos_token_id = stop_ids[0] if stop_ids else None
        self.bos_token_id = None
        self.special_token_ids = [i for i in range(min(size, n_vocab)) if tokens[i][:1] == b"\xff"]
        self._tok = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tok.encode(text)) if text else []


class Grammars:
    """Grammars and matchers for one model's tokenizer (``n_vocab``: the logits' width)."""

    def __init__(self, tokenizer: Any, n_vocab: int, stop_ids: list[int]) -> None:
        import llguidance
        from llguidance import TokenizerWrapper

        self.ll = llguidance
        wrapped = _Wrapped(tokenizer, n_vocab, sorted(stop_ids))
        self.tokenizer = llguidance.LLTokenizer(
            TokenizerWrapper(wrapped), n_vocab=n_vocab, eos_token=sorted(stop_ids) or None
        )
        self.n_vocab = n_vocab

    # -- grammars -----------------------------------------------------------------------------

    def json_schema(self, schema: dict | None) -> str:
        """The grammar of a JSON value following ``schema`` (None: any JSON object)."""
        schema = {"type": "object"} if schema is None else schema
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        return self.check(grammar, "response_format.json_schema.schema")

    def tool_call(self, tools: list[dict]) -> str:
        """The grammar of one Qwen-style tool call to one of ``tools``: ``<tool_call>\\n{"name":
        ..., "arguments": {...}}\\n</tool_call>``, the arguments following the function's
        parameters schema."""
        options = []
        for t in tools:
            f = t["function"]
            options.append({
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    "arguments": f.get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            })  # fmt: skip
        schema = dict(options[0]) if len(options) == 1 else {"anyOf": options}
        schema["x-guidance"] = {"whitespace_flexible": False}  # compact: a model cannot pad
        lark = f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {json.dumps(schema)}\n'
        return self.check(self.ll.LLMatcher.grammar_from_lark(lark), "tools")

    def check(self, grammar: str, where: str) -> str:
        bad, messages = self.ll.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if bad:
            raise InputError(f"{where}: not a grammar the decoder can follow: {messages[0]}")
        return grammar

    # -- per job -------------------------------------------------------------------------------

    def matcher(self, grammar: str) -> Any:
        m = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise InputError(f"grammar: {m.get_error()}")
        return m

    def mask(self, matcher: Any, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(V,)`` with every id the grammar forbids at -inf."""
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: logits.numel()].astype(bool)
        if not allowed.any():  # the matcher failed: let only the end through
            return logits
        out = logits.clone()
        out[torch.from_numpy(~allowed)] = float("-inf")
        return out

    def consume(self, matcher: Any, token: int) -> None:
        matcher.consume_token(token)
