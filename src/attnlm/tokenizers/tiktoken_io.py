"""Read and write tiktoken rank files (``.tiktoken``).

Format (as used by OpenAI's ``tiktoken`` for ``gpt2``/``cl100k_base``/``o200k_base``): one token
per line, ``<base64 of the token's bytes> <rank>``, in rank order. The rank is the token id and
also its merge priority (lower merges first). The file holds neither the pre-tokenization
pattern nor the special tokens; those are given separately.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from attnlm.base.fileio import atomic_write_bytes, read_file_bytes
from attnlm.base.foreign import register as _register_reader
from attnlm.tokenizers.base import MAX_VOCAB_SIZE, TokenizerFileError


def read_tiktoken(path: str | os.PathLike[str]) -> dict[bytes, int]:
    """Ranks ``{token bytes: rank}`` from a ``.tiktoken`` file; one-line errors name the line."""
    p = Path(path)
    data = read_file_bytes(p, "rank file", TokenizerFileError, text=True)
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except (ValueError, binascii.Error):
            raise TokenizerFileError(
                f"{p}:{lineno}: expected '<base64 token> <rank>', got {line[:60]!r}"
            ) from None
        if rank < 0 or not token:
            raise TokenizerFileError(f"{p}:{lineno}: empty token or negative rank")
        if rank >= MAX_VOCAB_SIZE:
            raise TokenizerFileError(
                f"{p}:{lineno}: rank {rank} out of range (token ids must be below {MAX_VOCAB_SIZE})"
            )
        if token in ranks or rank in seen:
            raise TokenizerFileError(f"{p}:{lineno}: duplicate token or rank {rank}")
        ranks[token] = rank
        seen.add(rank)
    if not ranks:
        raise TokenizerFileError(f"{p}: rank file is empty")
    return ranks


def write_tiktoken(path: str | os.PathLike[str], ranks: dict[bytes, int]) -> None:
    """Write ``{token bytes: rank}`` as a ``.tiktoken`` file (lines sorted by rank)."""
    p = Path(path)
    lines = [
        base64.b64encode(tok) + b" " + str(rank).encode()
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    atomic_write_bytes(p, b"\n".join(lines) + b"\n")  # one-line InputError on failure


_register_reader("tiktoken ranks", f"{__name__}.read_tiktoken")
