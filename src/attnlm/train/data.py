"""Preparing a run's data: train (or load) the tokenizer, tokenize the corpus once into memmaps.

(Over 500 lines on purpose: the three ways a run gets its tokens, text, sentence pairs and
prepared token files, share one signature and one reuse rule, kept in one place.)

The run folder keeps ``tokenizer.json`` and, next to it, ``train.bin`` / ``val.bin`` (flat id
arrays, see :mod:`attnlm.data.windows`) with their JSON metadata, and ``data.json``, the
signature of what they were made from: the corpus's content (size, modification time and
SHA-256 of every file) and the tokenizer settings (kind or the tokenizer file's content, BPE
vocabulary size, validation fraction, document field). A later run in the folder reuses the
files only when the signature is the same; a changed corpus or tokenizer is tokenized again (a
resumed run refuses instead: its model was trained on the old tokens).

The corpus (any format of :mod:`attnlm.data.sources`) is streamed, never held in memory
(:mod:`attnlm.data.stream`): one pass scans it (characters, documents, the split, the
character tokenizer's alphabet, which is the whole text's so validation characters are
encodable); a trainable tokenizer other than ``char`` learns on at most ``tokenizer_sample``
characters of the training split (all of it when smaller; else whole chunks spread evenly
over it); the last pass encodes chunks in ``workers`` processes and writes them in order.
A text corpus with a byte-level BPE given beforehand (a tokenizer file, ``gpt2``) needs none
of the first passes: it is fingerprinted, encoded and split in one read
(:mod:`attnlm.data.text_ranges`; the same files, tested), and the SHA-256 digests are
computed before reading only when the folder holds data that could be reused.
``data.json`` is removed first and written last, so a killed preparation is never taken for a
complete one; the token files themselves are written atomically (no torn file) and the
temporary files a kill leaves are removed by the next run.

``data_dir`` instead points at token files prepared before: a folder written by ``attnlm data
prepare`` (its tokenizer and metadata are used), or nanoGPT's ``train.bin`` / ``val.bin``
(uint16 GPT-2 ids; ``--tokenizer gpt2``). Their files are linked into the run folder, not
copied. nanoGPT's character-level data (``meta.pkl``, a pickle) is refused, never unpickled.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlm.data.corpus import default_corpus_path
from attnlm.data.pairs import RUN_PAIRS_DIR, RUN_SPLIT_SEED
from attnlm.data.sources import Corpus, open_corpus
from attnlm.data.stream import (
    CHUNK_CHARS,
    SplitPoint,
    chunks,
    default_workers,
    encode_chunks,
    scan,
    split_pieces,
    split_point,
)
from attnlm.data.text_ranges import UnencodableText, prepare_text_files
from attnlm.data.windows import TokenFile, read_token_file, write_token_meta, write_token_stream
from attnlm.errors import ConfigError, InputError
from attnlm.fileio import atomic_write_text, remove_stale_temps, temp_path_for
from attnlm.tokenizers import BPETokenizer, chunk_safe, make_tokenizer
from attnlm.tokenizers.factory import TRAINABLE_KINDS
from attnlm.train.config import TrainConfig

SIGNATURE_VERSION = 2
AUTO_WORKERS_BYTES = 32 << 20  # below this a worker pool takes longer to start than to encode
NANOGPT_PICKLE = "meta.pkl"


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


def _corpus(cfg: TrainConfig) -> Corpus:
    path = default_corpus_path() if cfg.text is None else cfg.text
    return open_corpus(path, cfg.text_field, cfg.skip_bad)


def corpus_fingerprint(corpus: Corpus, content: bool = True) -> list[dict[str, Any]]:
    """The fingerprint of every file the corpus reads (names relative to a folder; without
    ``content``, no SHA-256: the one-read preparation adds it as it reads)."""
    root = corpus.path if corpus.path.is_dir() else corpus.path.parent
    return [{"file": str(f.relative_to(root)), **file_fingerprint(f, content)}
            for f in corpus.files]  # fmt: skip


def data_signature(cfg: TrainConfig, corpus: Corpus, content: bool = True) -> dict[str, Any]:
    """What a run's token files depend on (see the module docstring); without ``content``,
    the corpus files' SHA-256 digests are left out (:func:`corpus_fingerprint`)."""
    tokenizer_file = None
    if cfg.tokenizer not in TRAINABLE_KINDS and Path(cfg.tokenizer).expanduser().is_file():
        tokenizer_file = file_fingerprint(Path(cfg.tokenizer).expanduser())
    sig = {
        "version": SIGNATURE_VERSION,
        "text": cfg.text,
        "corpus": corpus_fingerprint(corpus, content),
        "tokenizer": cfg.tokenizer,
        "tokenizer_file": tokenizer_file,
        "bpe_vocab_size": cfg.bpe_vocab_size,
        "val_fraction": cfg.val_fraction,
    }
    defaults = TrainConfig()
    for key in ("text_field", "skip_bad", "tokenizer_sample"):  # recorded when not the default
        if getattr(cfg, key) != getattr(defaults, key):
            sig[key] = getattr(cfg, key)
    return sig


