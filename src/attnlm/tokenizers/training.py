"""Incremental BPE merge learning shared by the byte-level and the classic BPE trainers.

Input is a word-frequency table: each unique pre-tokenized word as a list of symbol ids and its
count. The loop follows Sennrich et al. (2016) -- merge the most frequent adjacent pair, repeat --
but never recounts from scratch:

* ``pair_counts``: the frequency of every adjacent pair, summed over words times word counts;
* ``where``: an index from each pair to the words that contain (or once contained) it, so a
  merge only visits the words it can change;
* a lazy max-heap of ``(count, pair)``: counts only go down after a pair enters the heap, so a
  popped entry whose count is stale is pushed back with its current count and the next entry
  is tried; a popped entry whose count is current is the true maximum.

Merging a pair in a word scans it left to right and replaces non-overlapping occurrences
(``a a a`` with pair ``(a, a)`` becomes ``aa a``). The count changes follow Hugging Face
``tokenizers``' ``Word.merge`` exactly (neighbour pairs lose, new pairs with the merged symbol
gain), so with the same tie-break the merges are identical to its ``BpeTrainer``.

**Tie-break**: among pairs with equal counts the smallest ``(left id, right id)`` wins (ids of
merged symbols are their creation order), the rule of Hugging Face's trainer; or, when a
``sort_key`` is given, the smallest ``(sort_key(left), sort_key(right))``. When a merge
produces a symbol that already exists (``ab`` + ``c`` and ``a`` + ``bc``), the existing id is
reused and the merge is still recorded; only distinct symbols count towards ``vocab_size``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from typing import Any

SHIFT = 21
MASK = (1 << SHIFT) - 1
MAX_SYMBOLS = 1 << SHIFT


def _symbol_index(symbols: list[Any]) -> dict[Hashable, int]:
    """Each distinct symbol's content -> its first id."""
    index: dict[Hashable, int] = {}
    for i, s in enumerate(symbols):
        index.setdefault(s, i)
    return index


def _count_pairs(
    words: list[list[int]], counts: Sequence[int]
) -> tuple[dict[int, int], dict[int, list[int]]]:
    """``(pair_counts, where)`` of the words as they are: each adjacent pair's frequency
    (``(left << SHIFT) | right`` -> count) and the indices of the words containing it."""
    pair_counts: dict[int, int] = {}
    # pair -> indices of the words containing it (appended in word order, so a word's
    # repeated entries are adjacent and skipped; a stale entry only costs a no-op visit)
    where: dict[int, list[int]] = {}
    pc_get = pair_counts.get
    for wi, w in enumerate(words):
        n = counts[wi]
        for x, y in zip(w, w[1:]):
            p = (x << SHIFT) | y
            pair_counts[p] = pc_get(p, 0) + n
            lst = where.get(p)
            if lst is None:
                where[p] = [wi]
            elif lst[-1] != wi:
                lst.append(wi)
    return pair_counts, where


def _add_symbol(
    content: Any,
    symbols: list[Any],
    index: dict[Hashable, int],
    keys: list[Any] | None,
    sort_key: Callable[[Any], Any] | None,
) -> tuple[int, bool]:
    """``(id, new)``: the id of a merged symbol's ``content``, added (with its tie-break key)
    when it does not exist yet."""
    old = index.get(content)
    if old is not None:
        return old, False
    new = len(symbols)
    symbols.append(content)
    index[content] = new
    if keys is not None:
        keys.append(sort_key(content))  # type: ignore[misc]
    return new, True


def _move_count(
    pair_counts: dict[int, int], gained: dict[int, list[int]], old: int, new: int, n: int, wi: int
) -> None:
    """One neighbour of a merged occurrence in word ``wi`` (count ``n``): its pair ``old``
    loses the count, ``new`` (with the merged symbol) gains it and is indexed in ``gained``."""
    pair_counts[old] = pair_counts.get(old, 0) - n
    pair_counts[new] = pair_counts.get(new, 0) + n
    lst = gained.get(new)
    if lst is None:
        gained[new] = [wi]
    elif lst[-1] != wi:
        lst.append(wi)


