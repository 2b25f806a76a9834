"""The word2vec update of one batch, with its hand-written gradients: skip-gram
(:func:`batched_step` over :class:`Group` s of centre words that share a reach), CBOW
(:func:`cbow_step` over a :class:`CbowBatch`), and :func:`reference_step`, the same update one
centre word at a time that the tests hold both to (see :mod:`attnlm.word2vec.train`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Group:
    """The centre words of one batch that have reach ``r``. Skip-gram: ``contexts``
    ``(B, 2r)`` word ids (padding points at word 0) and ``valid`` ``(B, 2r)``. CBOW (the
    form :func:`reference_step` reads; :meth:`CbowBatch.as_group`): ``contexts`` flat
    ``(M,)`` with ``owner`` ``(M,)`` (the row of the centre word each belongs to).
    ``centres`` ``(B,)``, ``negatives`` ``(B, K)``."""

    centres: Tensor
    contexts: Tensor
    negatives: Tensor
    valid: Tensor | None = None
    owner: Tensor | None = None


def _loss_and_grad(s: Tensor, weight: Tensor, alpha: float) -> tuple[Tensor, float]:
    """For scores ``s`` whose last dimension is [centre word, noise words...]: the SGD step
    ``alpha * (label - sigmoid(s)) * weight`` and the summed loss ``-log sigmoid(+-s)``."""
    p = torch.sigmoid(s)
    p_label = p.clone()
    p_label[..., 1:] = 1.0 - p[..., 1:]
    loss = -float((torch.log(p_label.clamp_(min=1e-30)) * weight).sum())
    grad = p.neg_()
    grad[..., 0] += 1.0
    return grad.mul_(weight).mul_(alpha), loss


def batched_step(
    syn0: Tensor, syn1: Tensor, groups: Sequence[Group], alpha: float
) -> tuple[float, int]:
    """Apply one batch of skip-gram SGD updates in place; return (summed loss, predicted
    words)."""
    total_loss = 0.0
    total_n = 0
    dim = syn0.shape[1]
    for g in groups:
        assert g.valid is not None
        outputs = torch.cat([g.centres[:, None], g.negatives], dim=1)  # (B, 1+K)
        keep = torch.ones(outputs.shape, dtype=syn0.dtype)
        keep[:, 1:] = g.negatives != g.centres[:, None]  # a noise word equal to w is skipped
        u = syn1.index_select(0, outputs.view(-1)).view(*outputs.shape, dim)  # (B, 1+K, C)
        v = syn0.index_select(0, g.contexts.view(-1)).view(*g.contexts.shape, dim)
        s = torch.bmm(v, u.transpose(1, 2))  # (B, 2r, 1+K)
        weight = g.valid.to(syn0.dtype)[:, :, None] * keep[:, None, :]
        grad, loss = _loss_and_grad(s, weight, alpha)
        total_n += int(g.valid.sum())
        syn0.index_add_(0, g.contexts.view(-1), torch.bmm(grad, u).view(-1, dim))
        du = torch.bmm(grad.transpose(1, 2), v)  # (B, 1+K, C)
        total_loss += loss
        syn1.index_add_(0, outputs.view(-1), du.view(-1, dim))
    return total_loss, total_n


@dataclass
class CbowBatch:
    """The centre words of one CBOW batch, sorted by their number of context words (most
    first) so that the ``j``-th context words of all rows are one contiguous run:
    ``centres`` ``(B,)``; ``counts`` ``(B,)`` context words each; ``contexts`` ``(M,)`` row by
    row from ``offsets`` ``(B,)`` (``embedding_bag``'s input); ``columns`` ``(M,)`` the same
    words column by column (the ``j``-th context words of rows ``0..widths[j]``, then the
    ``j+1``-th...); ``negatives`` ``(B / share, K)``: each run of ``share`` consecutive rows
    shares its ``K`` noise words."""

    centres: Tensor
    counts: Tensor
    contexts: Tensor
    offsets: Tensor
    columns: Tensor
    widths: list[int]
    negatives: Tensor

    def as_group(self) -> Group:
        """The same batch as one CBOW :class:`Group` for :func:`reference_step` (each row
        with its own copy of its run's noise words)."""
        share = len(self.centres) // len(self.negatives)
        owner = torch.repeat_interleave(torch.arange(len(self.centres)), self.counts)
        negatives = self.negatives.repeat_interleave(share, dim=0)
        return Group(self.centres, self.contexts, negatives, owner=owner)


def cbow_step(syn0: Tensor, syn1: Tensor, b: CbowBatch, alpha: float) -> tuple[float, int]:
    """Apply one batch of CBOW SGD updates in place; return (summed loss, predicted words).

    ``h`` (the mean of each row's context vectors) is one ``embedding_bag``; the centre
    word's score is a row-wise dot product; the ``share`` rows of a run score their shared
    noise words with one small matrix product, and the gradients of ``h`` and of the noise
    rows are two more; the updates are written with ``index_add_``, to the context words one
    column at a time (the rows sorted by width make every column a prefix of ``dh``)."""
    n, dim = len(b.centres), syn0.shape[1]
    runs, k = b.negatives.shape
    share = n // runs
    has = (b.counts > 0).to(syn0.dtype)  # a centre word with no context predicts nothing
    h = F.embedding_bag(b.contexts, syn0, b.offsets, mode="mean")  # (B, C)
    u = syn1.index_select(0, b.centres)  # (B, C)
    un = syn1.index_select(0, b.negatives.view(-1)).view(runs, k, dim)  # (runs, K, C)
    h3 = h.view(runs, share, dim)
    s_pos = torch.linalg.vecdot(h, u)  # (B,)
    s_neg = torch.bmm(h3, un.transpose(1, 2))  # (runs, share, K)
    keep = (b.negatives[:, None, :] != b.centres.view(runs, share, 1)).to(syn0.dtype)
    keep *= has.view(runs, share, 1)  # a noise word equal to the centre word is skipped
    loss = -float(F.logsigmoid(s_pos) @ has + (F.logsigmoid(-s_neg) * keep).sum())
    g_pos = torch.sigmoid(s_pos).neg_().add_(1.0).mul_(has).mul_(alpha)  # (B,)
    g_neg = torch.sigmoid(s_neg).mul_(keep).mul_(-alpha)  # (runs, share, K)
    dh = torch.bmm(g_neg, un).view(n, dim).addcmul_(u, g_pos[:, None])  # (B, C)
    syn1.index_add_(0, b.centres, torch.mul(h, g_pos[:, None], out=u))  # u is spent
    syn1.index_add_(0, b.negatives.view(-1), torch.bmm(g_neg.transpose(1, 2), h3).view(-1, dim))
    start = 0
    for width in b.widths:  # every context word gets dh, undivided (gensim's cbow_mean=1)
        syn0.index_add_(0, b.columns[start : start + width], dh[:width])
        start += width
    return loss, int(has.sum())


def reference_step(
    syn0: Tensor, syn1: Tensor, groups: Sequence[Group], alpha: float, sg: bool
) -> tuple[float, int]:
    """:func:`batched_step` written one centre word and one pair at a time (float64 sums),
    every gradient computed from the parameters as they were before the batch."""
    s0, s1 = syn0.clone(), syn1.clone()
    total_loss, total_n = 0.0, 0
    for g in groups:
        for b in range(len(g.centres)):
            w = int(g.centres[b])
            outs = [(w, 1.0)] + [(int(n), 0.0) for n in g.negatives[b] if int(n) != w]
            if sg:
                ctx = [int(c) for c, ok in zip(g.contexts[b], g.valid[b]) if ok]
            else:
                ctx = [int(c) for c, o in zip(g.contexts, g.owner) if int(o) == b]
            if sg:
                for c in ctx:
                    v = s0[c].double()
                    for o, label in outs:
                        dot = float(s1[o].double() @ v)
                        total_loss -= math.log(_sigmoid(dot if label else -dot))
                        step = (label - _sigmoid(dot)) * alpha
                        syn0[c] += (step * s1[o].double()).to(syn0.dtype)
                        syn1[o] += (step * v).to(syn1.dtype)
                    total_n += 1
            elif ctx:
                h = torch.stack([s0[c].double() for c in ctx]).mean(0)
                dh = torch.zeros_like(h)
                for o, label in outs:
                    dot = float(s1[o].double() @ h)
                    total_loss -= math.log(_sigmoid(dot if label else -dot))
                    step = (label - _sigmoid(dot)) * alpha
                    dh += step * s1[o].double()
                    syn1[o] += (step * h).to(syn1.dtype)
                for c in ctx:
                    syn0[c] += dh.to(syn0.dtype)
                total_n += 1
    return total_loss, total_n


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
