"""Sentence pairs of a run (objectives whose ``data`` is ``"pairs"``): read, split, tokenized
and stored in ``run_dir/pairs/`` with the signature of what they were made from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_write_text
from attnlm.data.pairs import RUN_PAIRS_DIR, RUN_SPLIT_SEED
from attnlm.train.config import TrainConfig
from attnlm.train.run_files import file_fingerprint

PAIRS_DIR = RUN_PAIRS_DIR  # inside the run folder: tokenizers, the three splits, the signature
SPLIT_SEED = RUN_SPLIT_SEED  # the train/valid/test split does not move with the training seed


@dataclass
class PairRunData:
    """Tokenizers and the train/valid/test pairs of a sequence-to-sequence run.

    ``tokenizer`` is the :class:`~attnlm.data.pairs.PairTokenizers` (both sides; the
    checkpoint stores it); ``train``/``valid``/``test`` are :class:`~attnlm.data.pairs.Pair`
    lists after the length filter. ``encoded(split)`` gives ``(source ids with the end token,
    target ids without start/end)``, what :class:`~attnlm.loading.objectives.Seq2Seq` batches."""

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


_SPLITS = ("train", "valid", "test")  # the stored files, in this order


def _signature(
    cfg: TrainConfig, pairs_path: str | None, valid_path: str | None, test_path: str | None
) -> dict[str, Any]:
    """What the stored pairs are made from: the files (and their content), the tokenizer
    settings, the split fractions and the length limit."""
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
    if cfg.init_from is not None:  # the same folder name whatever the source: its content
        init = Path(cfg.tokenizer)
        signature["init_tokenizers"] = [
            file_fingerprint(f)["sha256"] for f in sorted(init.glob("*.json"))
        ]
    return signature


def _stored(folder: Path, doc: dict[str, Any]) -> PairRunData:
    """The pairs stored in ``folder`` (``doc``: its ``data.json``)."""
    from attnlm.data.pairs import PairTokenizers, read_pairs

    tok = PairTokenizers.load(folder)
    splits = [read_pairs(folder / f"{n}.tsv", header=False)[0]
              if (folder / f"{n}.tsv").stat().st_size else [] for n in _SPLITS]  # fmt: skip
    return PairRunData(tok, *splits, dropped=int(doc.get("dropped", 0)))


def _split(
    cfg: TrainConfig, pairs_path: str | None, valid_path: str | None, test_path: str | None
) -> Any:
    """The train / valid / test :class:`~attnlm.data.pairs.PairSplits`: ``cfg.pairs`` (or the
    built-in task) split, the validation and test splits given as files taken as they are."""
    from attnlm.data.pairs import PairSplits, read_pairs, split_pairs
    from attnlm.data.tasks import load_pairs

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
    return split


def _tokenizers(cfg: TrainConfig, train: list) -> Any:
    """The run's :class:`~attnlm.data.pairs.PairTokenizers`: trained on the training pairs, or
    the pretrained model's own when fine-tuning (train/finetune.py)."""
    from attnlm.data.pairs import PairTokenizerConfig, PairTokenizers, train_pair_tokenizers

    if cfg.init_from is not None:  # the pretrained model's own tokenizers (train/finetune.py)
        return PairTokenizers.load(cfg.tokenizer)
    tok_cfg = PairTokenizerConfig(
        kind=cfg.tokenizer, shared=cfg.shared_vocab, vocab_size=cfg.bpe_vocab_size
    )
    return train_pair_tokenizers(train, tok_cfg)


def _store(folder: Path, signature: dict[str, Any], tok: Any, kept: list, dropped: int) -> None:
    """Write the tokenizers and the ``kept`` splits (``(pairs, dropped)`` each) to ``folder``,
    the signature (``data.json``) last."""
    from attnlm.data.pairs import write_pairs

    sig_path = folder / "data.json"
    folder.mkdir(parents=True, exist_ok=True)
    sig_path.unlink(missing_ok=True)
    tok.save(folder)
    for name, (rows, _) in zip(_SPLITS, kept):
        write_pairs(folder / f"{name}.tsv", [(p.source, p.target) for p in rows])
    doc = {"signature": signature, "dropped": dropped}
    atomic_write_text(sig_path, json.dumps(doc))  # last: the data is complete


def prepare_pairs(run_dir: Path, cfg: TrainConfig) -> PairRunData:
    """Read the pairs (``cfg.pairs`` or the built-in task), split them (train / valid / test,
    grouped by source, :func:`attnlm.data.pairs.split_pairs`), train the tokenizers on the
    training split (a fine-tuning run, ``cfg.init_from``, loads the pretrained model's from
    the folder ``cfg.tokenizer`` instead), drop pairs over ``cfg.max_pair_tokens``, and
    store everything in
    ``run_dir/pairs/`` (a resumed run, and ``attnlm eval``, reuse it).

    ``cfg.valid_pairs`` / ``cfg.test_pairs`` name files that are the validation / test split
    as they are; then nothing is held out of ``cfg.pairs`` for that split (with both, every
    pair of ``cfg.pairs`` trains). ``cfg.test_fraction = 0`` holds out no test split."""
    import time

    from attnlm.data.pairs import filter_pairs

    folder = run_dir / PAIRS_DIR
    sig_path = folder / "data.json"
    pairs_path = _resolved(cfg.pairs)
    valid_path, test_path = _resolved(cfg.valid_pairs), _resolved(cfg.test_pairs)
    signature = _signature(cfg, pairs_path, valid_path, test_path)
    if sig_path.is_file():
        try:
            doc = json.loads(sig_path.read_text(encoding="utf-8"))
        except ValueError:
            doc = {}
        if doc.get("signature") == signature:
            return _stored(folder, doc)
    t0 = time.perf_counter()
    split = _split(cfg, pairs_path, valid_path, test_path)
    tok = _tokenizers(cfg, split.train)
    limit = cfg.max_pair_tokens or None
    kept = [filter_pairs(s, max_tokens=limit, tokenizers=tok) if limit else (list(s), 0)
            for s in (split.train, split.valid, split.test)]  # fmt: skip
    dropped = sum(n for _, n in kept)
    if not kept[0][0]:
        raise InputError(f"train.max_pair_tokens={limit} drops every training pair")
    _store(folder, signature, tok, kept, dropped)
    return PairRunData(tok, *(rows for rows, _ in kept), dropped, time.perf_counter() - t0)
