"""Dividing sentence pairs by source sentence: the train / validation / test split and the
references of each source (for multi-reference BLEU).

**Split** (:func:`split_pairs`): deterministic and independent of file order and Python
version. Pairs are grouped by source sentence (all translations of one sentence land in the
same split, so a test sentence is never seen in training with another translation); groups are
ordered by a keyed BLAKE2b hash of ``(seed, source)`` and taken, in that order, into test until
it holds ``test`` of the pairs, then into validation, the rest being training. Each split keeps
the original order of its pairs.

The split seed of training runs is fixed (:data:`RUN_SPLIT_SEED`), so a run's test split never
moves with its training seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.validate import fraction
from attnlm.data.pairs.read import Pair

RUN_SPLIT_SEED = 0  # the split seed of training runs (``attnlm train``/``eval``): fixed, so
RUN_PAIRS_DIR = "pairs"  # the test split never moves with the training seed; the run folder's
# sub-folder holding a run's tokenizers and train/valid/test TSV files


@dataclass(frozen=True)
class PairSplits:
    """Training, validation and test pairs (see :func:`split_pairs`)."""

    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "valid": len(self.valid), "test": len(self.test)}


def stable_hash(text: str, seed: int) -> int:
    """A 64-bit keyed BLAKE2b hash of ``text``: the same on every machine and Python version
    (unlike ``hash``, which is salted per process)."""
    key = str(int(seed)).encode("ascii")
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).digest())


def split_pairs(
    pairs: Sequence[Pair],
    *,
    valid: float = 0.1,
    test: float = 0.1,
    seed: int = 0,
    by_source: bool = True,
) -> PairSplits:
    """Deterministic train / validation / test split (see the module docstring).

    ``valid`` and ``test`` are fractions of the pairs (each split gets at least that share,
    exceeding it by less than one group); ``by_source=False`` groups identical pairs only.
    Raises :class:`ConfigError` for fractions outside [0, 1) or summing to 1 or more, and
    :class:`InputError` when no training pair would be left.
    """
    fraction({"valid": valid, "test": test}, "valid", "test", where="split")
    if valid + test >= 1.0:
        raise ConfigError(f"valid + test fractions must be below 1, got {valid} + {test}")
    groups: dict[str, list[int]] = {}
    for i, (src, tgt) in enumerate(pairs):
        groups.setdefault(src if by_source else f"{src}\t{tgt}", []).append(i)
    order = sorted(groups, key=lambda k: (stable_hash(k, seed), k))
    n = len(pairs)
    want = {"test": test * n, "valid": valid * n}
    got = {"test": 0, "valid": 0}
    where: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for k in order:
        members = groups[k]
        name = next((s for s in ("test", "valid") if got[s] < want[s]), "train")
        if name != "train":
            got[name] += len(members)
        where[name].extend(members)
    if not where["train"]:
        raise InputError(
            f"too few pairs to split: {n} pair(s) in {len(groups)} group(s) leave no training "
            "pair; lower the valid/test fractions"
        )
    pick = {s: [pairs[i] for i in sorted(idx)] for s, idx in where.items()}
    return PairSplits(train=pick["train"], valid=pick["valid"], test=pick["test"])


def group_references(pairs: Sequence[Pair]) -> tuple[list[str], list[list[str]]]:
    """Distinct sources in first-seen order, each with all its targets (for multi-reference
    BLEU: Tatoeba has several translations of many sentences)."""
    refs: dict[str, list[str]] = {}
    for src, tgt in pairs:
        refs.setdefault(src, []).append(tgt)
    return list(refs), list(refs.values())
