"""The byte-level BPE merge engine: GPT-2's byte order and lowest-rank-first merging of one chunk.

Each chunk's UTF-8 bytes start as single-byte tokens; the adjacent pair whose concatenation has
the lowest rank is merged (the leftmost one on ties) until no adjacent pair is in the
vocabulary; the token id is the rank (tiktoken's ``byte_pair_merge``). Two loops give the same
parts: :func:`_merge_short` (O(n^2), fastest for chunks up to :data:`LONG_CHUNK` bytes) and
:func:`_merge_long` (O(n log n), a heap over a linked list of symbols).
:func:`recover_merges` rebuilds the merge list of a rank table (a ``.tiktoken`` file has only
ranks).

:data:`GPT2_BYTE_ORDER`: the 256 byte values in GPT-2's order (the printable bytes ``!``..``~``,
``¡``..``¬``, ``®``..``ÿ`` first, then the others in byte order), position = id of that byte's
token after training, as in the ``gpt2`` and ``cl100k`` rank files.
"""

from __future__ import annotations

import heapq
from itertools import repeat

_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
#: The 256 byte values in GPT-2 order; position = id of that single-byte token after training.
GPT2_BYTE_ORDER: list[int] = _PRINTABLE + [b for b in range(256) if b not in set(_PRINTABLE)]
_BYTE_TO_ID = bytes(GPT2_BYTE_ORDER.index(b) for b in range(256))  # bytes.translate table

#: Chunks longer than this (in bytes) are merged with the O(n log n) heap loop.
LONG_CHUNK = 64
_INF = 1 << 62
_SINGLE_BYTES = [bytes([b]) for b in range(256)]
_PAIR_SLICES = [slice(i, i + 2) for i in range(LONG_CHUNK)]


def _merge_short(piece: bytes, ranks: dict[bytes, int], max_rank: int | None = None) -> list[bytes]:
    """Lowest-rank-first merging of one chunk: keep the rank of every adjacent pair, merge the
    leftmost minimum, update its two neighbours. O(n^2) worst case, fastest for short chunks.
    With ``max_rank`` only pairs of lower rank are merged."""
    inf = _INF if max_rank is None else max_rank
    get = ranks.get
    n = len(piece)
    parts = list(map(_SINGLE_BYTES.__getitem__, piece))
    slices = _PAIR_SLICES[: n - 1] if n <= LONG_CHUNK else map(slice, range(n - 1), range(2, n + 1))
    pr = list(map(get, map(piece.__getitem__, slices), repeat(inf, n - 1)))
    while pr:
        m = min(pr)
        if m >= inf:
            break
        i = pr.index(m)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pr[i]
        if i > 0:
            pr[i - 1] = get(parts[i - 1] + parts[i], inf)
        if i < len(pr):
            pr[i] = get(parts[i] + parts[i + 1], inf)
    return parts


def _merge_long(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """The same merges as :func:`_merge_short` in O(n log n): a heap of ``(rank, left start)``
    over a linked list of symbols, stale entries skipped when popped."""
    n = len(piece)
    get = ranks.get
    end = list(range(1, n + 1))  # end[i]: end of the symbol starting at i (valid if alive)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    for i in range(n - 1):
        r = get(piece[i : i + 2])
        if r is not None:
            heap.append((r, i, i + 1, i + 2))
    heapq.heapify(heap)
    while heap:
        _, i, j, e = heapq.heappop(heap)
        if not alive[i] or nxt[i] != j or end[j] != e:
            continue
        end[i] = e
        alive[j] = False
        k = nxt[j]
        nxt[i] = k
        if k < n:
            prv[k] = i
        p = prv[i]
        if p >= 0:
            r = get(piece[p:e])
            if r is not None:
                heapq.heappush(heap, (r, p, i, e))
        if k < n:
            r = get(piece[i : end[k]])
            if r is not None:
                heapq.heappush(heap, (r, i, k, end[k]))
    out = []
    i = 0
    while i < n:
        out.append(piece[i : end[i]])
        i = nxt[i]
    return out


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list implied by a rank table: for each multi-byte token in rank order, the two
    parts that merging with only lower ranks produces. Tokens that no merge can produce
    (fewer or more than two parts remain) are skipped."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _merge_short(token, ranks, max_rank=rank)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges
