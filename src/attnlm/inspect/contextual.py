"""How one word's vector changes with its context, layer by layer.

:func:`contextual_word`: a word's vector at every layer (layer 0 = the embedding output) in
each sentence, read from the shared :func:`~attnlm.inspect.record.inspect` record's hidden
states; a word split into several pieces is represented by the **mean of its pieces'
vectors**. The cosine matrix between sentences per layer shows "bank" (river) and "bank"
(money) start alike and drift apart; the static input-embedding row (the same in every
sentence) is the reference each layer's vector is compared with. For a causal model (GPT)
each vector sees only the tokens to its left. :func:`static_word` gives word2vec's one vector
per word beside it. Masked-token predictions are :mod:`attnlm.inspect.fill_mask`, sentence
embeddings :mod:`attnlm.inspect.embeddings`.

Shapes: ``N`` sentences, ``C`` model width, ``L`` layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.base.errors import InputError
from attnlm.inspect.base import family_or_none
from attnlm.inspect.embeddings import cosine_matrix
from attnlm.inspect.record import inspect


@dataclass
class ContextualResult:
    """One word in N sentences: ``vectors[layer]`` ``(N, C)`` (layer 0 = embedding output,
    each the mean over the word's pieces), ``pieces`` (the word's tokens in each sentence),
    ``static`` ``(C,)`` the mean input-embedding row of the pieces of the first sentence,
    ``left_context_only`` for causal models."""

    word: str
    sentences: list[str]
    pieces: list[list[str]]
    vectors: list[Tensor]
    static: Tensor | None
    left_context_only: bool
    family: str
    notes: list[str] = field(default_factory=list)

    def cosines(self) -> list[Tensor]:
        """Per layer the ``(N, N)`` cosine matrix between the sentences' vectors."""
        return [cosine_matrix(v) for v in self.vectors]

    def static_cosines(self) -> list[Tensor] | None:
        """Per layer the ``(N,)`` cosine of each sentence's vector with the static row."""
        if self.static is None:
            return None
        s = nn.functional.normalize(self.static.float(), dim=0)
        return [nn.functional.normalize(v.float(), dim=1) @ s for v in self.vectors]

    def to_json(self, digits: int = 6) -> dict[str, Any]:
        """``{"word", "family", "pooling", "left_context_only", "sentences", "pieces",
        "layers": [{"layer", "cosine": [[...]], "cosine_to_static": [...]}]}``."""
        statics = self.static_cosines()
        layers = []
        for k, c in enumerate(self.cosines()):
            row: dict[str, Any] = {"layer": k, "cosine": torch.round(c, decimals=digits).tolist()}
            if statics is not None:
                row["cosine_to_static"] = torch.round(statics[k], decimals=digits).tolist()
            layers.append(row)
        return {
            "word": self.word,
            "family": self.family,
            "pooling": "mean over the word's pieces",
            "left_context_only": self.left_context_only,
            "sentences": self.sentences,
            "pieces": self.pieces,
            "layers": layers,
        }


def _word_candidates(tokenizer: Any, word: str) -> list[list[int]]:
    cands = []
    for form in (word, " " + word):
        try:
            ids = list(tokenizer.encode(form))
        except Exception:  # noqa: BLE001 - a form the tokenizer cannot encode
            continue
        if ids and ids not in cands:
            cands.append(ids)
    return cands


def find_word(tokenizer: Any, ids: list[int], word: str) -> tuple[int, int] | None:
    """``(start, end)`` of the first occurrence of ``word``'s pieces in ``ids`` (a match
    followed by a ``##`` continuation is part of a longer word and is skipped)."""
    prefix = getattr(tokenizer, "continuing_prefix", None)
    vocab = getattr(tokenizer, "vocab", None)
    for cand in _word_candidates(tokenizer, word):
        n = len(cand)
        for s in range(len(ids) - n + 1):
            if ids[s : s + n] != cand:
                continue
            if prefix and vocab and s + n < len(ids) and vocab[ids[s + n]].startswith(prefix):
                continue
            return s, s + n
    return None


def token_embedding(model: Any) -> nn.Embedding | None:
    """The model's input token-embedding table (``tok_emb``, ``embeddings.tok``, or the one
    embedding with ``vocab_size`` rows)."""
    for path in ("tok_emb", "embeddings.tok"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.Embedding):
            return obj
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    found = [
        m for m in model.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == vocab
    ]
    return found[0] if len(found) == 1 else None


def contextual_word(
    model: Any, tokenizer: Any, word: str, sentences: list[str]
) -> ContextualResult:
    """``word``'s vector at every layer in each of ``sentences`` (see the module
    docstring); a sentence without the word is an InputError naming it."""
    if not word.strip():
        raise InputError("--word must not be empty")
    if len(sentences) < 2:
        raise InputError("give at least two sentences to compare")
    vectors_per_sentence = []
    pieces = []
    first_ids: list[int] | None = None
    family = ""
    for k, s in enumerate(sentences, 1):
        rec = inspect(model, tokenizer, s)
        family = rec.family
        span = find_word(tokenizer, rec.ids, word)
        if span is None:
            raise InputError(f"sentence {k} ({s!r}) does not contain the word {word!r}")
        a, b = span
        if first_ids is None:
            first_ids = rec.ids[a:b]
        if not rec.hidden_states:
            raise InputError(f"{family} models return no hidden states")
        vectors_per_sentence.append([h[a:b].mean(0) for h in rec.hidden_states])  # L+1 x (C,)
        pieces.append(rec.tokens[a:b])
    n_layers = len(vectors_per_sentence[0])
    vectors = [torch.stack([v[layer] for v in vectors_per_sentence]) for layer in range(n_layers)]
    emb = token_embedding(model)
    static = None
    if emb is not None and first_ids:
        idx = torch.tensor(first_ids, device=emb.weight.device)
        static = emb.weight.detach()[idx].mean(0).float().cpu()
    fam = family_or_none(model)
    causal = fam is not None and fam.objective == "causal"
    return ContextualResult(word, list(sentences), pieces, vectors, static, causal, family)


