"""Token files prepared before (``train.data_dir``): a folder written by ``attnlm data
prepare`` (its tokenizer and metadata are used), or nanoGPT's ``train.bin`` / ``val.bin``
(uint16 GPT-2 ids; ``--tokenizer gpt2``). Their files are linked into the run folder, not
copied. nanoGPT's character-level data (``meta.pkl``, a pickle) is refused, never unpickled.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.fileio import atomic_write_text, kill_point, temp_path_for
from attnlm.data.windows import read_token_file, write_token_meta
from attnlm.tokenizers import make_tokenizer
from attnlm.tokenizers.factory import TRAINABLE_KINDS
from attnlm.train.config import TrainConfig
from attnlm.train.run_files import SIGNATURE_VERSION, RunData, file_fingerprint, reuse_run_data

NANOGPT_PICKLE = "meta.pkl"


def _link(target: Path, link: Path) -> None:
    """Put a symbolic link to ``target`` at ``link`` atomically (a copy where links fail)."""
    import shutil

    tmp = temp_path_for(link)
    try:
        os.symlink(target.resolve(), tmp)
    except OSError:
        shutil.copyfile(target, tmp)
    kill_point("replace")
    os.replace(tmp, link)


def _chars_per_id(tok: Any) -> np.ndarray:
    """Characters each id adds to a decoded text: the UTF-8 lead bytes of its bytes (so a
    character split over several byte-level tokens counts once); a special token counts as
    one character (the document break it stands for)."""
    special = set(tok.special_tokens.values())
    out = np.zeros(tok.vocab_size, dtype=np.int64)
    for i in range(tok.vocab_size):
        if i in special:
            out[i] = 1
            continue
        try:
            raw = tok.decode_bytes([i]) if hasattr(tok, "decode_bytes") else tok.decode([i])
        except Exception:  # noqa: BLE001 - an id without a token (a gap in the ranks)
            continue
        out[i] = len(raw) if isinstance(raw, str) else sum(1 for b in raw if b & 0xC0 != 0x80)
    return out


def nanogpt_token_file(path: Path, tok: Any, per_id: np.ndarray) -> tuple[int, int]:
    """``(ids, characters)`` of a nanoGPT uint16 id file, checking every id is in the
    tokenizer's vocabulary (read in blocks)."""
    size = path.stat().st_size
    if size % 2:
        raise InputError(f"{path}: odd size {size}: not a uint16 id file as nanoGPT writes")
    ids = np.memmap(path, dtype=np.uint16, mode="r") if size else np.zeros(0, np.uint16)
    chars = 0
    for start in range(0, len(ids), 1 << 24):
        block = np.asarray(ids[start : start + (1 << 24)])
        top = int(block.max()) if len(block) else 0
        if top >= tok.vocab_size:
            raise InputError(
                f"{path}: token id {top} is outside the tokenizer's vocabulary "
                f"({tok.vocab_size:,} ids): not data for this tokenizer"
            )
        chars += int(per_id[block].sum())
    return len(ids), chars


def prepare_data_dir(run_dir: Path, cfg: TrainConfig, *, resume: bool = False) -> RunData:
    """Use the token files in ``cfg.data_dir`` (see the module docstring)."""
    from attnlm import tokenizers

    src = Path(cfg.data_dir).expanduser().resolve()  # type: ignore[arg-type]
    if (src / NANOGPT_PICKLE).exists():
        raise InputError(
            f"{src / NANOGPT_PICKLE}: character-level nanoGPT data (its vocabulary is a Python "
            "pickle, which attnlm never loads); prepare the text itself with attnlm data "
            "prepare --text input.txt --out DIR"
        )
    names = ("train.bin", "val.bin")
    for name in names:
        if not (src / name).is_file():
            raise InputError(f"{src}: no {name} (expected train.bin and val.bin)")
    ours = (src / "data.json").is_file() and (src / "tokenizer.json").is_file()
    if not ours and cfg.tokenizer in TRAINABLE_KINDS:
        raise ConfigError(
            f"{src} holds nanoGPT token ids: name their tokenizer, e.g. --tokenizer gpt2 "
            f"(not {cfg.tokenizer!r}, which would be trained on text)"
        )
    signature = {
        "version": SIGNATURE_VERSION,
        "data_dir": str(src),
        "files": [{"file": n, **file_fingerprint(src / n, content=False)} for n in names],
        "tokenizer": "tokenizer.json" if ours else cfg.tokenizer,
    }
    reused = reuse_run_data(run_dir, signature, resume)
    if reused is not None:
        return reused
    t0 = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "data.json").unlink(missing_ok=True)
    if ours:
        tok = tokenizers.load(src / "tokenizer.json")
        files = [read_token_file(src / n) for n in names]
        metas = [(f.dtype, f.n_tokens, f.n_chars) for f in files]
    else:
        tok = make_tokenizer(cfg.tokenizer, "", "", None)
        if tok.vocab_size > 1 << 16:
            raise ConfigError(f"{cfg.tokenizer}: {tok.vocab_size:,} ids do not fit in uint16")
        per_id = _chars_per_id(tok)
        metas = [("uint16", *nanogpt_token_file(src / n, tok, per_id)) for n in names]
    out = []
    for name, (dtype, n_tokens, n_chars) in zip(names, metas):
        _link(src / name, run_dir / name)
        out.append(write_token_meta(run_dir / name, dtype, n_tokens, n_chars, tok.vocab_size))
    if out[0].n_tokens < 2 or out[1].n_tokens < 2:
        raise InputError(f"{src}: need at least 2 tokens in train.bin and in val.bin")
    tok.save(run_dir / "tokenizer.json")
    atomic_write_text(run_dir / "data.json", json.dumps(signature))
    return RunData(tok, *out, seconds=time.perf_counter() - t0)