def _merge_in_words(
    p: int,
    new: int,
    words: list[list[int]],
    counts: Sequence[int],
    where: dict[int, list[int]],
    pair_counts: dict[int, int],
) -> dict[int, list[int]]:
    """Replace the pair ``p`` by the symbol ``new`` in every word ``where`` lists for it (left
    to right, non-overlapping), moving the neighbour pairs' counts; returns the pairs with
    ``new`` that gained, each with the indices of its words (module docstring)."""
    a = p >> SHIFT
    b = p & MASK
    gained: dict[int, list[int]] = {}
    b_hi = b << SHIFT
    new_hi = new << SHIFT
    for wi in where.pop(p, ()):
        w = words[wi]
        if a not in w:
            continue
        L = len(w)
        n = counts[wi]
        out: list[int] = []
        i = 0
        while i < L:
            x = w[i]
            if x == a and i + 1 < L and w[i + 1] == b:
                if out:
                    prev = out[-1] << SHIFT
                    _move_count(pair_counts, gained, prev | a, prev | new, n, wi)
                if i + 2 < L:
                    nxt = w[i + 2]
                    _move_count(pair_counts, gained, b_hi | nxt, new_hi | nxt, n, wi)
                out.append(new)
                i += 2
            else:
                out.append(x)
                i += 1
        if len(out) != L:
            words[wi] = out
    return gained


def _index_gained(
    gained: dict[int, list[int]],
    where: dict[int, list[int]],
    pair_counts: dict[int, int],
    heap: list[tuple],
    keys: list[Any] | None,
    entry: Callable[[int, int], tuple],
) -> None:
    """After a merge: add the words of each pair that ``gained`` to ``where`` and push the
    pair on the heap with its current count (``entry`` makes a heap entry with ``keys``)."""
    heappush = heapq.heappush
    for q, ws in gained.items():
        lst = where.get(q)
        if lst is None:
            where[q] = ws
        else:
            lst += ws
        c = pair_counts[q]
        if c > 0:
            heappush(heap, (-c, q) if keys is None else entry(c, q))


def learn_merges(
    words: list[list[int]],
    counts: Sequence[int],
    symbols: list[Any],
    vocab_size: int,
    *,
    min_frequency: int = 0,
    sort_key: Callable[[Any], Any] | None = None,
) -> list[tuple[int, int, int, int]]:
    """Learn merges in place until ``vocab_size`` distinct symbols exist or no pair is left.

    ``words``: symbol ids per unique word (modified in place); ``counts``: frequency of each
    word; ``symbols``: the content (``bytes`` or ``str``) of ids ``0..len-1``, extended in
    place with each new symbol (``symbols[a] + symbols[b]``); every distinct entry counts
    towards ``vocab_size``. ``sort_key`` maps a symbol's content to its tie-break key
    (default: ties go to the smallest id pair). Returns ``[(left id, right id, merged id,
    count), ...]`` in order, ``count`` being the pair's frequency when it was merged.
    """
    if vocab_size > MAX_SYMBOLS:
        raise ValueError(f"vocab_size {vocab_size} above the supported maximum {MAX_SYMBOLS}")
    index = _symbol_index(symbols)
    n_distinct = len(index)
    pair_counts, where = _count_pairs(words, counts)

    keys: list[Any] | None = None
    if sort_key is not None:
        keys = [sort_key(s) for s in symbols]

    def entry(c: int, p: int) -> tuple:
        if keys is None:
            return (-c, p)
        return (-c, keys[p >> SHIFT], keys[p & MASK], p)

    heap = [entry(c, p) for p, c in pair_counts.items() if c > 0]
    heapq.heapify(heap)
    heappush, heappop = heapq.heappush, heapq.heappop
    merges: list[tuple[int, int, int, int]] = []

    while n_distinct < vocab_size and heap:
        top = heappop(heap)
        p = top[-1]
        c = pair_counts[p]
        if c != -top[0]:
            if c > 0:
                heappush(heap, (-c, p) if keys is None else entry(c, p))
            continue
        if c < 1 or c < min_frequency:
            break
        a = p >> SHIFT
        b = p & MASK
        new, added = _add_symbol(symbols[a] + symbols[b], symbols, index, keys, sort_key)
        n_distinct += added
        merges.append((a, b, new, c))
        gained = _merge_in_words(p, new, words, counts, where, pair_counts)
        pair_counts[p] = 0
        _index_gained(gained, where, pair_counts, heap, keys, entry)
    return merges
