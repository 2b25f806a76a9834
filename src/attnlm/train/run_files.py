"""A run folder's prepared data and the rule for reusing it: :class:`RunData` (the tokenizer
and the ``train.bin`` / ``val.bin`` token files), :func:`file_fingerprint` (what a signature
records of a file) and :func:`reuse_run_data` (the folder's data when its ``data.json``
signature allows). Shared by the three ways a run gets its tokens: text
(:mod:`attnlm.train.data`), prepared token files (:mod:`attnlm.train.data_dir`) and sentence
pairs (:mod:`attnlm.train.pair_data`)."""

from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.data.windows import TokenFile, read_token_file

SIGNATURE_VERSION = 2


@dataclass
class RunData:
    """Tokenizer and tokenized splits of a run."""

    tokenizer: Any
    train: TokenFile
    val: TokenFile
    seconds: float = 0.0  # time spent training the tokenizer and encoding (0 when reused)
    corpus_bytes: int = 0  # bytes of corpus files read (0 when reused)

    def stats_line(self) -> str:
        """One line of tokenizer statistics (kind, vocabulary, tokens, characters per token)."""
        kind = type(self.tokenizer).__name__
        n_tok = self.train.n_tokens + self.val.n_tokens
        n_chr = self.train.n_chars + self.val.n_chars
        took = f" in {self.seconds:.1f}s" if self.seconds else ""
        if self.seconds and self.corpus_bytes:
            took += f" ({self.corpus_bytes / self.seconds / 1e6:.1f} MB/s)"
        return (
            f"tokenizer: {kind}, vocab {self.tokenizer.vocab_size:,}; corpus {n_chr:,} chars -> "
            f"{n_tok:,} tokens ({n_chr / max(n_tok, 1):.2f} chars/token; train "
            f"{self.train.n_tokens:,}, val {self.val.n_tokens:,}){took}"
        )


def file_fingerprint(path: Path, content: bool = True) -> dict[str, Any]:
    """Size, modification time (ns) and SHA-256 of one file (read in 1 MiB blocks; without
    ``content``, no SHA-256)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # /dev/zero would be hashed without end
            raise InputError(f"{path}: not a regular file (a device or a pipe?)")
        out = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if content:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
            out["sha256"] = digest.hexdigest()
    except OSError as e:
        raise InputError(f"{path}: cannot read file ({e.strerror or e})") from None
    return out


def without_key(sig: Any, key: str) -> Any:
    """``sig`` with ``key`` removed from every dictionary in it."""
    if isinstance(sig, dict):
        return {k: without_key(v, key) for k, v in sig.items() if k != key}
    if isinstance(sig, list):
        return [without_key(v, key) for v in sig]
    return sig


def content_only(sig: dict[str, Any]) -> Any:
    """A signature without modification times: what a resumed run must still match."""
    return without_key(sig, "mtime_ns")


def may_reuse(run_dir: Path, unhashed: dict[str, Any], resume: bool) -> bool:
    """Whether :func:`reuse_run_data` could take the run folder's data given a signature without the
    corpus's SHA-256 digests: then they are computed first (else while the corpus is read)."""
    names = ("tokenizer.json", "data.json", "train.bin", "val.bin")
    if not all((run_dir / n).is_file() for n in names):
        return False
    try:
        stored = json.loads((run_dir / "data.json").read_text(encoding="utf-8"))
    except ValueError:
        return False
    return isinstance(stored, dict) and (
        resume or without_key(stored, "sha256") == without_key(unhashed, "sha256")
    )


def reuse_run_data(run_dir: Path, signature: dict[str, Any], resume: bool) -> RunData | None:
    """The run folder's data when its signature allows (see :func:`prepare`)."""
    from attnlm import tokenizers

    tok_path, sig_path = run_dir / "tokenizer.json", run_dir / "data.json"
    train_path, val_path = run_dir / "train.bin", run_dir / "val.bin"
    if not all(p.is_file() for p in (tok_path, train_path, val_path, sig_path)):
        return None
    try:
        stored = json.loads(sig_path.read_text(encoding="utf-8"))
    except ValueError:
        stored = None
    same_content = isinstance(stored, dict) and (
        content_only(stored) == content_only(signature) or "version" not in stored  # older run
    )
    if stored == signature or (resume and same_content):
        tok = tokenizers.load(tok_path)
        return RunData(tok, read_token_file(train_path), read_token_file(val_path))
    if resume and isinstance(stored, dict) and stored.get("version") == SIGNATURE_VERSION:
        raise InputError(
            f"cannot resume {run_dir}: the corpus or tokenizer changed since the run "
            "started (data.json); start a new run with --out"
        )
    return None
