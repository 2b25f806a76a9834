"""The standard intrinsic evaluations of word vectors, computed as gensim's ``KeyedVectors``
does (``evaluate_word_pairs``, ``evaluate_word_analogies``), so the numbers are comparable.

* **Word similarity** (WordSim-353, Finkelstein et al. 2002; SimLex-999, Hill et al. 2015):
  lines ``word1<TAB>word2<TAB>score`` (``#`` lines are comments); Spearman's rank
  correlation (and Pearson's) between the human scores and the cosines of the pairs whose
  two words are both among the first ``restrict`` words; pairs with an unknown word are
  skipped and counted as out of vocabulary.
* **Analogies** (the Google analogy questions of Mikolov et al. 2013, ``questions-words.txt``):
  ``: section`` headers, then ``a b c d`` lines; the answer to ``a : b :: c : ?`` is the word
  nearest to ``b - a + c`` among the first ``restrict`` words, leaving out ``a, b, c``
  (3CosAdd); accuracy is correct / answered, questions with an unknown word skipped.

Words are compared case-insensitively (upper-cased; the first, most frequent, of several
case variants wins). The three files ship in the ``gensim`` package's test data
(``gensim/test/test_data/``); :func:`dataset_path` finds them in the installed package.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.fileio import read_file_text
from attnlm.word2vec.vectors import WordVectors

RESTRICT = 300_000  # gensim's default restrict_vocab
DATASETS = {
    "wordsim353": "wordsim353.tsv",
    "simlex999": "simlex999.txt",
    "google-analogies": "questions-words.txt",
}


def dataset_path(name: str) -> Path:
    """The file of a dataset (``wordsim353``, ``simlex999``, ``google-analogies``) inside
    the installed ``gensim`` package; an :class:`InputError` saying how to get it when gensim
    is not installed."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"the {name} file ships with the gensim package (gensim/test/test_data/), which is "
            "not installed: pip install gensim, or pass the file's path"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data"
    path /= DATASETS[name]
    if not path.is_file():
        raise InputError(f"{path} is missing from the installed gensim package")
    return path


def _case_index(vectors: WordVectors, restrict: int | None) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, w in enumerate(vectors.words[:restrict]):
        index.setdefault(w.upper(), i)
    return index


@dataclass
class PairsResult:
    """``spearman``, ``pearson``, the pairs used and skipped (out of vocabulary)."""

    spearman: float
    pearson: float
    pairs: int
    oov: int

    @property
    def oov_ratio(self) -> float:
        return 100.0 * self.oov / max(self.pairs + self.oov, 1)


def evaluate_word_pairs(
    vectors: WordVectors, path: str | os.PathLike[str], restrict: int | None = RESTRICT
) -> PairsResult:
    """Spearman and Pearson correlation of cosines with human similarity scores."""
    index = _case_index(vectors, restrict)
    gold, model = [], []
    oov = 0
    for line in read_file_text(path).splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.upper().split("\t")
        if len(parts) != 3:
            continue
        try:
            score = float(parts[2])
        except ValueError:
            continue
        a, b = parts[0], parts[1]
        if a not in index or b not in index:
            oov += 1
            continue
        gold.append(score)
        model.append(float(vectors.unit[index[a]] @ vectors.unit[index[b]]))
    if len(gold) < 2:
        raise InputError(f"{path}: fewer than 2 word pairs with both words in the vocabulary")
    return PairsResult(spearman(gold, model), pearson(gold, model), len(gold), oov)


