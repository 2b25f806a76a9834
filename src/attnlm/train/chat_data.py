"""A fine-tuning run's conversations (``train.chat_data``): encoded with the model's tokenizer
and chat template (:mod:`attnlm.data.chat`), split into training and validation
conversations (the last ``val_fraction`` of them, at least one), and batched for the causal
objective with the loss on assistant tokens only.

Batches: ``ids`` ``(B, T)`` (a conversation's tokens, cut to ``block_size + 1`` and padded on
the right) and ``targets`` ``(B, T)``: the next token where it is an assistant token,
``IGNORE_INDEX`` elsewhere (context tokens, padding). Right padding changes nothing before it
under causal attention, so no attention mask is needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.data.chat import encode_conversation, read_conversations
from attnlm.loading.objectives import Batch, BatchSource
from attnlm.models.base import IGNORE_INDEX
from attnlm.tokenizers.chat_template import END_OF_TURN


class ChatExamples(BatchSource):
    """Encoded conversations as a :class:`~attnlm.loading.objectives.BatchSource` (see the module
    docstring)."""

    def __init__(self, examples: list[tuple[list[int], list[bool]]], block_size: int) -> None:
        self.examples = examples
        self.block_size = block_size

    def draw(self, n: int, generator: torch.Generator) -> Batch:
        return {"index": torch.randint(len(self.examples), (n,), generator=generator)}

    def collate(self, draw: Batch) -> Batch:
        return self._batch([self.examples[int(i)] for i in draw["index"]])

    def _batch(self, rows: list[tuple[list[int], list[bool]]]) -> Batch:
        cut = [(ids[: self.block_size + 1], mask[: self.block_size + 1]) for ids, mask in rows]
        T = max(len(ids) for ids, _ in cut) - 1
        x = torch.zeros(len(cut), T, dtype=torch.long)
        y = torch.full((len(cut), T), IGNORE_INDEX, dtype=torch.long)
        for r, (ids, mask) in enumerate(cut):
            t = torch.as_tensor(ids, dtype=torch.long)
            keep = torch.as_tensor(mask[1:], dtype=torch.bool)
            x[r, : len(ids) - 1] = t[:-1]
            y[r, : len(ids) - 1] = torch.where(keep, t[1:], IGNORE_INDEX)
        return {"ids": x, "targets": y}

    def sequential(self, batch_size: int) -> Iterator[Batch]:
        for i in range(0, len(self.examples), batch_size):
            yield self._batch(self.examples[i : i + batch_size])

    def tokens_per_example(self) -> int:
        return self.block_size


@dataclass
class ChatRunData:
    """The prepared conversations of a run (what :func:`prepare_chat` returns)."""

    tokenizer: Any
    train: list[tuple[list[int], list[bool]]]
    val: list[tuple[list[int], list[bool]]]
    path: Path

    def stats_line(self) -> str:
        tokens = sum(len(ids) for ids, _ in self.train + self.val)
        counted = sum(sum(m) for _, m in self.train + self.val)
        return (f"chat data: {self.path.name}: {len(self.train)} training and {len(self.val)} "
                f"validation conversations, {tokens:,} tokens ({counted:,} assistant tokens "
                "in the loss)")  # fmt: skip

    def sources(self, block_size: int) -> tuple[ChatExamples, ChatExamples]:
        return ChatExamples(self.train, block_size), ChatExamples(self.val, block_size)


def end_tokens(tokenizer: Any, template: Any) -> list[str]:
    """The strings that end an assistant turn: the template's EOS and the usual end-of-turn
    tokens the vocabulary has as special tokens."""
    specials = getattr(tokenizer, "special_tokens", {}) or {}
    out = [template.special_tokens.get("eos_token")]
    out += [t for t in END_OF_TURN if t in specials]
    return [t for t in dict.fromkeys(out) if t]


def prepare_chat(cfg: Any, tokenizer: Any, template: Any) -> ChatRunData:
    """Read, check and encode ``cfg.chat_data`` (see the module docstring)."""
    if template is None:
        raise ConfigError(
            "--chat-data needs a model with a chat template; the --init-from model has none"
        )
    if cfg.text is not None or cfg.data_dir is not None:
        raise ConfigError("--chat-data is the training data; leave out --text and --data-dir")
    path = Path(cfg.chat_data)
    ends = end_tokens(tokenizer, template)
    examples = []
    for conv in read_conversations(path):
        try:
            ids, mask = encode_conversation(tokenizer, template, conv.messages, ends)
        except InputError as e:
            raise InputError(f"{path}:{conv.line}: {e}") from None
        if sum(mask[1:]) == 0:
            raise InputError(f"{path}:{conv.line}: no assistant token after the first token")
        examples.append((ids, mask))
    if len(examples) < 2:
        raise InputError(f"{path}: need at least 2 conversations (training and validation)")
    n_val = max(1, math.floor(len(examples) * cfg.val_fraction))
    return ChatRunData(tokenizer, examples[:-n_val], examples[-n_val:], path)
