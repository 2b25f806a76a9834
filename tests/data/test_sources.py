"""Corpus formats (issue 21): every format reads as the same text as a ``.txt`` file of the
same documents; bad records stop with one line naming the file and line (or row), or are
skipped and counted under ``--skip-bad``."""

from __future__ import annotations

import gzip
import json

import pytest

from attnlm.base.errors import InputError
from attnlm.data.corpus import read_text
from attnlm.data.sources import open_corpus

DOCS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "All:\nSpeak, speak.\n",
    "",  # an empty document adds nothing
    "caf\u00e9 \u4e2d\u6587 \U0001f600\n\n  indented\tline",
    '{"looks": "like json"}\n',
]
EXPECTED = "".join(d if d.endswith("\n") else d + "\n" for d in DOCS if d)


def _jsonl(docs, field="text") -> bytes:
    return "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def write(folder, name, docs=DOCS):
    path = folder / name
    if name.endswith(".jsonl"):
        path.write_bytes(_jsonl(docs))
    elif name.endswith(".jsonl.gz"):
        path.write_bytes(gzip.compress(_jsonl(docs)))
    elif name.endswith(".jsonl.zst"):
        zstandard = pytest.importorskip("zstandard")
        path.write_bytes(zstandard.ZstdCompressor().compress(_jsonl(docs)))
    elif name.endswith(".parquet"):
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path,
                       row_group_size=2)  # fmt: skip
    return path


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.parquet"])
def test_each_format_reads_as_the_text_file(tmp_path, name):
    txt = tmp_path / "c.txt"
    txt.write_text(EXPECTED, encoding="utf-8")
    assert read_text(write(tmp_path, name)) == read_text(txt) == EXPECTED


def test_folder_of_documents_in_sorted_order(tmp_path):
    folder = tmp_path / "shards"
    (folder / "b").mkdir(parents=True)
    write(folder, "a.parquet", DOCS[:2])
    write(folder / "b", "x.jsonl.gz", DOCS[2:4])
    write(folder, "c.jsonl", DOCS[4:])
    (folder / "README.md").write_text("not read")
    corpus = open_corpus(folder)
    assert [f.name for f in corpus.files] == ["a.parquet", "x.jsonl.gz", "c.jsonl"]
    assert read_text(folder) == EXPECTED


def test_datasets_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
    assert read_text(tmp_path / "ds") == EXPECTED
    dd = datasets.DatasetDict({"train": ds, "test": ds})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match="DatasetDict; give one split's folder"):
        open_corpus(tmp_path / "dd")
    assert read_text(tmp_path / "dd" / "train") == EXPECTED


def test_text_field_option(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(_jsonl(DOCS, field="content"))
    assert read_text(path, text_field="content") == EXPECTED
    with pytest.raises(InputError, match=r"c\.jsonl:1: no field 'text' \(fields: content, id\)"):
        read_text(path)


BAD_LINES = [
    (b'{"text": "ok"}\nnot json\n', r"c\.jsonl:2: not JSON"),
    (b'{"text": "ok"}\n\n{"body": "x"}\n', r"c\.jsonl:3: no field 'text'"),
    (b'{"text": 5}\n', r"c\.jsonl:1: field 'text' is int, not a string"),
    (b'["text"]\n', r"c\.jsonl:1: expected a JSON object, got list"),
    (b'{"text": "ok"}\n{"text": "\xff"}\n', r"c\.jsonl:2: not valid UTF-8"),
]


@pytest.mark.parametrize("data,message", BAD_LINES)
def test_bad_records_name_file_and_line(tmp_path, data, message):
    path = tmp_path / "c.jsonl"
    path.write_bytes(data)
    with pytest.raises(InputError, match=message):
        read_text(path)
    corpus = open_corpus(path, skip_bad=True)
    kept = "".join(corpus.pieces())
    assert corpus.bad.count == 1 and kept in ("ok\n", "")
    assert corpus.bad.first and "c.jsonl:" in corpus.bad.first


def test_bad_parquet_rows_and_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", None, "b"]}), tmp_path / "n.parquet")
    with pytest.raises(InputError, match=r"n\.parquet: row 2: field 'text' is null"):
        read_text(tmp_path / "n.parquet")
    corpus = open_corpus(tmp_path / "n.parquet", skip_bad=True)
    assert "".join(corpus.pieces()) == "a\nb\n" and corpus.bad.count == 1
    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "m.parquet")
    with pytest.raises(InputError, match=r"m\.parquet: no column 'text' \(columns: body\)"):
        read_text(tmp_path / "m.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "i.parquet")
    with pytest.raises(InputError, match="column 'text' is int64, not a string column"):
        read_text(tmp_path / "i.parquet")


def test_corrupt_compressed_file_and_mixed_folder(tmp_path):
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(_jsonl(DOCS))[:-20])
    with pytest.raises(InputError, match=r"t\.jsonl\.gz: cannot decompress"):
        read_text(tmp_path / "t.jsonl.gz")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("x\n")
    write(mixed, "b.jsonl")
    with pytest.raises(InputError, match="mixes text files and document files"):
        open_corpus(mixed)


def test_cli_reports_a_bad_record_in_one_line(tmp_path, cli):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"text": "a line\\n"}\n' * 30 + b"oops\n")
    r = cli("data", "prepare", "--text", path, "--out", tmp_path / "p", "--no-progress")
    assert r.code == 2 and r.err.count("\n") == 1 and "c.jsonl:31: not JSON" in r.err
    r = cli("data", "prepare", "--text", path, "--out", tmp_path / "p", "--skip-bad",
            "--no-progress")  # fmt: skip
    assert r.code == 0 and "skipped 1 bad record(s) (first:" in r.out