def _without(sig: Any, key: str) -> Any:
    """``sig`` with ``key`` removed from every dictionary in it."""
    if isinstance(sig, dict):
        return {k: _without(v, key) for k, v in sig.items() if k != key}
    if isinstance(sig, list):
        return [_without(v, key) for v in sig]
    return sig


def _content(sig: dict[str, Any]) -> Any:
    """A signature without modification times: what a resumed run must still match."""
    return _without(sig, "mtime_ns")


def _may_reuse(run_dir: Path, unhashed: dict[str, Any], resume: bool) -> bool:
    """Whether :func:`_reuse` could take the run folder's data given a signature without the
    corpus's SHA-256 digests: then they are computed first (else while the corpus is read)."""
    names = ("tokenizer.json", "data.json", "train.bin", "val.bin")
    if not all((run_dir / n).is_file() for n in names):
        return False
    try:
        stored = json.loads((run_dir / "data.json").read_text(encoding="utf-8"))
    except ValueError:
        return False
    return isinstance(stored, dict) and (
        resume or _without(stored, "sha256") == _without(unhashed, "sha256")
    )


def _reuse(run_dir: Path, signature: dict[str, Any], resume: bool) -> RunData | None:
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
        _content(stored) == _content(signature) or "version" not in stored  # older run
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


