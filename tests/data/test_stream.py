"""Streamed preparation pieces (issue 21): the split found while streaming equals
``split_index`` on the whole text, chunks reassemble the text and cut only at line starts, and
the scanned alphabet is the text's."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from attnlm.data.corpus import split_index
from attnlm.data.stream import chunks, scan_pieces, split_pieces, split_point

TEXTS = st.text(alphabet="ab \n\u00e9\t", min_size=2, max_size=300)


def _cut(text: str, sizes: list[int]) -> list[str]:
    """``text`` in pieces of the given sizes (cycled), the last one holding the rest."""
    out, pos, k = [], 0, 0
    while pos < len(text):
        n = max(1, sizes[k % len(sizes)])
        out.append(text[pos : pos + n])
        pos, k = pos + n, k + 1
    return out


@settings(max_examples=300, deadline=None)
@given(TEXTS, st.lists(st.integers(1, 40), min_size=1, max_size=5), st.sampled_from([0.1, 0.5]))
def test_streamed_split_equals_split_index(text, sizes, fraction):
    pieces = _cut(text, sizes)
    info = scan_pieces(pieces)
    assert info.chars == len(text)
    point = split_point(info, fraction, documents=False)
    parts = {0: [], 1: []}
    seen = []
    for split, piece in split_pieces(pieces, point):
        parts[split].append(piece)
        seen.append(split)
    assert seen == sorted(seen)  # training first, then validation
    cut = split_index(text, fraction)
    assert "".join(parts[0]) == text[:cut] and "".join(parts[1]) == text[cut:]


@settings(max_examples=200, deadline=None)
@given(TEXTS, st.lists(st.integers(1, 40), min_size=1, max_size=5), st.integers(1, 30))
def test_chunks_reassemble_and_cut_at_line_starts(text, sizes, chunk_chars):
    stream = [(0, p) for p in _cut(text, sizes)]
    out = list(chunks(stream, chunk_chars))
    assert "".join(c for _, c in out) == text
    for _, chunk in out[:-1]:
        # every cut is the first line start after chunk_chars characters of the chunk
        m = re.compile(r"\n(?=\S)").search(chunk + "x", chunk_chars)
        assert m is not None and m.end() == len(chunk)


def test_chunks_keep_splits_apart_and_unsafe_tokenizers_get_one_chunk():
    stream = [(0, "a\nb\nc\n"), (0, "d\ne\n"), (1, "f\ng\n")]
    assert list(chunks(stream, 2)) == [(0, "a\nb\n"), (0, "c\nd\n"), (0, "e\n"), (1, "f\ng\n")]
    assert list(chunks(stream, 2, safe=False)) == [(0, "a\nb\nc\nd\ne\n"), (1, "f\ng\n")]


def test_documents_split_by_count():
    docs = [f"doc {i}\n" for i in range(20)]
    info = scan_pieces(docs)
    point = split_point(info, 0.1, documents=True)
    val = [d for split, d in split_pieces(docs, point) if split]
    assert val == docs[18:]  # the last 10% of documents


def test_alphabet_is_the_texts_characters():
    pieces = ["abc\n", "caf\u00e9 \U0001f600", "zz\t"]
    info = scan_pieces(pieces, alphabet=True)
    assert info.alphabet == set("".join(pieces))
