"""The JSON fields of a byte-level BPE tokenizer file (inside the attnlm tokenizer format of
:mod:`attnlm.tokenizers.base`; ``.tiktoken`` rank files: :mod:`attnlm.tokenizers.tiktoken_io`).

Fields: ``pattern`` (built-in name or regex), ``ranks`` (base64 tokens, position = id, or
``{base64: id}`` when ids have gaps), ``merges`` (``[[left id, right id], ...]`` or null),
``special_tokens`` (``{string: id}``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any


def to_fields(
    ranks: Mapping[bytes, int],
    merges: list[tuple[bytes, bytes]] | None,
    pattern: str,
    special_tokens: Mapping[str, int],
) -> dict[str, Any]:
    """The JSON fields of a tokenizer with these ranks, merges (``None``: not known), pattern
    (name or regex) and special tokens."""
    by_id = sorted(ranks.items(), key=lambda kv: kv[1])
    if all(r == k for k, (_, r) in enumerate(by_id)):
        out: Any = [base64.b64encode(t).decode("ascii") for t, _ in by_id]
    else:
        out = {base64.b64encode(t).decode("ascii"): r for t, r in by_id}
    ids = None
    if merges is not None:
        ids = [[ranks[a], ranks[b]] for a, b in merges]
    return {
        "pattern": pattern,
        "ranks": out,
        "merges": ids,
        "special_tokens": dict(special_tokens),
    }


def from_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments (``ranks``, ``pattern``, ``special_tokens``, ``merges``) of the
    fields :func:`to_fields` wrote; a malformed field raises ``KeyError``, ``TypeError``,
    ``ValueError`` (base64 included) for :func:`attnlm.tokenizers.load` to report."""
    raw = data["ranks"]
    if isinstance(raw, list):
        ranks = {base64.b64decode(t, validate=True): i for i, t in enumerate(raw)}
    elif isinstance(raw, dict):
        ranks = {base64.b64decode(t, validate=True): int(r) for t, r in raw.items()}
    else:
        raise TypeError("'ranks' must be a list or an object")
    if len(ranks) != len(raw):
        raise ValueError("duplicate tokens in 'ranks'")
    decoder = {r: t for t, r in ranks.items()}
    merges = data.get("merges")
    pairs = None
    if merges is not None:
        pairs = [(decoder[int(a)], decoder[int(b)]) for a, b in merges]
    return {
        "ranks": ranks,
        "pattern": data["pattern"],
        "special_tokens": data.get("special_tokens") or None,
        "merges": pairs,
    }