@contextmanager
def progress_bar(total: int, what: str, enabled: bool) -> Iterator[Callable[[int], Any] | None]:
    """A bar over ``total`` input bytes (MB/s and ETA), drawn once the step takes over a
    second; yields its ``update`` (None when disabled)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=what, unit="B", unit_scale=True, delay=1.0, leave=False) as bar:
        yield bar.update


def prepare(
    run_dir: Path,
    cfg: TrainConfig,
    *,
    resume: bool = False,
    log: Callable[[str], Any] | None = None,
    chunk_chars: int = CHUNK_CHARS,
    one_read: bool = True,
) -> RunData:
    """Tokenize the corpus into ``run_dir`` (or reuse what is there) and return it.

    ``resume``: the run continues from a checkpoint; if its corpus or tokenizer changed since
    (other content than ``data.json`` records) this is an :class:`InputError`. ``log`` gets
    lines about tokenizer training and skipped records. A text corpus with a byte-level BPE
    given beforehand is prepared in one read (:mod:`attnlm.data.text_ranges`; ``chunk_chars``
    is then its ranges' size in bytes) unless ``one_read`` is False, which forces the passes
    of the other corpora (for comparisons: both write the same files)."""
    if cfg.data_dir is not None:
        return prepare_data_dir(run_dir, cfg, resume=resume)
    say = log or (lambda line: None)
    corpus = _corpus(cfg)
    signature = data_signature(cfg, corpus, content=False)
    if _may_reuse(run_dir, signature, resume):
        signature = data_signature(cfg, corpus)
        reused = _reuse(run_dir, signature, resume)
        if reused is not None:
            return reused
    t0 = time.perf_counter()
    total = corpus.total_bytes
    given = (
        None if cfg.tokenizer in TRAINABLE_KINDS else make_tokenizer(cfg.tokenizer, "", "", None)
    )
    fits = not corpus.documents and isinstance(given, BPETokenizer) and chunk_safe(given)
    if one_read and fits:
        try:
            return _prepare_in_one_read(run_dir, cfg, corpus, given, signature, chunk_chars, t0)
        except UnencodableText:
            pass  # the passes below fail too, naming the split the text is in
    if not _hashed(signature):
        signature = data_signature(cfg, corpus)
    with progress_bar(total, "scanning corpus", cfg.progress) as bar:
        info = scan(corpus, alphabet=cfg.tokenizer == "char", progress=bar)
    if not info.nonspace:
        raise InputError(f"{corpus.path}: file is empty")
    if info.bad.count:
        say(f"{corpus.path}: {info.bad.format()}")
    point = split_point(info, cfg.val_fraction, corpus.documents)
    tok = given if given is not None else _tokenizer(cfg, corpus, info, point, say)
    workers = _workers(cfg, total)
    v = tok.vocab_size
    sig_path = _clear(run_dir)
    chars = [0, 0]

    def counted(stream: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
        for split, text in stream:
            chars[split] += len(text)
            yield split, text

    with progress_bar(total, f"encoding ({workers} worker(s))", cfg.progress) as bar:
        stream = chunks(split_pieces(corpus.pieces(bar), point), chunk_chars, chunk_safe(tok))
        groups = itertools.groupby(encode_chunks(tok, counted(stream), workers), lambda x: x[0])
        files = [
            write_token_stream((ids for _, ids in group), run_dir / name, v, lambda s=s: chars[s])
            for (s, group), name in zip(groups, ("train.bin", "val.bin"))
        ]
    if len(files) < 2 or files[0].n_tokens < 2 or files[1].n_tokens < 2:
        raise InputError("the text is too short: need at least 2 tokens in each split")
    tok.save(run_dir / "tokenizer.json")  # atomic (attnlm.fileio)
    atomic_write_text(sig_path, json.dumps(signature))  # last: the data is complete
    return RunData(tok, *files, seconds=time.perf_counter() - t0, corpus_bytes=total)


def _hashed(signature: dict[str, Any]) -> bool:
    return all("sha256" in entry for entry in signature["corpus"])


def _workers(cfg: TrainConfig, total: int) -> int:
    return cfg.workers or (default_workers() if total >= AUTO_WORKERS_BYTES else 1)


def _clear(run_dir: Path) -> Path:
    """Make ``run_dir`` ready for new token files: ``data.json`` removed (they are not complete
    until it is written again) and the temporary files of a killed preparation; returns the
    path of ``data.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    sig_path = run_dir / "data.json"
    sig_path.unlink(missing_ok=True)
    for name in ("train.bin", "val.bin"):
        remove_stale_temps(run_dir, name)
    return sig_path


def _prepare_in_one_read(
    run_dir: Path,
    cfg: TrainConfig,
    corpus: Corpus,
    tok: Any,
    signature: dict[str, Any],
    chunk_bytes: int,
    t0: float,
) -> RunData:
    """:func:`prepare` for a text corpus and a byte-level BPE known before reading it: one
    read fingerprints, encodes and splits it (:mod:`attnlm.data.text_ranges`)."""
    total = corpus.total_bytes
    workers = _workers(cfg, total)
    sig_path = _clear(run_dir)
    with progress_bar(total, f"encoding ({workers} worker(s))", cfg.progress) as bar:
        out = prepare_text_files(
            corpus.files, tok, run_dir, cfg.val_fraction, workers=workers,
            chunk_bytes=chunk_bytes, progress=bar, where=str(corpus.path),
        )  # fmt: skip
    if out.train.n_tokens < 2 or out.val.n_tokens < 2:
        raise InputError("the text is too short: need at least 2 tokens in each split")
    for entry, digest in zip(signature["corpus"], out.sha256):
        entry["sha256"] = digest  # the files' content, hashed as they were read
    tok.save(run_dir / "tokenizer.json")  # atomic (attnlm.fileio)
    atomic_write_text(sig_path, json.dumps(signature))  # last: the data is complete
    return RunData(tok, out.train, out.val, seconds=time.perf_counter() - t0, corpus_bytes=total)


def _tokenizer(
    cfg: TrainConfig, corpus: Corpus, info: Any, point: SplitPoint, say: Callable[[str], Any]
) -> Any:
    """The run's tokenizer when it is made from the corpus (a published or saved one is
    loaded by :func:`prepare` before reading): the character tokenizer from the scanned
    alphabet, or a trainable kind from a sample of the training split."""
    if cfg.tokenizer == "char":
        return make_tokenizer("char", "".join(sorted(info.alphabet)), "", None)
    t0 = time.perf_counter()
    train_chars = point.at if not point.documents else int(info.chars * (1 - cfg.val_fraction))
    sample, whole = training_sample(corpus, point, cfg.tokenizer_sample, train_chars)
    size = cfg.bpe_vocab_size
    if not size:  # 0: sized from the training text (the sample)
        from attnlm.tokenizers.sizing import vocab_size_for

        size = vocab_size_for([sample])
    tok = make_tokenizer(cfg.tokenizer, "", sample, size)
    took = time.perf_counter() - t0
    what = "the whole training split" if whole else "whole chunks spread over the training split"
    say(
        f"tokenizer: {cfg.tokenizer} trained on {len(sample):,} characters, {what}, in "
        f"{took:.1f}s ({len(sample) / max(took, 1e-9) / 1e6:.2f}M characters/s)"
    )
    return tok


def training_sample(
    corpus: Corpus, point: SplitPoint, limit: int, train_chars: int
) -> tuple[str, bool]:
    """``(text, whole)``: at most about ``limit`` characters of the training split (of about
    ``train_chars``): all of it (``whole``) when it is no longer, else whole chunks (cut at
    line starts) kept in proportion as the split streams by, so they spread evenly over it."""
    parts: list[str] = []
    taken = pos = 0
    whole = True
    size = min(CHUNK_CHARS, max(limit // 64, 1000))  # at least 64 pieces in a sample
    for split, chunk in chunks(split_pieces(corpus.pieces(), point), size):
        if split:
            break
        pos += len(chunk)
        if taken < limit and (train_chars <= limit or taken < limit * pos / train_chars):
            parts.append(chunk)
            taken += len(chunk)
        else:
            whole = False
    return "".join(parts), whole


# ---------------------------------------------------------------------------------------------
# Token files prepared before: `attnlm data prepare` folders and nanoGPT's train.bin / val.bin


def _link(target: Path, link: Path) -> None:
    """Put a symbolic link to ``target`` at ``link`` atomically (a copy where links fail)."""
    import shutil

    tmp = temp_path_for(link)
    try:
        os.symlink(target.resolve(), tmp)
    except OSError:
        shutil.copyfile(target, tmp)
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
    reused = _reuse(run_dir, signature, resume)
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


# ---------------------------------------------------------------------------------------------
# Sentence pairs (objectives whose ``data`` is ``"pairs"``)

PAIRS_DIR = RUN_PAIRS_DIR  # inside the run folder: tokenizers, the three splits, the signature
SPLIT_SEED = RUN_SPLIT_SEED  # the train/valid/test split does not move with the training seed


@dataclass
class PairRunData:
    """Tokenizers and the train/valid/test pairs of a sequence-to-sequence run.

    ``tokenizer`` is the :class:`~attnlm.data.pairs.PairTokenizers` (both sides; the
    checkpoint stores it); ``train``/``valid``/``test`` are :class:`~attnlm.data.pairs.Pair`
    lists after the length filter. ``encoded(split)`` gives ``(source ids with the end token,
    target ids without start/end)``, what :class:`~attnlm.objectives.Seq2Seq` batches."""

    tokenizer: Any
    train: list
    valid: list
    test: list
    dropped: int = 0
    seconds: float = 0.0

    def encoded(self, split: str) -> list[tuple[list[int], list[int]]]:
        pairs = getattr(self, split)
        tok = self.tokenizer
        return [(tok.encode_source(s), tok.tokens(t, "target")) for s, t in pairs]

    def target_chars(self, split: str) -> int:
        return sum(len(t) + 1 for _, t in getattr(self, split))  # + the end of the sentence

    def model_fields(self) -> dict[str, Any]:
        """The ``[model]`` fields the data decides: vocabulary sizes and special ids (the
        source embedding also covers the padding id used for source padding)."""
        tok = self.tokenizer
        src, tgt = tok.source_ids, tok.target_ids
        fields: dict[str, Any] = {
            "vocab_size": tgt.vocab_size,
            "pad_id": tgt.pad,
            "bos_id": tgt.bos,
            "eos_id": tgt.eos,
        }
        if not tok.shared:
            fields["src_vocab_size"] = max(src.vocab_size, tgt.pad + 1)
            fields["share_embeddings"] = False
        return fields

    def stats_line(self) -> str:
        tok = self.tokenizer
        kind = type(tok.source).__name__
        vocab = (f"vocab {tok.target_ids.vocab_size:,} (shared)" if tok.shared else
                 f"vocab {tok.source_ids.vocab_size:,} source / {tok.target_ids.vocab_size:,} "
                 "target")  # fmt: skip
        took = f" in {self.seconds:.1f}s" if self.seconds else ""
        return (
            f"pairs: train {len(self.train):,}, valid {len(self.valid):,}, test "
            f"{len(self.test):,} ({self.dropped:,} dropped by length); tokenizer: {kind}, "
            f"{vocab}{took}"
        )


def _resolved(path: str | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().resolve())


def prepare_pairs(run_dir: Path, cfg: TrainConfig) -> PairRunData:
    """Read the pairs (``cfg.pairs`` or the built-in task), split them (train / valid / test,
    grouped by source, :func:`attnlm.data.pairs.split_pairs`), train the tokenizers on the
    training split, drop pairs over ``cfg.max_pair_tokens``, and store everything in
    ``run_dir/pairs/`` (a resumed run, and ``attnlm eval``, reuse it).

    ``cfg.valid_pairs`` / ``cfg.test_pairs`` name files that are the validation / test split
    as they are; then nothing is held out of ``cfg.pairs`` for that split (with both, every
    pair of ``cfg.pairs`` trains). ``cfg.test_fraction = 0`` holds out no test split."""
    import time

    from attnlm.data.pairs import (
        PairSplits,
        PairTokenizerConfig,
        PairTokenizers,
        filter_pairs,
        read_pairs,
        split_pairs,
        train_pair_tokenizers,
        write_pairs,
    )
    from attnlm.data.tasks import load_pairs

    folder = run_dir / PAIRS_DIR
    sig_path = folder / "data.json"
    pairs_path = _resolved(cfg.pairs)
    valid_path, test_path = _resolved(cfg.valid_pairs), _resolved(cfg.test_pairs)
    signature = {
        "pairs": pairs_path,
        "valid_pairs": valid_path,
        "test_pairs": test_path,
        # the files' content: an edited file is read again (the built-in task is generated)
        "content": [
            file_fingerprint(Path(f))["sha256"] for f in (pairs_path, valid_path, test_path) if f
        ],  # fmt: skip
        "tokenizer": cfg.tokenizer,
        "vocab_size": cfg.bpe_vocab_size,
        "shared": cfg.shared_vocab,
        "val_fraction": cfg.val_fraction,
        "test_fraction": cfg.test_fraction,
        "max_pair_tokens": cfg.max_pair_tokens,
    }
    names = ("train", "valid", "test")
    if sig_path.is_file():
        try:
            doc = json.loads(sig_path.read_text(encoding="utf-8"))
        except ValueError:
            doc = {}
        if doc.get("signature") == signature:
            tok = PairTokenizers.load(folder)
            splits = [read_pairs(folder / f"{n}.tsv", header=False)[0]
                      if (folder / f"{n}.tsv").stat().st_size else [] for n in names]  # fmt: skip
            return PairRunData(tok, *splits, dropped=int(doc.get("dropped", 0)))
    t0 = time.perf_counter()
    pairs, _ = load_pairs(pairs_path)
    if not pairs:
        raise InputError(f"{pairs_path or 'the built-in task'}: no sentence pairs")
    split = split_pairs(
        pairs,
        valid=0.0 if valid_path else cfg.val_fraction,
        test=0.0 if test_path else cfg.test_fraction,
        seed=SPLIT_SEED,
    )
    given = {}
    for name, path in (("valid", valid_path), ("test", test_path)):
        if path:
            given[name] = read_pairs(path)[0]
            if not given[name]:
                raise InputError(f"{path}: no sentence pairs (train.{name}_pairs)")
    split = PairSplits(split.train, given.get("valid", split.valid), given.get("test", split.test))
    if not split.valid:
        raise InputError("too few pairs to hold out a validation split")
    tok_cfg = PairTokenizerConfig(
        kind=cfg.tokenizer, shared=cfg.shared_vocab, vocab_size=cfg.bpe_vocab_size
    )
    tok = train_pair_tokenizers(split.train, tok_cfg)
    limit = cfg.max_pair_tokens or None
    kept = [filter_pairs(s, max_tokens=limit, tokenizers=tok) if limit else (list(s), 0)
            for s in (split.train, split.valid, split.test)]  # fmt: skip
    dropped = sum(n for _, n in kept)
    if not kept[0][0]:
        raise InputError(f"train.max_pair_tokens={limit} drops every training pair")
    folder.mkdir(parents=True, exist_ok=True)
    sig_path.unlink(missing_ok=True)
    tok.save(folder)
    for name, (rows, _) in zip(names, kept):
        write_pairs(folder / f"{name}.tsv", [(p.source, p.target) for p in rows])
    doc = {"signature": signature, "dropped": dropped}
    sig_path.write_text(json.dumps(doc), encoding="utf-8")  # last: the data is complete
    return PairRunData(tok, *(rows for rows, _ in kept), dropped, time.perf_counter() - t0)
