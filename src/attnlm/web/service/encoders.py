"""The explorer's encoder views, each answering for one
:class:`~attnlm.web.service.model.ModelService`: a word's contextual vectors drifting apart
across layers, beside its one static word2vec vector (:func:`embeddings`), and BERT's masked
tokens (:func:`fill_mask`). ``service`` is always a ``ModelService`` (not imported: the service
imports this module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnlm.base.errors import InputError
from attnlm.web.service.limits import MAX_TOP_K, NotSupportedError, ServiceError
from attnlm.web.service.spans import find_word, token_spans


def embeddings(service: Any, word: str, sentences: Sequence[str]) -> dict[str, Any]:
    """Cosine similarity of ``word``'s contextual vectors in two sentences, per layer.

    The word's vector in a sentence is the mean hidden state of the tokens overlapping its
    first whole-word occurrence; index 0 is the embedding layer, ``i`` the output of block
    ``i`` (``L + 1`` values).
    """
    import torch

    if service.translates:
        raise NotSupportedError(
            f"embeddings are not served for translation models ({service.name}, family "
            f"{service.family})"
        )
    if not isinstance(word, str) or not word.strip():
        raise ServiceError("word must be a non-empty string")
    if len(sentences) != 2:
        raise ServiceError("sentences must hold exactly two sentences")
    vectors, found = [], []
    for n, sentence in enumerate(sentences, 1):
        service._check_text(sentence, f"sentence {n}")
        start, end = find_word(sentence, word.strip(), n)
        rec = service._inspect(sentence)
        spans = token_spans(service.tokenizer, sentence, rec.ids)
        pos = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
        if not pos:
            raise ServiceError(f"no token of sentence {n} covers the word {word!r}")
        vectors.append([h[pos].mean(0) for h in rec.hidden])  # (L + 1) x (C,)
        found.append({"positions": pos, "tokens": [rec.tokens[i] for i in pos]})
    cos = [
        float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        for a, b in zip(vectors[0], vectors[1])
    ]
    out = {"word": word.strip(), "cosine": [round(c, 6) for c in cos], "found": found}
    if service.static_vectors is not None:
        out["static"] = _static(service, word.strip(), sentences)
    return out


def _static(service: Any, word: str, sentences: Sequence[str]) -> dict[str, Any]:
    """The word2vec half of the lesson: one vector per word type, so the cosine between
    its two "sentences" is 1 whatever the context; its nearest words (or why there are
    none)."""
    from attnlm.inspect.contextual import static_word

    try:
        st = static_word(service.static_vectors, word, list(sentences))
    except InputError as e:
        return {"word": word, "error": str(e)}
    return {
        "word": st.word,
        "cosine": round(float(st.cosine()[0, 1]), 6),
        "neighbours": [[w, round(float(c), 4)] for w, c in st.neighbours],
    }


def fill_mask(service: Any, text: str, k: int = 5) -> dict[str, Any]:
    """The ``k`` most likely tokens at every ``[MASK]`` of ``text`` with their softmax
    probabilities (:func:`attnlm.inspect.fill_mask.fill_mask`), and the text with each
    mask replaced by its top token."""
    from attnlm.inspect.fill_mask import fill_mask, filled_text

    service.require("fill-mask")
    if not 1 <= k <= MAX_TOP_K:
        raise ServiceError(f"k must be between 1 and {MAX_TOP_K}")
    ids = service.encode(text)
    try:
        with service._lock:
            preds = fill_mask(service.model, service.tokenizer, text, k)
    except InputError as e:  # no [MASK], no masked-LM head
        raise ServiceError(str(e)) from None
    return {
        "text": text,
        "filled": filled_text(service.tokenizer, text, preds),
        "k": k,
        "tokens": service.token_strings(ids),
        "masks": [p.to_dict() for p in preds],
    }
