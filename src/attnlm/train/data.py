"""Preparing a run's data: train (or load) the tokenizer, tokenize the corpus once into memmaps.

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

``data_dir`` instead points at token files prepared before (:mod:`attnlm.train.data_dir`);
sentence pairs are prepared by :mod:`attnlm.train.pair_data`; the signature, the reuse rule
and :class:`RunData` they share are in :mod:`attnlm.train.run_files`. Their names are
importable from here too.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_write_text, remove_stale_temps
from attnlm.data.corpus import default_corpus_path
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
from attnlm.data.windows import write_token_stream
from attnlm.tokenizers import BPETokenizer, chunk_safe, make_tokenizer
from attnlm.tokenizers.factory import TRAINABLE_KINDS
from attnlm.train.config import TrainConfig
from attnlm.train.data_dir import NANOGPT_PICKLE, nanogpt_token_file, prepare_data_dir
from attnlm.train.pair_data import PAIRS_DIR, SPLIT_SEED, PairRunData, prepare_pairs
from attnlm.train.run_files import (
    SIGNATURE_VERSION,
    RunData,
    file_fingerprint,
    may_reuse,
    reuse_run_data,
)

__all__ = [
    "NANOGPT_PICKLE",
    "PAIRS_DIR",
    "SIGNATURE_VERSION",
    "SPLIT_SEED",
    "PairRunData",
    "RunData",
    "corpus_fingerprint",
    "data_signature",
    "file_fingerprint",
    "nanogpt_token_file",
    "prepare",
    "prepare_data_dir",
    "prepare_pairs",
    "training_sample",
]

AUTO_WORKERS_BYTES = 32 << 20  # below this a worker pool takes longer to start than to encode


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
    if may_reuse(run_dir, signature, resume):
        signature = data_signature(cfg, corpus)
        reused = reuse_run_data(run_dir, signature, resume)
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
    return _prepare_in_passes(run_dir, cfg, corpus, given, signature, chunk_chars, t0, total, say)


def _prepare_in_passes(
    run_dir: Path,
    cfg: TrainConfig,
    corpus: Corpus,
    given: Any,
    signature: dict[str, Any],
    chunk_chars: int,
    t0: float,
    total: int,
    say: Callable[[str], Any],
) -> RunData:
    """:func:`prepare` for any corpus and tokenizer (``given``: one known before reading, else
    None; ``total``: the corpus's size in bytes): a pass scans the corpus, the tokenizer is
    made from it when not given, the last pass encodes it in chunks and writes the two
    splits."""
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
    tok.save(run_dir / "tokenizer.json")  # atomic (attnlm.base.fileio)
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
    tok.save(run_dir / "tokenizer.json")  # atomic (attnlm.base.fileio)
    atomic_write_text(sig_path, json.dumps(signature))  # last: the data is complete
    return RunData(tok, out.train, out.val, seconds=time.perf_counter() - t0, corpus_bytes=total)


def _tokenizer(
    cfg: TrainConfig, corpus: Corpus, info: Any, point: SplitPoint, say: Callable[[str], Any]
) -> Any:
    """The run's tokenizer when it is made from the corpus (a published or saved one is
    loaded by :func:`prepare` before reading): the character tokenizer from the scanned
    alphabet, or a trainable kind from a sample of the training split."""
    if cfg.tokenizer == "char":
        return make_tokenizer("char", "".join(sorted(info.alphabet)), "", None, unk=cfg.unk)
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
