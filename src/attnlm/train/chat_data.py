"""A fine-tuning run's conversations (``train.chat_data``): encoded with the model's tokenizer
and chat template (:mod:`attnlm.data.chat`), split into training and validation
conversations (the last ``val_fraction`` of them, at least one), and batched for the causal
objective with the loss on assistant tokens only.

Batches: ``ids`` ``(B, T)`` and ``targets`` ``(B, T)``: the next token where it is an assistant
token, ``IGNORE_INDEX`` elsewhere (context tokens, padding); each conversation is cut to
``block_size + 1`` tokens. A run packs its conversations (:func:`pack`): each row holds
several whole conversations, one after the other, up to ``block_size`` inputs, with padding
only at the end, so a step spends its time on tokens rather than padding. A packed row also
carries ``segments`` ``(B, T)`` (which conversation each token belongs to, 1, 2, ...), and the
model attends within a conversation only (:func:`attnlm.nn.masks.segment_mask`, positions
restarting per conversation): each conversation's loss is exactly the loss it has alone
(tested), nothing leaks from one into the next. Rows of one conversation carry no
``segments`` (right padding changes nothing before it under causal attention), and the
loss's LM head runs on the assistant positions only (:meth:`attnlm.models.decoder.Decoder
._loss_only`).
"""

from __future__ import annotations

import math
import random
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

Example = tuple[list[int], list[bool]]  # a conversation's ids and which of them are counted
OPEN_ROWS = 64  # rows still looked at for room while packing (first fit among them)


def pack(lengths: list[int], room: int, seed: int = 0) -> list[list[int]]:
    """Rows of example indices whose ``lengths`` (each at most ``room``) sum to at most
    ``room`` per row: the examples in a seeded random order, each put into the first of the
    last :data:`OPEN_ROWS` rows it fits in (else a new row); the rows in that order."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = min(lengths[i], room)
        start = max(0, len(rows) - OPEN_ROWS)
        at = next((r for r in range(start, len(rows)) if free[r] >= n), None)
        if at is None:
            rows.append([])
            free.append(room)
            at = len(rows) - 1
        rows[at].append(i)
        free[at] -= n
    return rows


class ChatExamples(BatchSource):
    """Encoded conversations as a :class:`~attnlm.loading.objectives.BatchSource` (see the module
    docstring); ``packed``: several conversations per row (:func:`pack`), else one."""

    def __init__(self, examples: list[Example], block_size: int, packed: bool = False) -> None:
        self.examples = examples
        self.block_size = block_size
        if packed:
            # a conversation of n tokens fills n - 1 inputs of a row
            self.rows = pack([max(len(ids) - 1, 1) for ids, _ in examples], block_size)
        else:
            self.rows = [[i] for i in range(len(examples))]

    def draw(self, n: int, generator: torch.Generator) -> Batch:
        return {"index": torch.randint(len(self.rows), (n,), generator=generator)}

    def collate(self, draw: Batch) -> Batch:
        return self._batch([self.rows[int(i)] for i in draw["index"]])

    def _batch(self, rows: list[list[int]]) -> Batch:
        pieces = [[self._piece(self.examples[i]) for i in row] for row in rows]
        T = max(sum(len(x) for x, _ in row) for row in pieces)
        x = torch.zeros(len(rows), T, dtype=torch.long)
        y = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
        seg = torch.zeros(len(rows), T, dtype=torch.long)
        for r, row in enumerate(pieces):
            at = 0
            for s, (xi, yi) in enumerate(row, start=1):
                x[r, at : at + len(xi)], y[r, at : at + len(xi)] = xi, yi
                seg[r, at : at + len(xi)] = s
                at += len(xi)
            seg[r, at:] = len(row) + 1  # the padding: a segment of its own
        batch = {"ids": x, "targets": y}
        if any(len(row) > 1 for row in rows):
            batch["segments"] = seg
        return batch

    def _piece(self, example: Example) -> tuple[torch.Tensor, torch.Tensor]:
        """A conversation's inputs and targets, cut to ``block_size`` positions."""
        ids, mask = example[0][: self.block_size + 1], example[1][: self.block_size + 1]
        t = torch.as_tensor(ids, dtype=torch.long)
        keep = torch.as_tensor(mask[1:], dtype=torch.bool)
        return t[:-1], torch.where(keep, t[1:], IGNORE_INDEX)

    def sequential(self, batch_size: int) -> Iterator[Batch]:
        for i in range(0, len(self.rows), batch_size):
            yield self._batch(self.rows[i : i + batch_size])

    def tokens_per_example(self) -> int:
        return self.block_size

    def size(self) -> int:
        """Rows in the split (the trainer evaluates a small split whole)."""
        return len(self.rows)


@dataclass
class ChatRunData:
    """The prepared conversations of a run (what :func:`prepare_chat` returns)."""

    tokenizer: Any
    train: list[Example]
    val: list[Example]
    path: Path

    def stats_line(self) -> str:
        tokens = sum(len(ids) for ids, _ in self.train + self.val)
        counted = sum(sum(m) for _, m in self.train + self.val)
        return (f"chat data: {self.path.name}: {len(self.train)} training and {len(self.val)} "
                f"validation conversations, {tokens:,} tokens ({counted:,} assistant tokens "
                "in the loss)")  # fmt: skip

    def sources(self, block_size: int) -> tuple[ChatExamples, ChatExamples]:
        """Packed training and validation sources (see the module docstring)."""
        return (ChatExamples(self.train, block_size, packed=True),
                ChatExamples(self.val, block_size, packed=True))  # fmt: skip


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
