"""BERT's model input from token ids, as ``BertTokenizerFast`` builds it (Hugging Face
``tokenizers``' ``BertProcessing`` template, ``TruncationStrategy::LongestFirst`` and right
padding).

* :func:`model_input`: ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with token-type ids (0 for
  A and its separators, 1 for B and its final ``[SEP]``) and an attention mask of ones; three
  lists of the same length T.
* :func:`truncate_longest_first`: cut A (and B) so that the row fits ``max_length`` with its
  special tokens.
* :func:`pad_rows`: B rows right-padded with ``[PAD]`` (type 0, mask 0) to one length T;
  ``torch.tensor`` turns each key into a ``(B, T)`` tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnlm.base.errors import InputError

MODEL_INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def model_input(
    a: list[int], b: list[int] | None, cls_id: int, sep_id: int
) -> dict[str, list[int]]:
    """``{"input_ids", "token_type_ids", "attention_mask"}`` of the ids ``a`` (and ``b``)."""
    ids = [cls_id, *a, sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += b
        ids.append(sep_id)
        types += [1] * (len(b) + 1)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids)}


def truncate_longest_first(
    a: list[int], b: list[int] | None, max_length: int
) -> tuple[list[int], list[int] | None]:
    """Longest-first truncation of ``tokenizers`` (``TruncationStrategy::LongestFirst``): the
    longer side loses tokens from its end; when both are too long each keeps half."""
    n_special = 2 if b is None else 3
    room = max_length - n_special
    if room < 0:
        raise InputError(
            f"max_length {max_length} leaves no room next to the {n_special} special tokens"
        )
    if b is None:
        return a[:room], None
    if len(a) + len(b) <= room:
        return a, b
    n1, n2 = len(a), len(b)
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > room else max(n1, room - n1)
    if n1 + n2 > room:
        n1 = room // 2
        n2 = n1 + room % 2
    if swap:
        n1, n2 = n2, n1
    return a[:n1], b[:n2]


def pad_rows(
    rows: Sequence[dict[str, list[int]]], pad_id: int, pad_to: int | None = None
) -> dict[str, list[list[int]]]:
    """:func:`model_input` rows right-padded to the longest row, or to ``pad_to`` when given
    (``padding="max_length"``): lists of B rows of equal length T."""
    width = max((len(r["input_ids"]) for r in rows), default=0)
    if pad_to is not None:
        if pad_to < width:
            raise InputError(f"pad_to {pad_to} is shorter than the longest row ({width})")
        width = pad_to
    out: dict[str, list[list[int]]] = {k: [] for k in MODEL_INPUT_KEYS}
    for r in rows:
        n = width - len(r["input_ids"])
        out["input_ids"].append(r["input_ids"] + [pad_id] * n)
        out["token_type_ids"].append(r["token_type_ids"] + [0] * n)
        out["attention_mask"].append(r["attention_mask"] + [0] * n)
    return out
