"""n-gram language models in back-off form, scoring (KenLM ``query`` convention), sampling and
a binary save/load.

:class:`BackoffModel` is the ARPA model: for each order k a table of n-grams with
log10 p(wk | w1 .. wk-1) and, below the highest order, a log10 back-off weight. A query for
``w`` after context ``h`` uses the longest n-gram ``h' w`` in the table (``h'`` a suffix of
``h``) and adds the back-off weights of the contexts longer than ``h'`` that are in the table
(absent contexts weigh log10 1 = 0), exactly as KenLM's ``query`` and SRILM do. Modified
Kneser-Ney, maximum likelihood, stupid backoff and ARPA files all load into this one class.
:class:`AddKModel` (add-k / Laplace) is not a back-off model and keeps its counts.

Scoring (KenLM convention): ``<s>`` is context only, ``</s>`` is predicted and counted, an
unknown word is scored as ``<unk>``. Perplexity = 10 ** (-sum log10 p / N); "excluding OOV"
removes the unknown tokens from the sum and from N. With ``pad="nltk"`` sentences are padded
with n-1 ``<s>`` and n-1 ``</s>`` (NLTK's ``pad_both_ends``) and every token after the leading
``<s>`` markers is predicted.

Shape legend: T = tokens of the scored text (with markers), V = vocabulary size, n_k = number of
order-k n-grams.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.fileio import atomic_open
from attnlm.ngram.counts import (
    BOS,
    Encoded,
    Vocabulary,
    encode_sentences,
    lookup,
    split_sentences,
)

FORMAT = "attnlm-ngram"
FORMAT_VERSION = 1
LN10 = math.log(10.0)


@dataclass(frozen=True)
class ScoreResult:
    """Perplexity report of a model on a text (KenLM ``query`` figures).

    ``tokens`` counts every predicted token including one ``</s>`` per sentence and the OOV
    tokens; ``logprob`` is the total log10 probability; ``chars`` is the number of characters of
    the scored text (for bits per character, ``bpc = -logprob * log2(10) / chars``).
    """

    ppl: float
    ppl_excl_oov: float
    oov: int
    tokens: int
    sentences: int
    logprob: float
    logprob_excl_oov: float
    chars: int | None = None

    @property
    def bpc(self) -> float | None:
        if not self.chars:
            return None
        return -self.logprob * math.log2(10.0) / self.chars

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bpc"] = self.bpc
        return d


def _ppl(logprob: float, n: int) -> float:
    if n == 0:
        return float("nan")
    if logprob == -math.inf:
        return math.inf
    return 10.0 ** (-logprob / n)


class NgramModel:
    """Common interface: vocabulary, order, log10 probabilities of token streams, scoring,
    distributions over the vocabulary, sampling."""

    vocab: Vocabulary
    order: int
    smoothing: str
    pad: str
    normalized: bool = True

    # -- subclasses implement -------------------------------------------------------------
    def _logprob_positions(self, tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """(T,) log10 p of each token given the tokens before it in its sentence."""
        raise NotImplementedError

    def _context_logprobs(self, context: np.ndarray) -> np.ndarray:
        """(V,) log10 p(w | context) for every word id w (``context``: ids, most recent last)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------
    def encode(self, sentences: Sequence[Sequence[str]], pad: str | None = None) -> Encoded:
        """Sentences (token lists) as a flat id array with markers, for this model."""
        return encode_sentences(sentences, self.vocab, self.order, pad or self.pad)

    def sentence_logprobs(
        self, sentences: Sequence[Sequence[str]], pad: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """log10 p of every predicted token, and whether it is OOV (both (T',))."""
        enc = self.encode(sentences, pad)
        lp = self._logprob_positions(enc.tokens, enc.pos)
        return lp[enc.predict], enc.tokens[enc.predict] == self.vocab.unk

    def score_sentences(
        self, sentences: Sequence[Sequence[str]], pad: str | None = None, chars: int | None = None
    ) -> ScoreResult:
        """Perplexity including and excluding OOV tokens, OOV count and token count."""
        if not sentences:
            raise InputError("nothing to score: the text has no non-blank line")
        lp, oov = self.sentence_logprobs(sentences, pad)
        total = float(lp.sum())
        excl = float(lp[~oov].sum())
        n, n_oov = len(lp), int(oov.sum())
        return ScoreResult(
            ppl=_ppl(total, n),
            ppl_excl_oov=_ppl(excl, n - n_oov),
            oov=n_oov,
            tokens=n,
            sentences=len(sentences),
            logprob=total,
            logprob_excl_oov=excl,
            chars=chars,
        )

    def score_text(self, text: str, tokenize: bool = False, pad: str | None = None) -> ScoreResult:
        """Score a text with one sentence per line (see :func:`split_sentences`)."""
        return self.score_sentences(split_sentences(text, tokenize), pad, chars=len(text))

    def logprob(self, word: str, context: Sequence[str] = ()) -> float:
        """log10 p(word | context); the context is words, most recent last (may start with
        ``<s>``; only the last order-1 words matter)."""
        ctx = self.vocab.encode(list(context)[-(self.order - 1) :] if self.order > 1 else [])
        return float(self._context_logprobs(ctx)[self.vocab.encode([word])[0]])

    def distribution(self, context: Sequence[str] = ()) -> np.ndarray:
        """(V,) probabilities p(w | context) over the vocabulary ids; ``<s>`` gets 0 (it is
        never predicted). Sums to 1 for normalised models."""
        ctx = list(context)[-(self.order - 1) :] if self.order > 1 else []
        lp = self._context_logprobs(self.vocab.encode(ctx))
        p = np.power(10.0, lp)
        p[self.vocab.bos] = 0.0
        return p

    def sample(
        self,
        n: int = 1,
        seed: int | None = 0,
        temperature: float = 1.0,
        max_len: int = 50,
        allow_unk: bool = False,
        prefix: Sequence[str] = (),
    ) -> list[list[str]]:
        """Generate ``n`` sentences: start after ``<s>`` (and ``prefix``), draw each word from
        p(w | context) ** (1 / temperature) (renormalised), stop at ``</s>`` or after
        ``max_len`` words. ``<unk>`` is excluded unless ``allow_unk``."""
        from attnlm.base import validate

        n = validate.non_negative_int(n, "n")
        temperature = validate.positive_float(temperature, "temperature")  # no NaN / inf
        max_len = validate.positive_int(max_len, "max_len")
        rng = np.random.default_rng(None if seed is None else validate.seed(seed))
        words = self.vocab.words
        n_bos = 1 if self.pad == "kenlm" else max(self.order - 1, 1)
        out = []
        for _ in range(n):
            ctx = [BOS] * n_bos + list(prefix)
            sent: list[str] = list(prefix)
            while len(sent) < max_len:
                p = self.distribution(ctx)
                if not allow_unk:
                    p[self.vocab.unk] = 0.0
                if temperature != 1.0:  # relative to the likeliest word: a tiny one is greedy
                    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                        logp = np.log(p)
                        p = np.exp((logp - logp.max()) / temperature)
                s = p.sum()
                if not s > 0:
                    break
                w = int(rng.choice(len(p), p=p / s))
                if w == self.vocab.eos:
                    break
                sent.append(words[w])
                ctx.append(words[w])
            out.append(sent)
        return out

    def save(self, path: str | Path) -> None:
        raise NotImplementedError


class BackoffModel(NgramModel):
    """An n-gram model in back-off (ARPA) form.

    ``keys[k-1]`` (n_k,) sorted packed keys ``prefix_id * V + word`` (order 1: the word ids),
    ``logp[k-1]`` (n_k,) log10 p(wk | w1..wk-1), ``bo[k-1]`` (n_k,) log10 back-off weight of the
    n-gram as a context (0 = none; the highest order has none). Every order-k entry's prefix
    is an order-(k-1) entry (the ARPA reader adds missing ones, as KenLM does).
    """

    def __init__(
        self,
        vocab: Vocabulary,
        keys: list[np.ndarray],
        logp: list[np.ndarray],
        bo: list[np.ndarray],
        smoothing: str = "arpa",
        pad: str = "kenlm",
        normalized: bool = True,
        meta: dict | None = None,
    ) -> None:
        self.vocab = vocab
        self.keys = keys
        self.logp = logp
        self.bo = bo
        self.order = len(keys)
        self.smoothing = smoothing
        self.pad = pad
        self.normalized = normalized
        self.meta = dict(meta or {})

    @property
    def V(self) -> int:  # noqa: N802
        return len(self.vocab)

    def counts(self) -> list[int]:
        """Number of n-grams per order."""
        return [len(k) for k in self.keys]

    def _logprob_positions(self, tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
        V, N = self.V, self.order
        ids = [tokens]  # ids[k-1][i]: order-k n-gram ending at i, -1 if absent
        for k in range(2, N + 1):
            prev = np.full(tokens.shape, -1, dtype=np.int64)
            prev[1:] = ids[-1][:-1]
            prev[pos < k - 1] = -1
            ids.append(lookup(self.keys[k - 1], np.where(prev >= 0, prev * V + tokens, -1)))
        # context of length j for position i is the order-j n-gram ending at i-1
        ctxs = []
        for j in range(1, N):
            c = np.full(tokens.shape, -1, dtype=np.int64)
            c[1:] = ids[j - 1][:-1]
            c[pos < j] = -1
            ctxs.append(c)
        return self._combine(ids, ctxs)

    def _combine(self, ids: list[np.ndarray], ctxs: list[np.ndarray]) -> np.ndarray:
        """Back-off arithmetic: log p of the longest n-gram found plus the back-off weights of
        the longer contexts that exist."""
        N = self.order
        out = self.logp[0][ids[0]].astype(np.float64)
        longest = np.ones(ids[0].shape, dtype=np.int64)
        for k in range(2, N + 1):
            hit = ids[k - 1] >= 0
            out = np.where(hit, self.logp[k - 1][np.maximum(ids[k - 1], 0)], out)
            longest = np.where(hit, k, longest)
        for j in range(1, N):  # context length j backs off when the longest order <= j
            c = ctxs[j - 1]
            use = (c >= 0) & (longest <= j)
            out = out + np.where(use, self.bo[j - 1][np.maximum(c, 0)], 0.0)
        return out

    def context_ids(self, context: np.ndarray) -> list[np.ndarray]:
        """Ids of the context suffixes of length 1..N-1 (-1 where absent or too short)."""
        V, L = self.V, len(context)
        out = []
        for j in range(1, self.order):
            if j > L:
                out.append(np.int64(-1))
                continue
            cur = np.int64(context[L - j])
            for m in range(2, j + 1):
                cur = lookup(self.keys[m - 1], np.array([cur * V + context[L - j + m - 1]]))[0]
            out.append(np.int64(cur))
        return out

    def _context_logprobs(self, context: np.ndarray) -> np.ndarray:
        V = self.V
        words = np.arange(V, dtype=np.int64)
        cids = self.context_ids(np.asarray(context, dtype=np.int64))
        ids = [words]
        for k in range(2, self.order + 1):
            c = cids[k - 2]
            q = np.full(V, -1, dtype=np.int64) if c < 0 else c * V + words
            ids.append(lookup(self.keys[k - 1], q))
        ctxs = [np.full(V, c, dtype=np.int64) for c in cids]
        return self._combine(ids, ctxs)

    # -- binary format ----------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the model as an uncompressed ``.npz`` (numpy arrays + JSON header)."""
        arrays = {}
        header = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": "backoff",
            "order": self.order,
            "smoothing": self.smoothing,
            "pad": self.pad,
            "normalized": self.normalized,
            "meta": self.meta,
        }
        for k in range(self.order):
            arrays[f"keys{k + 1}"] = self.keys[k]
            arrays[f"logp{k + 1}"] = self.logp[k]
            arrays[f"bo{k + 1}"] = self.bo[k]
        _save_npz(path, header, self.vocab.words, arrays)


class AddKModel(NgramModel):
    """Add-k smoothing (Laplace for k = 1), Jurafsky & Martin ch. 3:
    p(w | h) = (C(h w) + k) / (C(h .) + k |V|), with h the whole available context (the last
    n-1 words, fewer at the start of a sentence) and |V| the words that can be predicted (the
    vocabulary with ``</s>`` and ``<unk>``, without ``<s>``). An unseen context gives the
    uniform distribution. C(h .) is the number of times h is followed by a word.

    Not a back-off model, so it has no ARPA form; it saves in the binary format.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        keys: list[np.ndarray],
        counts: list[np.ndarray],
        k: float,
        pad: str = "kenlm",
        meta: dict | None = None,
    ) -> None:
        if not k > 0:
            raise ConfigError(f"add-k needs k > 0, got {k}")
        self.vocab = vocab
        self.keys = keys
        self.counts = [c.astype(np.float64) for c in counts]
        self.order = len(keys)
        self.k = float(k)
        self.pad = pad
        self.smoothing = "addk"
        self.meta = dict(meta or {})
        V = len(vocab)
        # C(h .) per context: order-(j+1) counts summed by prefix; unigram context: all tokens
        self.ctx_total = []
        for j in range(1, self.order):
            self.ctx_total.append(
                np.bincount(keys[j] // V, weights=self.counts[j], minlength=len(keys[j - 1]))
            )
        uni = self.counts[0].copy()
        uni[vocab.bos] = 0.0
        self.counts[0] = uni
        self.n_pred = V - 1  # |V| without <s>

    def _logprob_positions(self, tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
        V, N = len(self.vocab), self.order
        ids = [tokens]
        for j in range(2, N + 1):
            prev = np.full(tokens.shape, -1, dtype=np.int64)
            prev[1:] = ids[-1][:-1]
            prev[pos < j - 1] = -1
            ids.append(lookup(self.keys[j - 1], np.where(prev >= 0, prev * V + tokens, -1)))
        # the order used is min(N, pos + 1): the whole context since the sentence start
        use = np.minimum(pos + 1, N)
        num = np.zeros(tokens.shape)
        den = np.zeros(tokens.shape)
        for j in range(1, N + 1):
            sel = use == j
            if j == 1:
                num[sel] = self.counts[0][tokens[sel]]
                den[sel] = self.counts[0].sum()
                continue
            gid = ids[j - 1][sel]
            num[sel] = np.where(gid >= 0, self.counts[j - 1][np.maximum(gid, 0)], 0.0)
            where = np.flatnonzero(sel)
            ctx = ids[j - 2][where - 1]
            den[sel] = np.where(ctx >= 0, self.ctx_total[j - 2][np.maximum(ctx, 0)], 0.0)
        p = (num + self.k) / (den + self.k * self.n_pred)
        p[tokens == self.vocab.bos] = 0.0
        with np.errstate(divide="ignore"):
            return np.log10(p)

    def _context_logprobs(self, context: np.ndarray) -> np.ndarray:
        V = len(self.vocab)
        words = np.arange(V, dtype=np.int64)
        L = min(len(context), self.order - 1)
        cid = np.int64(-1)
        if L == 0:
            num = self.counts[0]
            den = self.counts[0].sum()
        else:
            cid = np.int64(context[len(context) - L])
            for m in range(2, L + 1):
                cid = lookup(
                    self.keys[m - 1], np.array([cid * V + context[len(context) - L + m - 1]])
                )[0]
            if cid < 0:
                num, den = np.zeros(V), 0.0
            else:
                gid = lookup(self.keys[L], cid * V + words)
                num = np.where(gid >= 0, self.counts[L][np.maximum(gid, 0)], 0.0)
                den = self.ctx_total[L - 1][cid]
        p = (num + self.k) / (den + self.k * self.n_pred)
        p[self.vocab.bos] = 0.0
        with np.errstate(divide="ignore"):
            return np.log10(p)

    def save(self, path: str | Path) -> None:
        """Write the model as an uncompressed ``.npz`` (numpy arrays + JSON header)."""
        header = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": "addk",
            "order": self.order,
            "smoothing": "addk",
            "pad": self.pad,
            "k": self.k,
            "meta": self.meta,
        }
        arrays = {}
        for j in range(self.order):
            arrays[f"keys{j + 1}"] = self.keys[j]
            arrays[f"counts{j + 1}"] = self.counts[j]
        _save_npz(path, header, self.vocab.words, arrays)


def _save_npz(path: str | Path, header: dict, words: list[str], arrays: dict) -> None:
    vocab_blob = np.frombuffer("\n".join(words).encode("utf-8"), dtype=np.uint8)
    head = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    with atomic_open(path, "wb") as f:  # a kill mid-write leaves the old file
        np.savez(f, header=head, vocab=vocab_blob, **arrays)