@dataclass
class StaticWord:
    """The word2vec side of the lesson: ``word``'s one static vector looked up in each of N
    sentences (``vectors`` ``(N, dim)``: the same row every time, so every cosine between
    sentences is 1.0) and its ``neighbours`` (word, cosine) in the vectors file."""

    word: str
    vectors: Tensor
    neighbours: list[tuple[str, float]]

    def cosine(self) -> Tensor:
        return cosine_matrix(self.vectors)

    def to_json(self, digits: int = 6) -> dict[str, Any]:
        """``{"word", "dim", "cosine": [[...]], "neighbours": [{"word", "cosine"}]}``."""
        return {
            "word": self.word,
            "dim": int(self.vectors.shape[1]),
            "cosine": torch.round(self.cosine(), decimals=digits).tolist(),
            "neighbours": [{"word": w, "cosine": round(c, digits)} for w, c in self.neighbours],
        }

    def lines(self) -> list[str]:
        n = self.vectors.shape[0]
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        c = self.cosine()
        cos = " ".join(f"cos(S{i + 1},S{j + 1}) {float(c[i, j]):.3f}" for i, j in pairs)
        near = ", ".join(f"{w} {v:.3f}" for w, v in self.neighbours)
        return [
            f"word2vec (static, dim {self.vectors.shape[1]}): one vector for {self.word!r} in "
            f"every sentence: {cos}",
            f"  nearest words: {near}",
        ]


def static_word(vectors: Any, word: str, sentences: list[str], top: int = 8) -> StaticWord:
    """``word``'s word2vec vector (:class:`attnlm.word2vec.WordVectors`; the word as given,
    else lower-cased) in each of ``sentences`` (each must contain it) and its ``top``
    nearest words."""
    from attnlm.word2vec.vocab import words_of

    key = word if word in vectors else word.lower()
    if key not in vectors:
        raise InputError(f"{word!r} has no word2vec vector in the --vectors file")
    rows = []
    for k, s in enumerate(sentences, 1):
        if key.lower() not in words_of(s):
            raise InputError(f"sentence {k} ({s!r}) does not contain the word {word!r}")
        rows.append(torch.from_numpy(vectors.vector(key).copy()))  # one row per word type
    return StaticWord(key, torch.stack(rows), vectors.most_similar([key], top=top))


def format_table(result: ContextualResult, max_layers: int | None = None) -> list[str]:
    """The cosine-vs-layer table as text lines: one row per layer, one column per sentence
    pair, and the mean cosine of the sentences' vectors with the static embedding row."""
    n = len(result.sentences)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    where = "; ".join(f"S{k + 1}: {' '.join(p)}" for k, p in enumerate(result.pieces))
    lines = [f"word {result.word!r}; pieces: {where}"]
    lines.append(
        "pooling: a word split into several pieces is the mean of its pieces' vectors; "
        "layer 0 = embedding output"
    )
    if result.left_context_only:
        lines.append(
            f"note: {result.family} is a causal model: each vector sees only the tokens to "
            "its left (left context only)"
        )
    head = "layer " + " ".join(f"cos(S{i + 1},S{j + 1})" for i, j in pairs)
    statics = result.static_cosines()
    if statics is not None:
        head += "  cos-to-static(mean)"
    lines.append(head)
    cosines = result.cosines()
    shown = range(len(cosines)) if max_layers is None else range(min(max_layers, len(cosines)))
    for layer in shown:
        c = cosines[layer]
        row = f"{layer:>5} " + " ".join(f"{float(c[i, j]):>11.3f}" for i, j in pairs)
        if statics is not None:
            row += f"  {float(statics[layer].mean()):>19.3f}"
        lines.append(row)
    if statics is not None:
        lines.append(
            "static input-embedding row: the same vector in every sentence (cosine 1.000 "
            "between sentences at any layer)"
        )
    return lines


def plot_contextual(result: ContextualResult, path: str | Path) -> Path:
    """PNG of cosine vs layer: one line per sentence pair, and the mean cosine with the
    static embedding row (dashed)."""
    from attnlm.inspect.heatmap import _pyplot, _save

    plt = _pyplot()
    n = len(result.sentences)
    cosines = result.cosines()
    layers = list(range(len(cosines)))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i in range(n):
        for j in range(i + 1, n):
            ax.plot(layers, [float(c[i, j]) for c in cosines], marker="o",
                    label=f"S{i + 1} vs S{j + 1}")  # fmt: skip
    statics = result.static_cosines()
    if statics is not None:
        ax.plot(layers, [float(s.mean()) for s in statics], "k--", label="vs static embedding")
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel("cosine")
    side = " (left context only)" if result.left_context_only else ""
    ax.set_title(f"{result.word!r} across contexts{side}")
    ax.set_xticks(layers)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)