def pearson(x: list[float], y: list[float]) -> float:
    """Pearson's correlation coefficient of two equally long samples."""
    return float(
        np.corrcoef(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))[0, 1]
    )


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation: Pearson's on the ranks, tied values sharing their average
    rank (the definition ``scipy.stats.spearmanr`` and gensim use)."""
    return pearson(_average_ranks(x), _average_ranks(y))


def _average_ranks(values: list[float]) -> list[float]:
    a = np.asarray(values, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(1, len(a) + 1)
    _, first, counts = np.unique(a[order], return_index=True, return_counts=True)
    for start, n in zip(first, counts):
        if n > 1:  # a tie: every member gets the mean of the ranks it spans
            ranks[order[start : start + n]] = start + (n + 1) / 2
    return ranks.tolist()


@dataclass
class AnalogyResult:
    """Per section ``(name, correct, answered)``; totals; questions skipped (unknown words)."""

    sections: list[tuple[str, int, int]] = field(default_factory=list)
    oov: int = 0

    @property
    def correct(self) -> int:
        return sum(c for _, c, _ in self.sections)

    @property
    def answered(self) -> int:
        return sum(n for _, _, n in self.sections)

    @property
    def accuracy(self) -> float:
        return self.correct / self.answered if self.answered else 0.0


def evaluate_word_analogies(
    vectors: WordVectors, path: str | os.PathLike[str], restrict: int | None = RESTRICT
) -> AnalogyResult:
    """Accuracy on ``a b c d`` analogy questions (3CosAdd, see the module docstring)."""
    index = _case_index(vectors, restrict)
    end = min(restrict or len(vectors), len(vectors))
    unit = vectors.unit[:end]
    # each row's case-insensitive word, as the row of its first variant
    canon = np.array([index[w.upper()] for w in vectors.words[:end]], dtype=np.int64)
    result = AnalogyResult()
    questions: list[tuple[int, int, int, int]] = []
    name = None

    def close() -> None:
        if name is not None:
            result.sections.append((name, _solve(unit, canon, questions), len(questions)))

    for k, line in enumerate(read_file_text(path).splitlines(), 1):
        if line.startswith(": "):
            close()
            name, questions = line[2:].strip(), []
            continue
        words = line.upper().split()
        if len(words) != 4:
            continue
        if name is None:
            raise InputError(f"{path}: line {k}: a question before any ': section' line")
        if not all(w in index for w in words):
            result.oov += 1
            continue
        questions.append(tuple(index[w] for w in words))  # type: ignore[arg-type]
    close()
    return result


def _solve(
    unit: np.ndarray,
    canon: np.ndarray,
    questions: list[tuple[int, int, int, int]],
    chunk: int = 256,
) -> int:
    """How many of ``questions`` 3CosAdd answers right: batched ``most_similar([b, c], [a])``,
    the best word that is not (in any case variant) a, b or c."""
    correct = 0
    for s in range(0, len(questions), chunk):
        q = np.array(questions[s : s + chunk], dtype=np.int64).reshape(-1, 4)
        a, b, c, d = q.T
        query = (unit[b] + unit[c] - unit[a]) / 3.0
        query /= np.maximum(np.linalg.norm(query, axis=1, keepdims=True), 1e-30)
        cos = query.astype(np.float32) @ unit.T  # (n, V)
        asked = (canon[None, :] == a[:, None]) | (canon[None, :] == b[:, None])
        cos[asked | (canon[None, :] == c[:, None])] = -np.inf
        correct += int((canon[cos.argmax(1)] == d).sum())
    return correct


def evaluate_all(
    vectors: WordVectors, paths: dict[str, Any] | None = None, restrict: int | None = RESTRICT
) -> dict[str, Any]:
    """WordSim-353 and SimLex-999 (Spearman, Pearson, pairs, OOV %) and the Google analogies
    (accuracy, correct, answered, skipped), as one JSON-ready dict; ``paths`` overrides the
    dataset files (keys as :data:`DATASETS`)."""
    paths = dict(paths or {})
    out: dict[str, Any] = {}
    for name in ("wordsim353", "simlex999"):
        r = evaluate_word_pairs(vectors, paths.get(name) or dataset_path(name), restrict)
        out[name] = {
            "spearman": round(r.spearman, 6),
            "pearson": round(r.pearson, 6),
            "pairs": r.pairs,
            "oov_pairs": r.oov,
            "oov_percent": round(r.oov_ratio, 2),
        }
    name = "google-analogies"
    a = evaluate_word_analogies(vectors, paths.get(name) or dataset_path(name), restrict)
    out[name] = {
        "accuracy": round(a.accuracy, 6),
        "correct": a.correct,
        "answered": a.answered,
        "oov_questions": a.oov,
        "sections": [{"section": s, "correct": c, "answered": n} for s, c, n in a.sections],
    }
    return out
