"""Models on the Hugging Face Hub, through ``huggingface_hub`` and its cache.

* ``org/name``: a repository holding a Hugging Face model folder (``config.json``, tokenizer,
  safetensors): :func:`hub_folder` downloads those files (:data:`HUB_PATTERNS`, not every weight
  format) when online, or reads the cache alone with ``HF_HUB_OFFLINE=1``.
* ``org/name:QUANT``: one GGUF file of a repository of GGUF files, as llama.cpp's ``-hf``
  names it (``bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M``): :func:`hub_gguf` picks the
  ``.gguf`` file whose name holds QUANT as a word (any case: ``q4_k_m`` too; ``Q4_K`` is not
  ``Q4_K_M``), or whose name is QUANT, and downloads that file alone. ``org/name`` with no
  ``config.json`` but GGUF files takes ``Q4_K_M``, llama.cpp's default, or the repository's
  only GGUF file. Vision projectors (``mmproj``) are never picked; a file split in parts
  (``-00001-of-00003.gguf``) is refused in one line.

Every failure is one line (:class:`~attnlm.base.errors.InputError`) naming the repository, and
for a QUANT that matches nothing, the ones the repository has.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
#: ``org/name:QUANT``: a GGUF file of a Hub repository
HUB_GGUF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*):(?P<quant>[\w.-]+)$")
#: Files fetched for a Hub id: what a Hugging Face folder needs, not every weight format.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.spm")
#: the file type taken from a repository of GGUF files when none is named (llama.cpp's ``-hf``)
DEFAULT_QUANT = "Q4_K_M"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise InputError(
            "a Hub id needs huggingface_hub (pip install huggingface_hub), or give a folder"
        ) from None
    return huggingface_hub


def hub_cache() -> Path:
    """huggingface_hub's cache folder: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (read from the environment now, not when the library was
    imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().lower() in {"1", "on", "yes", "true"}


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def hub_folder(repo_id: str) -> Path:
    """The snapshot folder of Hub repository ``repo_id`` in huggingface_hub's cache:
    downloaded when online, read from the cache alone when ``HF_HUB_OFFLINE=1``."""
    hub = _hub()
    cache = hub_cache()
    online_problem = "offline (HF_HUB_OFFLINE=1)"
    if not hub_offline():
        try:
            return Path(
                hub.snapshot_download(repo_id, cache_dir=cache, allow_patterns=list(HUB_PATTERNS))
            )
        except Exception as e:  # noqa: BLE001 - network, auth, missing repo: all one line
            online_problem = f"the download failed ({_first_line(e)})"
    try:
        return Path(hub.snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError and kin)
        pass
    raise InputError(
        f"{repo_id}: not in the Hugging Face cache ({cache}) and {online_problem}; "
        "download it once online, or give a local folder"
    )


def hub_cached(repo_id: str) -> bool:
    """Whether the cache holds a snapshot of ``repo_id`` (no network)."""
    return _cached_snapshot(repo_id) is not None


def quant_of(name: str) -> str:
    """The file type a GGUF file name says (``...-Q4_K_M.gguf`` -> ``Q4_K_M``), or its name."""
    stem = Path(name).name
    stem = _SPLIT.sub("", stem) if _SPLIT.search(stem) else stem[: -len(".gguf")]
    found = re.search(r"(?i)(?<![a-z0-9])(i?q\d\w*|bf16|f16|f32)$", stem)
    return found.group(1).upper() if found else Path(name).name


