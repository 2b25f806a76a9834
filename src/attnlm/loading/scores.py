"""Translation scores: corpus BLEU and chrF, computed by ``sacrebleu``.

Only sacrebleu's metric classes are used, never its test-set downloads. Both functions take
the system's outputs (one string per sentence, detokenized text) and, for each, its reference
or references, and return plain numbers with sacrebleu's signature string, which records the
settings so that scores are comparable.

* BLEU (Papineni et al. 2002): geometric mean of the modified (clipped) 1..4-gram precisions
  over the whole corpus times the brevity penalty ``exp(1 - r/c)`` when the output length ``c``
  is below the (closest) reference length ``r``; on a 0..100 scale. Defaults are sacrebleu's:
  the ``13a`` tokenizer (mteval-v13a), case-sensitive, ``exp`` smoothing (which only matters
  when some precision is zero).
* chrF (Popović 2015): character n-gram F-score (n = 1..6, beta = 2, spaces removed), from
  corpus-summed counts; ``word_order=2`` gives chrF++. 0..100.

Multiple references: ``references[i]`` may be a list of strings (any number per sentence,
at least one), e.g. from :func:`attnlm.data.pairs.group_references`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from attnlm.base.errors import ConfigError, InputError

References = Sequence[str] | Sequence[Sequence[str]]


@dataclass(frozen=True)
class BleuScore:
    """Corpus BLEU (0..100) with its parts: ``precisions`` (modified 1..4-gram precisions in
    percent), ``brevity_penalty``, ``hyp_len`` / ``ref_len`` (tokens after the metric's
    tokenizer) and their ``length_ratio``; ``signature`` is sacrebleu's settings string."""

    score: float
    precisions: tuple[float, ...]
    brevity_penalty: float
    length_ratio: float
    hyp_len: int
    ref_len: int
    signature: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["precisions"] = list(self.precisions)
        return d


@dataclass(frozen=True)
class ChrfScore:
    """Corpus chrF (0..100; chrF++ when ``word_order`` is 2) and sacrebleu's signature."""

    score: float
    char_order: int
    word_order: int
    beta: int
    signature: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _streams(hypotheses: Sequence[str], references: References) -> list[list[str | None]]:
    """sacrebleu's layout: one stream per reference position, ``None`` where a sentence has
    fewer references than others."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise InputError("hypotheses and references must be lists of sentences, not one string")
    if len(hypotheses) != len(references):
        raise InputError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; "
            "need one entry (a string or a list of strings) per hypothesis"
        )
    if not hypotheses:
        raise InputError("no sentences to score")
    for i, h in enumerate(hypotheses):
        if not isinstance(h, str):
            raise InputError(f"hypothesis {i} is a {type(h).__name__}, not a string")
    per: list[list[str]] = []
    for i, r in enumerate(references):
        refs = [r] if isinstance(r, str) else list(r)
        if not refs or not all(isinstance(x, str) for x in refs):
            raise InputError(f"reference {i} must be a string or a non-empty list of strings")
        per.append(refs)
    width = max(map(len, per))
    return [[refs[k] if k < len(refs) else None for refs in per] for k in range(width)]


def corpus_bleu(
    hypotheses: Sequence[str],
    references: References,
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    smooth: str = "exp",
) -> BleuScore:
    """Corpus BLEU of ``hypotheses`` against ``references`` (see the module docstring).

    ``tokenize``: a sacrebleu tokenizer name (``13a``, ``intl``, ``char``, ``none``, ...);
    ``smooth``: ``exp``, ``floor``, ``add-k`` or ``none``.
    """
    from sacrebleu.metrics import BLEU

    streams = _streams(hypotheses, references)
    if smooth not in BLEU.SMOOTH_DEFAULTS:
        raise ConfigError(f"unknown BLEU smoothing {smooth!r} ({', '.join(BLEU.SMOOTH_DEFAULTS)})")
    if tokenize not in BLEU.TOKENIZERS:
        raise ConfigError(
            f"unknown BLEU tokenizer {tokenize!r} ({', '.join(sorted(BLEU.TOKENIZERS))})"
        )
    metric = BLEU(tokenize=tokenize, lowercase=lowercase, smooth_method=smooth)
    s = metric.corpus_score(list(hypotheses), streams)
    return BleuScore(
        score=float(s.score),
        precisions=tuple(float(p) for p in s.precisions),
        brevity_penalty=float(s.bp),
        length_ratio=float(s.ratio),
        hyp_len=int(s.sys_len),
        ref_len=int(s.ref_len),
        signature=str(metric.get_signature()),
    )


def corpus_chrf(
    hypotheses: Sequence[str],
    references: References,
    *,
    word_order: int = 0,
    char_order: int = 6,
    beta: int = 2,
    lowercase: bool = False,
) -> ChrfScore:
    """Corpus chrF of ``hypotheses`` against ``references``; ``word_order=2`` for chrF++."""
    from sacrebleu.metrics import CHRF

    streams = _streams(hypotheses, references)
    for what, v, lo in (("word_order", word_order, 0), ("char_order", char_order, 1)):
        if not isinstance(v, int) or v < lo:
            raise ConfigError(f"chrF {what} must be an integer >= {lo}, got {v!r}")
    metric = CHRF(char_order=char_order, word_order=word_order, beta=beta, lowercase=lowercase)
    s = metric.corpus_score(list(hypotheses), streams)
    return ChrfScore(
        score=float(s.score),
        char_order=char_order,
        word_order=word_order,
        beta=beta,
        signature=str(metric.get_signature()),
    )


def translation_scores(hypotheses: Sequence[str], references: References) -> dict[str, Any]:
    """BLEU and chrF with default settings as one JSON-ready dict (for ``attnlm eval
    --json``): ``{"bleu": .., "chrf": .., "bleu_signature": .., "chrf_signature": ..,
    "sentences": ..}``."""
    bleu = corpus_bleu(hypotheses, references)
    chrf = corpus_chrf(hypotheses, references)
    return {
        "bleu": bleu.score,
        "chrf": chrf.score,
        "bleu_signature": bleu.signature,
        "chrf_signature": chrf.signature,
        "sentences": len(hypotheses),
    }
