"""Bounded-memory counting and estimation (``attnlm ngram train --memory``) against the
in-memory path: the same ARPA bytes with a cap so small that many shards spill; the disk
primitives against numpy; temporary files removed, also on error."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from attnlm.base.errors import ConfigError, InputError
from attnlm.ngram import DiscountWarning, split_sentences, train, write_arpa
from attnlm.ngram.bounded import parse_memory, train_arpa
from attnlm.ngram.disk import Column, DenseWriter, ExternalSort, SortedLookup, gather_sorted
from support import FIXTURES

pytestmark = pytest.mark.filterwarnings("ignore::attnlm.ngram.DiscountWarning")


@pytest.fixture(scope="module")
def text() -> str:
    lines = (FIXTURES / "ngram" / "train.txt").read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[:600]) + "\n"


def in_memory(text: str, order: int, path, pad: str = "kenlm") -> bytes:
    write_arpa(train(split_sentences(text), order, pad=pad), path)
    return path.read_bytes()


@pytest.mark.parametrize(("order", "pad"), [(1, "kenlm"), (2, "kenlm"), (3, "nltk"), (5, "kenlm")])
def test_bounded_arpa_is_the_in_memory_arpa(text, tmp_path, order, pad):
    spill = tmp_path / "spill"
    spill.mkdir()
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    r = train_arpa(tmp_path / "c.txt", order, tmp_path / "b.arpa", "320K", pad=pad, tmp_dir=spill)
    assert r.shards >= 5  # the cap really spilled shards (and merged them)
    assert (tmp_path / "b.arpa").read_bytes() == in_memory(text, order, tmp_path / "a.arpa", pad)
    assert list(spill.iterdir()) == []  # temporary files removed


def test_bounded_gzip_and_chunks(text, tmp_path):
    lines = text.splitlines(keepends=True)
    chunks = ["".join(lines[i : i + 50]) for i in range(0, len(lines), 50)]
    r = train_arpa(chunks, 3, tmp_path / "b.arpa.gz", "1G")
    expected = in_memory(text, 3, tmp_path / "a.arpa")
    assert gzip.decompress((tmp_path / "b.arpa.gz").read_bytes()) == expected
    assert r.sizes == [int(line.split("=")[1]) for line in expected.decode().splitlines()[1:4]]


def test_bounded_discounts_warn_as_in_memory(tmp_path):
    (tmp_path / "t.txt").write_text("a b c\nb c d a\n")
    with pytest.warns(DiscountWarning):
        r = train_arpa(tmp_path / "t.txt", 3, tmp_path / "b.arpa", "2K")
    assert r.discounts == [(0.5, 1.0, 1.5)] * 3


def test_error_mid_way_leaves_no_files(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    (tmp_path / "t.txt").write_text("a b c\n" * 2000 + "x <s> y\n")  # refused in a late chunk
    (tmp_path / "b.arpa").write_text("old")
    with pytest.raises(InputError, match="<s> or </s>"):
        train_arpa(tmp_path / "t.txt", 3, tmp_path / "b.arpa", "2K", tmp_dir=spill)
    assert list(spill.iterdir()) == []
    assert (tmp_path / "b.arpa").read_text() == "old"  # the output is written atomically


def test_bounded_rejects_bad_input(tmp_path):
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(InputError, match="no tokens"):
        train_arpa(tmp_path / "blank.txt", 3, tmp_path / "b.arpa", "1M")
    (tmp_path / "bad.txt").write_bytes(b"ok line\nbad \xff byte\n")
    with pytest.raises(InputError, match=r"bad.txt:2: not valid UTF-8"):
        train_arpa(tmp_path / "bad.txt", 3, tmp_path / "b.arpa", "1M")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2G", 2 << 30), ("512M", 512 << 20), ("100K", 102400), ("1.5g", 3 << 29), ("4096", 4096),
     ("2GiB", 2 << 30), (8192, 8192)],
)  # fmt: skip
def test_parse_memory(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["2X", "", "-1G", "G", "1e9", "10"])
def test_parse_memory_refuses(value):
    with pytest.raises(ConfigError):
        parse_memory(value)


def test_cli_memory(cli, tmp_path, text):
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "b.arpa"
    r = cli("ngram", "train", "-o", "4", "--text", str(tmp_path / "c.txt"), "--arpa", str(out),
            "--memory", "320K", "--progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "shard" in r.err and "estimate" in r.err and "n-gram/s" in r.err
    assert out.read_bytes() == in_memory(text, 4, tmp_path / "a.arpa")
    for bad in (["--memory", "lots"], ["--memory", "1G", "--out", str(tmp_path / "m.npz")],
                ["--memory", "1G", "--smoothing", "mle"]):  # fmt: skip
        r = cli("ngram", "train", "-o", "3", "--text", str(tmp_path / "c.txt"), "--arpa",
                str(out), *bad)  # fmt: skip
        assert r.code == 2 and r.err.count("\n") == 1, r.err


# -- the disk primitives against numpy ------------------------------------------------------


def test_external_sort_and_lookups(tmp_path):
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 5000, 20_000)
    payload = rng.random(20_000)
    sorter = ExternalSort(tmp_path, "t", [np.float64], run_size=1500)
    for lo in range(0, len(keys), 700):
        sorter.add(keys[lo : lo + 700], payload[lo : lo + 700])
    got = [np.concatenate(c) for c in zip(*sorter.merged(999))]
    assert len(sorter.runs) >= 10
    np.testing.assert_array_equal(got[0], np.sort(keys))
    # every row kept with its payload (ties in any order)
    assert sorted(zip(got[0], got[1])) == sorted(zip(keys, payload))
    sorter.delete()
    assert list(tmp_path.iterdir()) == []

    col = Column(tmp_path / "c", np.int64)
    table = np.unique(keys) * 3
    for lo in range(0, len(table), 400):
        col.append(table[lo : lo + 400])
    idx = np.sort(rng.integers(0, len(table), 3000))
    np.testing.assert_array_equal(gather_sorted(col, idx, 37), table[idx])
    find = SortedLookup(col, 50)
    q = table[idx]
    np.testing.assert_array_equal(np.concatenate([find(q[:1000]), find(q[1000:])]),
                                  np.searchsorted(table, q))  # fmt: skip
    with pytest.raises(RuntimeError):
        find(np.array([table[-1] + 1]))

    dense = DenseWriter(Column(tmp_path / "d", np.int64))
    dense.add(np.array([2, 5]), np.array([1, 1]))
    dense.add(np.array([5, 9]), np.array([2, 3]))
    np.testing.assert_array_equal(dense.finish(12).read(), [0, 0, 1, 0, 0, 3, 0, 0, 0, 3, 0, 0])
