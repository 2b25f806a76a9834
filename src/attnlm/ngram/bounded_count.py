"""Counting a corpus larger than memory (the first half of :mod:`attnlm.ngram.bounded`): the
corpus is read in chunks, each chunk's n-grams are counted and spilled to a temporary folder
as a sorted shard, and the shards are merged order by order (a k-way merge).

Counting a shard is the in-memory counter (:func:`attnlm.ngram.counts.count_positions`) on one
chunk: its order-k table holds sorted keys ``local prefix id * V_s + word`` (``V_s``: the
vocabulary size when the shard was counted; word ids are global, in order of first appearance,
as in memory). Merging order k turns every shard key into the global key ``global prefix id *
V + word`` through the shard's map of order k-1 (local id -> global id, written when order k-1
was merged; increasing, so the shard stays sorted), merges the shards and adds the counts of
equal keys. The merged tables are the in-memory ``NgramCounts.keys`` / ``counts``, on disk.

Memory: ``memory`` bytes bound the arrays (chunks, blocks, sort runs: about 1/80 of it of text
per shard, 1/128 of it in entries per block); the vocabulary (a dict and a few arrays of V
entries) is held in memory as KenLM does.

Shape legend: V = vocabulary size, n_k = distinct order-k n-grams, b = entries of a block.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.textio import decode_text
from attnlm.base.validate import memory_size
from attnlm.ngram.counts import (
    Vocabulary,
    check_markers,
    count_positions,
    encode_ids,
    encode_new_words,
    split_sentences,
    unique_inverse,
    word_index,
)
from attnlm.ngram.disk import Column, gather_sorted, merge_rounds
from attnlm.ngram.progress import progress_bar

MIN_MEMORY = 1 << 10
_MARKER = np.ones(1, dtype=np.int64)  # a word id that check_markers refuses (<s>)


def parse_memory(value: str | int, name: str | None = None) -> int:
    """Bytes of a memory size: an integer, or a number with a K, M, G or T suffix (powers of
    1024: ``2G``, ``512M``, ``1.5G``; ``B`` / ``iB`` after it allowed). From 1K to 1P
    (:func:`attnlm.base.validate.memory_size`)."""
    return memory_size(value, name or "memory", lo=MIN_MEMORY)


@dataclass(frozen=True)
class Budget:
    """Sizes derived from the memory cap (bytes)."""

    memory: int

    @property
    def text_bytes(self) -> int:
        """Corpus bytes counted into one shard."""
        return max(self.memory // 80, 64)

    @property
    def block(self) -> int:
        """Entries per streamed block, rows per sort run."""
        return max(self.memory // 128, 64)


def read_chunks(path: str | os.PathLike[str] | None, chunk_bytes: int) -> Iterator[str]:
    """The text of a file (or of every ``*.txt`` file of a folder, sorted; None: the built-in
    corpus) in chunks of about ``chunk_bytes`` that end at a line end, checked as
    :mod:`attnlm.base.textio` checks a whole file."""
    if path is None:
        from attnlm.data.corpus import default_corpus_path

        files = [default_corpus_path()]
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise InputError(f"{p}: no such file or folder")
        files = sorted(f for f in p.rglob("*.txt") if f.is_file()) if p.is_dir() else [p]
        if not files:
            raise InputError(f"{p}: folder contains no .txt files")
    for f in files:
        yield from _file_chunks(f, chunk_bytes)


def _file_chunks(path: Path, chunk_bytes: int) -> Iterator[str]:
    try:
        src = open(path, "rb")  # noqa: SIM115 - closed below
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read file ({e.strerror or e})") from None
    with src:
        rest, line, offset = b"", 1, 0
        while True:
            data = src.read(chunk_bytes)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # no line end yet: read on (decode_text bounds a line's length)
                rest = data
                if len(rest) > (4 << 20):
                    decode_text(rest, str(path), first_line=line, first_offset=offset)
                continue
            piece, rest = data[:cut], data[cut:]
            yield decode_text(piece, str(path), empty_ok=True, first_line=line, first_offset=offset)
            line += piece.count(b"\n")
            offset += len(piece)
        if rest:
            yield decode_text(rest, str(path), empty_ok=True, first_line=line, first_offset=offset)


@dataclass
class Shard:
    """One chunk's n-gram tables on disk: per order k >= 2 (index k-2) sorted keys and counts;
    ``maps`` (filled while merging): global id of each entry."""

    V: int
    keys: list[Column]
    counts: list[Column]
    maps: list[Column] = field(default_factory=list)


@dataclass
class Counted:
    """Every n-gram of the corpus: the vocabulary and unigram counts in memory, the tables of
    orders 2.. on disk (``keys[k-2]``, ``counts[k-2]``: the in-memory ``NgramCounts``)."""

    vocab: Vocabulary
    unigrams: np.ndarray
    keys: list[Column]
    counts: list[Column]
    sentences: int
    shards: int


def count_streamed(
    chunks: Iterable[str],
    order: int,
    pad: str,
    tokenize: bool,
    folder: Path,
    budget: Budget,
    progress: bool = False,
) -> Counted:
    """Count every chunk into a shard, then merge the shards order by order."""
    index = word_index()
    unigrams = np.zeros(3, dtype=np.int64)
    shards: list[Shard] = []
    sentences = 0
    marker = False
    with progress_bar(None, "count", progress) as bar:
        for text in chunks:
            sents = split_sentences(text, tokenize)
            if not sents:
                continue
            words, lengths = encode_new_words(index, sents)
            marker = marker or bool(np.any((words == 1) | (words == 2)))
            if marker:  # refused as soon as the text has a word besides the markers
                check_markers(index, _MARKER)
            del sents
            V_s = len(index)
            enc = encode_ids(words, lengths, order, pad, 1, 2)
            keys, counts, _, _ = count_positions(enc.tokens, enc.pos, order, V_s)
            unigrams = np.concatenate((unigrams, np.zeros(V_s - len(unigrams), np.int64)))
            unigrams += counts[0]
            s = len(shards)
            shard = Shard(V_s, [], [])
            for k in range(2, order + 1):
                for cols, values, kind in (
                    (shard.keys, keys, "key"),
                    (shard.counts, counts, "cnt"),
                ):
                    col = Column(folder / f"shard{s}.{kind}{k}", np.int64)
                    col.append(values[k - 1])
                    col.close()
                    cols.append(col)
            shards.append(shard)
            sentences += len(lengths)
            bar.update(int(enc.predict.sum()) * order)
            bar.set_postfix_str(f"{len(shards)} shards, {len(index):,} words")
    if sentences == 0:
        raise InputError("no tokens to count (every line is blank)")
    if marker:
        check_markers(index, _MARKER)
    vocab = Vocabulary(list(index))
    V = len(vocab)
    out_keys, out_counts = [], []
    with progress_bar(sum(c.n for s in shards for c in s.keys), "merge", progress) as bar:
        for k in range(2, order + 1):
            key, cnt = _merge_order(k, order, shards, V, folder, budget, bar)
            out_keys.append(key)
            out_counts.append(cnt)
    return Counted(vocab, unigrams, out_keys, out_counts, sentences, len(shards))


def _merge_order(
    k: int, order: int, shards: list[Shard], V: int, folder: Path, budget: Budget, bar
) -> tuple[Column, Column]:
    """Merge the shards' order-k tables into the global sorted keys and summed counts."""
    per = max(budget.block // (2 * len(shards)), 1)

    def source(shard: Shard) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for key, cnt in zip(shard.keys[k - 2].blocks(per), shard.counts[k - 2].blocks(per)):
            prefix, word = np.divmod(key, shard.V)
            if k > 2:  # local id of the order-(k-1) prefix -> global id
                prefix = gather_sorted(shard.maps[k - 3], prefix, per)
            yield prefix * V + word, cnt

    keys = Column(folder / f"keys{k}", np.int64)
    counts = Column(folder / f"counts{k}", np.int64)
    maps = [Column(folder / f"shard{s}.map{k}", np.int64) for s in range(len(shards))]
    base = 0
    for parts in merge_rounds([source(s) for s in shards]):
        cat = np.concatenate([p[0] for _, p in parts])
        uniq, inverse = unique_inverse(cat)
        total = np.bincount(inverse, weights=np.concatenate([p[1] for _, p in parts]))
        keys.append(uniq)
        counts.append(total.astype(np.int64))
        if k < order:
            at = 0
            for s, (part_keys, _) in parts:
                maps[s].append(base + inverse[at : at + len(part_keys)])
                at += len(part_keys)
        base += len(uniq)
        bar.update(len(cat))
    for s, shard in enumerate(shards):
        shard.keys[k - 2].delete()
        shard.counts[k - 2].delete()
        if k > 2:
            shard.maps[k - 3].delete()
        if k < order:
            maps[s].close()
            shard.maps.append(maps[s])
    keys.close()
    counts.close()
    return keys, counts