def pick_gguf(repo_id: str, files: list[str], quant: str | None) -> str:
    """The file of ``files`` (a repository's paths) that ``quant`` names; ``quant`` None:
    :data:`DEFAULT_QUANT`, else the only GGUF file. InputError when none or several match, or
    the file is split in parts."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise InputError(f"{repo_id}: the repository has no .gguf file (and no config.json)")
    if quant is None:
        chosen = _matching(ggufs, DEFAULT_QUANT) or (ggufs if len(ggufs) == 1 else [])
        if not chosen:
            raise InputError(
                f"{repo_id}: several GGUF files and none is {DEFAULT_QUANT}; name one as "
                f"{repo_id}:QUANT (it has: {_quants(ggufs)})"
            )
    else:
        chosen = _matching(ggufs, quant)
        if not chosen:
            raise InputError(f"{repo_id}: no GGUF file for {quant!r} (it has: {_quants(ggufs)})")
    parts = sorted({_SPLIT.sub("", f) for f in chosen})
    if len(parts) > 1:
        shown = ", ".join(parts[:4])
        raise InputError(f"{repo_id}: {quant or DEFAULT_QUANT!r} names several files ({shown}); "
                         "name one by its file name")  # fmt: skip
    if any(_SPLIT.search(f) for f in chosen):
        raise InputError(
            f"{repo_id}: {chosen[0]} is one of {len(chosen)} parts of a split GGUF file, which "
            "attnlm does not read; join them with llama.cpp's llama-gguf-split --merge"
        )
    return chosen[0]


def _matching(ggufs: list[str], quant: str) -> list[str]:
    """The files whose name is ``quant`` or holds it as a word (any case)."""
    word = re.compile(rf"(?i)(?<![a-z0-9_]){re.escape(quant)}(?![a-z0-9_])")
    key = quant.lower()
    named = [f for f in ggufs if key in (f.lower(), Path(f).name.lower())]
    return named or [f for f in ggufs if word.search(Path(f).name)]


def _quants(ggufs: list[str]) -> str:
    return ", ".join(sorted({quant_of(f) for f in ggufs}))


def hub_gguf(repo_id: str, quant: str | None) -> Path:
    """The GGUF file of Hub repository ``repo_id`` that ``quant`` names (see the module
    docstring), downloaded into huggingface_hub's cache when online (that file alone), or
    found there with ``HF_HUB_OFFLINE=1``."""
    hub = _hub()
    cache = hub_cache()
    online_problem = "offline (HF_HUB_OFFLINE=1)"
    if not hub_offline():
        try:
            files = list(hub.list_repo_files(repo_id))
        except Exception as e:  # noqa: BLE001 - network, auth, missing repo: all one line
            online_problem = f"the file list could not be read ({_first_line(e)})"
        else:
            name = pick_gguf(repo_id, files, quant)
            try:
                return Path(hub.hf_hub_download(repo_id, name, cache_dir=cache))
            except Exception as e:  # noqa: BLE001
                why = _first_line(e)
                raise InputError(f"{repo_id}: downloading {name} failed ({why})") from None
    snapshot = _cached_snapshot(repo_id)
    if snapshot is not None:
        files = [str(p.relative_to(snapshot)) for p in snapshot.rglob("*.gguf")]
        if files:
            return snapshot / pick_gguf(repo_id, files, quant)
    raise InputError(
        f"{repo_id}: no GGUF file of it in the Hugging Face cache ({cache}) and {online_problem}; "
        "download it once online, or give a local .gguf file"
    )


def cached_ggufs(repo_id: str) -> list[Path]:
    """The GGUF files (vision projectors left out) of ``repo_id``'s cached snapshot that is
    not a Hugging Face model folder (no ``config.json``); [] when there is none (no network)."""
    snapshot = _cached_snapshot(repo_id)
    if snapshot is None or (snapshot / "config.json").is_file():
        return []
    return sorted(p for p in snapshot.rglob("*.gguf") if "mmproj" not in p.name.lower())


def _cached_snapshot(repo_id: str) -> Path | None:
    folder = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    try:
        snapshot = folder / "snapshots" / (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    return snapshot if snapshot.is_dir() else None


def hub_source(spec: str) -> Path:
    """What a Hub SPEC names on disk: the GGUF file of ``org/name:QUANT``, or of ``org/name``
    whose repository has GGUF files and no ``config.json``; else the snapshot folder of the
    Hugging Face model ``org/name``."""
    tagged = HUB_GGUF.match(spec)
    if tagged:
        return hub_gguf(tagged["repo"], tagged["quant"])
    folder = hub_folder(spec)
    return folder if (folder / "config.json").is_file() else hub_gguf(spec, None)
