"""The one-read preparation's pieces (:mod:`attnlm.data.text_ranges`): the byte ranges
reassemble the corpus text exactly as :class:`~attnlm.data.sources.Corpus` reads it and are cut
only at line starts (``\\n`` then a character that is not a space), the SHA-256 digests taken
while reading equal hashing each file alone, and the split placed afterwards from the ranges'
character counts equals :func:`attnlm.data.corpus.split_index` on the whole text (non-ASCII,
CRLF, Unicode spaces after a line break, byte-order marks, no final line break, lines longer
than a range, several files)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attnlm.base.errors import InputError
from attnlm.data.corpus import split_index
from attnlm.data.sources import open_corpus
from attnlm.data.text_ranges import read_chunk, split_position, text_chunks
from attnlm.train.data import file_fingerprint

# line breaks (LF, CRLF), ASCII and Unicode spaces (NBSP, NEL, U+3000, \x1c), 2-, 3- and
# 4-byte characters: a cut must see whole characters, also where a block ends inside one
ALPHABET = "ab \n\r\t\u00e9\u00a0\u0085\u3000\x1c\u4e2d\U0001f600"
TEXTS = st.text(alphabet=ALPHABET, max_size=200)
BOM = "\ufeff"


def _write(folder: Path, texts: list[str], bom: bool) -> list[Path]:
    paths = []
    for i, text in enumerate(texts):
        path = folder / f"{i:02d}.txt"
        path.write_bytes(((BOM if bom and i == 0 else "") + text).encode("utf-8"))
        paths.append(path)
    return paths


def _ranges(texts: list[str], bom: bool, chunk_bytes: int, block_bytes: int):
    """(corpus text as Corpus reads it, ranges, digests, files) of ``texts`` written as files."""
    folder = Path(tempfile.mkdtemp(prefix="ranges-"))
    paths = _write(folder, texts, bom)
    corpus = open_corpus(folder if len(paths) > 1 else paths[0])
    whole = "".join(corpus.pieces())
    digests: list[str] = []
    ranges = list(text_chunks(corpus.files, chunk_bytes, digests=digests, block_bytes=block_bytes))
    return whole, ranges, digests, corpus.files


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=3), st.booleans(), st.integers(1, 40),
       st.integers(1, 9))  # fmt: skip
@example(["a\n\u00a0b\n\u3000c\nd\n"], False, 1, 1)  # Unicode spaces after a break: no cut
@example(["x\r\ny\r\n", "no final break", "\n\n  z"], True, 1, 2)
def test_ranges_reassemble_the_corpus_and_cut_at_line_starts(texts, bom, chunk_bytes, block):
    whole, ranges, digests, files = _ranges(texts, bom, chunk_bytes, block)
    parts = [read_chunk(r) for r in ranges]
    assert "".join(parts) == whole
    pos = 0
    for part in parts[:-1]:
        pos += len(part)
        assert whole[pos - 1] == "\n" and not whole[pos].isspace()  # a line start
    assert digests == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]


def test_ranges_are_about_the_size_asked_the_digests_and_progress_the_files(tmp_path):
    path = tmp_path / "c.txt"
    text = "".join(f"line {i} caf\u00e9\n" for i in range(20_000))
    path.write_text(text, encoding="utf-8")
    digests: list[str] = []
    read: list[int] = []  # what the progress bar is told
    ranges = list(text_chunks([path], 10_000, read.append, digests, block_bytes=4096))
    sizes = [seg.end - seg.start for (seg,) in ranges]
    assert all(10_000 <= s < 10_000 + 40 for s in sizes[:-1])  # the first line start after
    assert digests == [file_fingerprint(path)["sha256"]]
    assert sum(read) == path.stat().st_size and max(read) == 4096


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, min_size=1, max_size=200), st.integers(1, 40),
       st.sampled_from([0.1, 0.5, 0.9]))  # fmt: skip
@example("a" * 100 + "\n" + "b" * 100, 10, 0.1)  # lines longer than a range
@example("one\r\ntwo\r\nthree", 1, 0.5)  # CRLF, no final line break
@example("caf\u00e9\ncaf\u00e9\ncaf\u00e9\n", 3, 0.1)  # the cut in the last line: not moved
def test_split_position_equals_split_index(text, chunk_bytes, fraction):
    whole, ranges, _, _ = _ranges([text], False, chunk_bytes, 7)
    chars = [len(read_chunk(r)) for r in ranges]
    cut = int(len(whole) * (1 - fraction))
    if cut >= len(whole):
        with pytest.raises(InputError, match="too short to hold out a validation split"):
            split_position(chars, fraction, lambda k: read_chunk(ranges[k]))
        return
    k, part, j = split_position(chars, fraction, lambda k: read_chunk(ranges[k]))
    assert part == read_chunk(ranges[k])
    assert sum(chars[:k]) + j == split_index(whole, fraction)


def test_a_bad_byte_is_named_with_its_line_in_a_later_range(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)) + b"caf\xe9\n")
    ranges = list(text_chunks([path], 100))
    assert len(ranges) > 10
    with pytest.raises(InputError, match=r"c\.txt:1001: not valid UTF-8 \(bad byte 0xe9"):
        read_chunk(ranges[-1])
