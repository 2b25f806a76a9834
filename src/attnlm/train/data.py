"""Preparing a run's data: train (or load) the tokenizer, tokenize the corpus once into memmaps.

The run folder keeps ``tokenizer.json`` and, next to it, ``train.bin`` / ``val.bin`` (flat id
arrays, see :mod:`attnlm.data.windows`) with their JSON metadata. A resumed run reuses them.

The character tokenizer's alphabet is taken from the whole text (so validation characters are
encodable); a BPE tokenizer is trained on the training split only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.data.corpus import load_text, split_text
from attnlm.data.pairs import RUN_PAIRS_DIR, RUN_SPLIT_SEED
from attnlm.data.windows import TokenFile, read_token_file, write_token_file
from attnlm.errors import InputError
from attnlm.tokenizers import encode_text, make_tokenizer
from attnlm.train.config import TrainConfig


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


def prepare(run_dir: Path, cfg: TrainConfig) -> RunData:
    """Tokenize the corpus into ``run_dir`` (or reuse what is there) and return it."""
    import time

    from attnlm import tokenizers

    tok_path = run_dir / "tokenizer.json"
    train_path, val_path = run_dir / "train.bin", run_dir / "val.bin"
    sig_path = run_dir / "data.json"
    signature = {
        "text": cfg.text,
        "tokenizer": cfg.tokenizer,
        "bpe_vocab_size": cfg.bpe_vocab_size,
        "val_fraction": cfg.val_fraction,
    }
    if all(p.is_file() for p in (tok_path, train_path, val_path, sig_path)):
        try:
            same = json.loads(sig_path.read_text(encoding="utf-8")) == signature
        except ValueError:
            same = False
        if same:
            tok = tokenizers.load(tok_path)
            return RunData(tok, read_token_file(train_path), read_token_file(val_path))
    t0 = time.perf_counter()
    text = load_text(cfg.text)
    train_text, val_text = split_text(text, cfg.val_fraction)
    if not val_text:
        raise InputError("the text is too short to hold out a validation split")
    tok = make_tokenizer(cfg.tokenizer, text, train_text, cfg.bpe_vocab_size)
    v = tok.vocab_size
    train_ids = encode_text(tok, train_text, "training text")
    val_ids = encode_text(tok, val_text, "validation text")
    if len(train_ids) < 2 or len(val_ids) < 2:
        raise InputError("the text is too short: need at least 2 tokens in each split")
    run_dir.mkdir(parents=True, exist_ok=True)
    sig_path.unlink(missing_ok=True)
    train = write_token_file(train_ids, train_path, v, len(train_text))
    val = write_token_file(val_ids, val_path, v, len(val_text))
    tmp = run_dir / "tokenizer.json.tmp"
    tok.save(tmp)
    os.replace(tmp, tok_path)
    sig_path.write_text(json.dumps(signature), encoding="utf-8")  # last: the data is complete
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


def prepare_pairs(run_dir: Path, cfg: TrainConfig) -> PairRunData:
    """Read the pairs (``cfg.pairs`` or the built-in task), split them (train / valid / test,
    grouped by source, :func:`attnlm.data.pairs.split_pairs`), train the tokenizers on the
    training split, drop pairs over ``cfg.max_pair_tokens``, and store everything in
    ``run_dir/pairs/`` (a resumed run, and ``attnlm eval``, reuse it)."""
    import time

    from attnlm.data.pairs import (
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
    pairs_path = None if cfg.pairs is None else str(Path(cfg.pairs).expanduser().resolve())
    signature = {
        "pairs": pairs_path,
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
    split = split_pairs(pairs, valid=cfg.val_fraction, test=cfg.test_fraction, seed=SPLIT_SEED)
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
