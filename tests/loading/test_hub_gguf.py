"""GGUF files of a Hugging Face Hub repository, named as llama.cpp's ``-hf`` names them
(``org/name:QUANT``; ``org/name`` alone: ``Q4_K_M``): read from a cache laid out as
``huggingface_hub`` lays it out (``HF_HUB_OFFLINE=1``, never the network), and, for the online
path, from ``huggingface_hub``'s own listing and download functions replaced by ones serving
a local folder (what attnlm asks for is checked: one file, into the cache folder).

The repository holds two of the llama.cpp fixtures (``tests/fixtures/gguf_arch``: qwen2 in
Q4_K_M and Q3_K_M) under the names a GGUF repository gives them and a vision projector that is
never picked; the choice among a listing's files (several matches, split files, no GGUF file)
is tested on lists of names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_model_sources import write_hub_cache

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.loading.hub import pick_gguf, quant_of
from attnlm.loading.sources import gguf_file, looks_like_path, resolve
from attnlm.runtime.engine_gguf import open_engine
from support import attnlm_process

pytest.importorskip("huggingface_hub")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
REPO = "someorg/Tiny-Qwen2-GGUF"
FILES = {"tiny-qwen2-Q4_K_M.gguf": "qwen2-Q4_K_M.gguf",
         "tiny-qwen2-q3_k_m.gguf": "qwen2-Q3_K_M.gguf",
         "mmproj-tiny-qwen2-Q4_K_M.gguf": "qwen2-Q8_0.gguf"}  # fmt: skip


@pytest.fixture()
def repo_folder(tmp_path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    for name, fixture in FILES.items():
        shutil.copyfile(FIXTURES / fixture, folder / name)
    (folder / "README.md").write_text("tiny GGUF files\n")
    return folder


@pytest.fixture()
def offline_cache(repo_folder, tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    snap = write_hub_cache(cache, REPO, repo_folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snap


def _logits(engine, ids: list[int]) -> np.ndarray:
    engine.reset(1)
    return engine.feed(np.asarray([ids]))[0]


@pytest.mark.parametrize(("spec", "fixture"), [
    (f"{REPO}:Q3_K_M", "qwen2-Q3_K_M.gguf"),  # the name says q3_k_m: any case
    (f"{REPO}:q4_k_m", "qwen2-Q4_K_M.gguf"),
    (REPO, "qwen2-Q4_K_M.gguf"),  # no config.json, GGUF files: Q4_K_M
    (f"{REPO}:tiny-qwen2-q3_k_m.gguf", "qwen2-Q3_K_M.gguf"),  # a file by its name
])  # fmt: skip
def test_a_hub_gguf_file_from_the_cache_runs_on_the_engine(offline_cache, spec, fixture):
    found = resolve(spec, engine_ok=True, threads=1)
    assert found.info.kind == "hub" and found.info.name == spec
    assert found.info.details["backend"] == "c-engine"
    assert found.info.path.parent == offline_cache
    assert found.info.path.resolve().read_bytes() == (FIXTURES / fixture).read_bytes()
    doc = json.loads((FIXTURES / "llamacpp.json").read_text(encoding="utf-8"))
    prompt = doc["archs"]["qwen2"][fixture.removeprefix("qwen2-").removesuffix(".gguf")]["prompt"]
    direct = open_engine(GGUFFile(FIXTURES / fixture), None, 1)
    assert np.array_equal(_logits(found.model, prompt), _logits(direct, prompt))
    assert gguf_file(spec, lookup=True) == found.info.path
    if ":" not in spec:  # a plain Hub id is looked up only by a caller that loads it
        assert gguf_file(spec) is None


def test_models_available_lists_each_cached_gguf_file(offline_cache):
    """A row per cached GGUF file (not the vision projector), named as ``--model`` takes it."""
    from attnlm.loading.sources import available

    rows = {r["name"]: r for r in available() if r["name"].startswith(REPO)}
    assert sorted(rows) == [f"{REPO}:Q3_K_M", f"{REPO}:Q4_K_M"]
    for name, row in rows.items():
        assert row["cached"] and row["size"] == Path(row["path"]).stat().st_size
        assert resolve(name, engine_ok=True, threads=1).info.path == Path(row["path"])


def test_a_hub_gguf_file_loads_on_the_pytorch_path(offline_cache):
    model, tok, info = resolve(f"{REPO}:Q3_K_M", weights="f32")
    assert info.kind == "hub" and info.path.name == "tiny-qwen2-q3_k_m.gguf"
    assert tok.encode("A small model") and model.config.arch == "qwen2"


def test_bad_quants_and_missing_repos_are_one_line(offline_cache):
    cases = {
        f"{REPO}:Q8_0": "no GGUF file for 'Q8_0' (it has: Q3_K_M, Q4_K_M)",
        f"{REPO}:Q4_K": "no GGUF file for 'Q4_K'",  # Q4_K is not Q4_K_M
        "someorg/missing-GGUF:Q4_K_M": "no GGUF file of it in the Hugging Face cache",
    }
    for spec, message in cases.items():
        with pytest.raises(InputError) as e:
            resolve(spec, engine_ok=True)
        assert message in str(e.value) and "\n" not in str(e.value), spec


def test_the_choice_of_file():
    files = ["a/x-Q4_K_M.gguf", "x-IQ4_XS.gguf", "x-Q4_K_S.gguf", "mmproj-x-f16.gguf",
             "README.md"]  # fmt: skip
    assert pick_gguf("o/r", files, "iq4_xs") == "x-IQ4_XS.gguf"
    assert pick_gguf("o/r", files, None) == "a/x-Q4_K_M.gguf"
    assert pick_gguf("o/r", ["only-Q8_0.gguf"], None) == "only-Q8_0.gguf"
    with pytest.raises(InputError, match=r"none is Q4_K_M; .* \(it has: IQ4_XS, Q4_K_S\)"):
        pick_gguf("o/r", ["x-IQ4_XS.gguf", "x-Q4_K_S.gguf"], None)
    with pytest.raises(InputError, match="Q4_K_M' names several files"):
        pick_gguf("o/r", ["a/x-Q4_K_M.gguf", "b/y-Q4_K_M.gguf"], "Q4_K_M")
    split = ["x-Q8_0-00001-of-00002.gguf", "x-Q8_0-00002-of-00002.gguf"]
    with pytest.raises(InputError, match="one of 2 parts of a split GGUF file"):
        pick_gguf("o/r", split, "Q8_0")
    with pytest.raises(InputError, match="has no .gguf file"):
        pick_gguf("o/r", ["config.json"], None)
    assert [quant_of(f) for f in ("m-Q4_K_M.gguf", "m.bf16.gguf", split[0], "m.gguf")] == [
        "Q4_K_M", "BF16", "Q8_0", "m.gguf"]  # fmt: skip
    assert not looks_like_path("org/name:model-Q4_K_M.gguf") and looks_like_path("x.gguf")


def test_online_the_one_file_is_downloaded_into_the_cache(repo_folder, tmp_path, monkeypatch):
    """huggingface_hub's listing and download replaced by a local folder's: attnlm lists the
    repository, downloads the file QUANT names (not the others) into the cache folder."""
    import huggingface_hub

    asked: list[tuple] = []
    cache = tmp_path / "hub"

    def list_repo_files(repo_id, **kw):
        asked.append(("list", repo_id))
        return sorted(p.name for p in repo_folder.iterdir())

    def hf_hub_download(repo_id, filename, cache_dir=None, **kw):
        asked.append(("download", repo_id, filename, Path(cache_dir)))
        out = Path(cache_dir) / "downloaded" / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo_folder / filename, out)
        return str(out)

    monkeypatch.setattr(huggingface_hub, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    found = resolve(f"{REPO}:Q3_K_M", engine_ok=True, threads=1)
    assert asked == [("list", REPO), ("download", REPO, "tiny-qwen2-q3_k_m.gguf", cache)]
    assert found.info.path == cache / "downloaded" / "tiny-qwen2-q3_k_m.gguf"


def test_the_cli_takes_a_hub_gguf_spec(offline_cache, tmp_path):
    r = attnlm_process("generate", "--model", f"{REPO}:Q3_K_M", "--prompt", "A small model",
                       "--max-new-tokens", 4, "--json", threads=1,
                       env={"HF_HUB_CACHE": str(offline_cache.parents[2]),
                            "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["backend"] == "c-engine" and doc["new_tokens"] == 4
    bad = attnlm_process("generate", "--model", f"{REPO}:Q2_K", "--prompt", "A", "--json",
                         env={"HF_HUB_CACHE": str(offline_cache.parents[2]),
                              "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "no GGUF file for 'Q2_K'" in bad.stderr.strip().splitlines()[-1]
