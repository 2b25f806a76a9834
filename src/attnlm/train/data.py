"""Preparing a run's data: train (or load) the tokenizer, tokenize the corpus once into memmaps.

The run folder keeps ``tokenizer.json`` and, next to it, ``train.bin`` / ``val.bin`` (flat id
arrays, see :mod:`attnlm.data.windows`) with their JSON metadata, and ``data.json``, the
signature of what they were made from: the corpus's content (size, modification time and
SHA-256 of every file) and the tokenizer settings (kind or the tokenizer file's content, BPE
vocabulary size, validation fraction). A later run in the folder reuses the files only when the
signature is the same; a changed corpus or tokenizer is tokenized again (a resumed run refuses
instead: its model was trained on the old tokens).

The character tokenizer's alphabet is taken from the whole text (so validation characters are
encodable); a BPE tokenizer is trained on the training split only. The splits are encoded in
chunks of about a million characters streamed into the token files
(:func:`attnlm.tokenizers.iter_encode`, :func:`attnlm.data.windows.write_token_stream`), so
memory holds the text once plus one chunk, never a list of every id.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.data.corpus import default_corpus_path, load_text, split_index
from attnlm.data.pairs import RUN_PAIRS_DIR, RUN_SPLIT_SEED
from attnlm.data.windows import TokenFile, read_token_file, write_token_stream
from attnlm.errors import InputError
from attnlm.fileio import atomic_write_text
from attnlm.tokenizers import iter_encode, make_tokenizer
from attnlm.tokenizers.factory import TRAINABLE_KINDS
from attnlm.train.config import TrainConfig

SIGNATURE_VERSION = 2


@dataclass
class RunData:
    """Tokenizer and tokenized splits of a run."""

    tokenizer: Any
    train: TokenFile
    val: TokenFile
    seconds: float = 0.0  # time spent training the tokenizer and encoding (0 when reused)

    def stats_line(self) -> str:
        """One line of tokenizer statistics (kind, vocabulary, tokens, characters per token)."""
        kind = type(self.tokenizer).__name__
        n_tok = self.train.n_tokens + self.val.n_tokens
        n_chr = self.train.n_chars + self.val.n_chars
        took = f" in {self.seconds:.1f}s" if self.seconds else ""
        return (
            f"tokenizer: {kind}, vocab {self.tokenizer.vocab_size:,}; corpus {n_chr:,} chars -> "
            f"{n_tok:,} tokens ({n_chr / max(n_tok, 1):.2f} chars/token; train "
            f"{self.train.n_tokens:,}, val {self.val.n_tokens:,}){took}"
        )


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Size, modification time (ns) and SHA-256 of one file (read in 1 MiB blocks)."""
    try:
        st = path.stat()
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except OSError as e:
        raise InputError(f"{path}: cannot read file ({e.strerror or e})") from None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest.hexdigest()}


def corpus_fingerprint(text: str | None) -> list[dict[str, Any]]:
    """The fingerprint of every file the corpus ``text`` reads (the default corpus's cache
    file when None; each ``*.txt`` of a folder, as :func:`attnlm.data.corpus.read_text`)."""
    p = default_corpus_path() if text is None else Path(text).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.txt") if f.is_file())
        return [{"file": str(f.relative_to(p)), **file_fingerprint(f)} for f in files]
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    return [{"file": p.name, **file_fingerprint(p)}]


def data_signature(cfg: TrainConfig) -> dict[str, Any]:
    """What a run's token files depend on (see the module docstring)."""
    tokenizer_file = None
    if cfg.tokenizer not in TRAINABLE_KINDS and Path(cfg.tokenizer).expanduser().is_file():
        tokenizer_file = file_fingerprint(Path(cfg.tokenizer).expanduser())
    return {
        "version": SIGNATURE_VERSION,
        "text": cfg.text,
        "corpus": corpus_fingerprint(cfg.text),
        "tokenizer": cfg.tokenizer,
        "tokenizer_file": tokenizer_file,
        "bpe_vocab_size": cfg.bpe_vocab_size,
        "val_fraction": cfg.val_fraction,
    }


def _content(sig: dict[str, Any]) -> Any:
    """A signature without modification times: what a resumed run must still match."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "mtime_ns"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(sig)


def prepare(run_dir: Path, cfg: TrainConfig, *, resume: bool = False) -> RunData:
    """Tokenize the corpus into ``run_dir`` (or reuse what is there) and return it.

    ``resume``: the run continues from a checkpoint; if its corpus or tokenizer changed since
    (other content than ``data.json`` records) this is an :class:`InputError`."""
    from attnlm import tokenizers

    tok_path = run_dir / "tokenizer.json"
    train_path, val_path = run_dir / "train.bin", run_dir / "val.bin"
    sig_path = run_dir / "data.json"
    signature = data_signature(cfg)
    if all(p.is_file() for p in (tok_path, train_path, val_path, sig_path)):
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
    t0 = time.perf_counter()
    text = load_text(cfg.text)
    cut = split_index(text, cfg.val_fraction)
    if cut >= len(text):
        raise InputError("the text is too short to hold out a validation split")
    needs_train_text = cfg.tokenizer in TRAINABLE_KINDS and cfg.tokenizer != "char"
    train_text = text[:cut] if needs_train_text else ""
    size = cfg.bpe_vocab_size
    if not size and needs_train_text:  # 0: sized from the training text
        from attnlm.tokenizers.sizing import vocab_size_for

        size = vocab_size_for([train_text])
    tok = make_tokenizer(cfg.tokenizer, text, train_text, size)
    del train_text
    v = tok.vocab_size
    run_dir.mkdir(parents=True, exist_ok=True)
    sig_path.unlink(missing_ok=True)  # the files below are not complete until data.json is
    train = write_token_stream(iter_encode(tok, text, "training text", 0, cut), train_path, v, cut)
    val = write_token_stream(
        iter_encode(tok, text, "validation text", cut), val_path, v, len(text) - cut
    )
    if train.n_tokens < 2 or val.n_tokens < 2:
        raise InputError("the text is too short: need at least 2 tokens in each split")
    tok.save(tok_path)  # atomic (attnlm.fileio)
    atomic_write_text(sig_path, json.dumps(signature))  # last: the data is complete
    return RunData(tok, train, val, seconds=time.perf_counter() - t0)


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
