"""Experiments on a decoder's activations (:mod:`attnlm.inspect.trace`), each a few batched
forward passes:

* :func:`patching`: activation patching of the residual stream (layer x position) and of every
  head's output (layer x head), with the logit difference as the metric (Meng et al., 2022;
  Wang et al., 2022);
* :func:`attribution`: direct logit attribution of the embeddings, each head and each MLP to an
  answer token (the final norm's scale frozen at its value in the run);
* :func:`head_scores`: induction, previous-token and duplicate-token scores of every head on
  repeated random token sequences (Olsson et al., 2022);
* :func:`ablation`: the next-token distribution with and without some heads (zeroed or
  mean-ablated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnlm.base.errors import InputError
from attnlm.inspect.trace import Intervention, hook, trace


def answer_id(tok: Any, text: str, what: str) -> int:
    """The first token of ``text`` (an answer such as ``" Paris"``)."""
    ids = list(tok.encode(text))
    if not ids:
        raise InputError(f"{what} {text!r} tokenizes to nothing")
    return ids[0]


def _token_text(tok: Any, i: int) -> str:
    """Token ``i`` as text; an id past the tokenizer's vocabulary (a model's padding rows) as
    ``<id N>``."""
    try:
        return tok.decode([i])
    except (KeyError, IndexError, ValueError, InputError):
        return f"<id {i}>"


def _encode(tok: Any, text: str) -> list[int]:
    ids = list(tok.encode(text))
    if not ids:
        raise InputError(f"{text!r} tokenizes to nothing")
    return ids


def _diff(logits: Tensor, answer: int, wrong: int) -> Tensor:
    """Logit of ``answer`` minus logit of ``wrong`` at the last position, per row ``(B,)``."""
    last = logits[:, -1].float()
    return last[:, answer] - last[:, wrong]


def patching(model: Any, tok: Any, clean: str, corrupt: str, answer: str, wrong: str) -> dict:
    """Activation patching from the clean run into the corrupt one: each layer's residual
    stream at each position (``resid``, layers x positions; the input of block ``L``,
    ``blocks.L.hook_resid_pre``) and each head's output (``heads``, layers x heads;
    ``blocks.L.attn.hook_z``, every position), scored as the fraction of the logit difference
    ``answer - wrong`` recovered: 1 = the clean run's, 0 = the corrupt run's."""
    c_ids, x_ids = _encode(tok, clean), _encode(tok, corrupt)
    if len(c_ids) != len(x_ids):
        raise InputError(f"patching needs texts of the same length in tokens: the clean text is "
                         f"{len(c_ids)} tokens, the corrupt one {len(x_ids)}")  # fmt: skip
    a, w = answer_id(tok, answer, "--answer"), answer_id(tok, wrong, "--wrong")
    if a == w:
        raise InputError("--answer and --wrong start with the same token")
    L, T = len(model.blocks), len(c_ids)
    H = model.blocks[0].attn.n_head
    resid = [f"blocks.{i}.hook_resid_pre" for i in range(L)]
    z = [f"blocks.{i}.attn.hook_z" for i in range(L)]
    src = trace(model, torch.tensor([c_ids]), names=resid + z, last_only=True)
    base = trace(model, torch.tensor([x_ids]), names=[], last_only=True)
    clean_d, corrupt_d = float(_diff(src.logits, a, w)[0]), float(_diff(base.logits, a, w)[0])
    span = clean_d - corrupt_d
    if abs(span) < 1e-6:
        raise InputError("the clean and corrupt texts give the same logit difference: nothing "
                         "to recover")  # fmt: skip

    def sweep(names: list[str], per: int, put) -> list[list[float]]:
        d = patch_sweep(model, src, x_ids, names, per, put, lambda lg: _diff(lg, a, w))
        return ((d - corrupt_d) / span).view(L, per).tolist()

    tokens = [tok.decode([i]) for i in c_ids]
    return {"clean_logit_diff": clean_d, "corrupt_logit_diff": corrupt_d,
            "answer_token": a, "wrong_token": w, "tokens": tokens,
            "resid": sweep(resid, T, put_position), "heads": sweep(z, H, put_head)}  # fmt: skip


def put_position(t: Tensor, row: int, j: int, source: Tensor) -> None:
    """Patch position ``j`` of ``source`` ``(1, T, C)`` into row ``row`` of ``t``."""
    t[row, j] = source[0, j]


def put_head(t: Tensor, row: int, j: int, source: Tensor) -> None:
    """Patch head ``j`` of ``source`` ``(1, T, H, D)`` into row ``row`` of ``t``."""
    t[row, :, j] = source[0, :, j]


#: tokens per batched patching pass: rows are patched this many tokens at a time, so a sweep's
#: activations stay a few tens of MB whatever its size (1,024 rows of 16 tokens in 32 passes)
PATCH_TOKENS = 512


def patch_sweep(model: Any, source: Any, ids: list[int], names: list[str], per: int, put,
                metric) -> Tensor:  # fmt: skip
    """Every single patch of a sweep, batched: row ``(l, j)`` (``l`` over ``names``, ``j <
    per``) runs ``ids`` with item ``j`` of ``names[l]`` taken from ``source`` (a trace of the
    clean run) by ``put``, and nothing else changed; returns ``metric(logits)`` of the last
    position for the ``len(names) * per`` rows, in that order. The rows go through the model
    :data:`PATCH_TOKENS` tokens at a time."""
    n, step = len(names) * per, max(1, PATCH_TOKENS // max(1, len(ids)))
    out = []
    for first in range(0, n, step):
        last = min(n, first + step)
        hooks = []
        for layer, name in enumerate(names):
            mine = range(max(first, layer * per), min(last, (layer + 1) * per))
            pairs = [(g - first, g - layer * per) for g in mine]  # (row in the pass, item)
            if pairs:
                hooks.append(hook(name, _rows_hook(source[name], pairs, put)))
        rows = torch.tensor([ids] * (last - first))
        out.append(metric(trace(model, rows, names=[], interventions=hooks, last_only=True).logits))
    return torch.cat(out)


def _rows_hook(source: Tensor, pairs: list[tuple[int, int]], put):
    """A hook that puts ``source``'s item ``j`` into row ``row`` for each ``(row, j)`` (the hook
    gets its own copy of the activation to edit)."""

    def fn(t: Tensor) -> Tensor:
        for row, j in pairs:
            put(t, row, j, source)
        return t

    return fn


def attribution(model: Any, tok: Any, text: str, answer: str) -> dict:
    """Direct logit attribution of the answer's first token at the last position: each
    component's write into the residual stream (``embed``, each head's result, each MLP's
    output), through the final norm with its scale frozen at the run's value, dotted with the
    answer's unembedding; ``bias`` is the final norm's bias term. Their sum is the logit."""
    ids = _encode(tok, text)
    a = answer_id(tok, answer, "--answer")
    L = len(model.blocks)
    names = ["hook_embed", "ln_final.hook_scale"]
    names += ["hook_pos_embed"] if getattr(model, "pos_emb", None) is not None else []
    names += [f"blocks.{i}.attn.hook_result" for i in range(L)]
    names += [f"blocks.{i}.hook_mlp_out" for i in range(L)]
    t = trace(model, torch.tensor([ids]), names=names)
    direction = _unembed(model, a)  # (C,): the norm's weight times the answer's row of W_U
    rms = isinstance(model.ln_f, torch.nn.RMSNorm)
    scale = t["ln_final.hook_scale"][0, -1].double()  # (1,)
    divisor = getattr(model, "logit_scale", None) or 1.0  # Granite's logits_scaling

    def through(x: Tensor) -> Tensor:  # (..., C) at the last position -> logit contribution
        x = x.double()
        if not rms:
            x = x - x.mean(-1, keepdim=True)
        return (x / scale) @ direction / divisor

    def written(i: int) -> float:  # what block i's attention writes, per unit of its output
        return getattr(model.blocks[i], "residual_scale", None) or 1.0

    embed = through(t["hook_embed"][0, -1])
    if "hook_pos_embed" in t:
        embed = embed + through(t["hook_pos_embed"][0, -1])
    heads = [(through(t[f"blocks.{i}.attn.hook_result"][0, -1]) * written(i)).tolist()
             for i in range(L)]  # fmt: skip
    attn_bias = [_attn_bias(model.blocks[i].attn) for i in range(L)]
    bias_terms = sum(float(through(b)) * written(i) for i, b in enumerate(attn_bias)
                     if b is not None)  # fmt: skip
    mlps = [float(through(t[f"blocks.{i}.hook_mlp_out"][0, -1])) for i in range(L)]
    lm_bias = getattr(model.lm_head, "bias", None)
    norm_bias = getattr(model.ln_f, "bias", None)
    bias = 0.0 if norm_bias is None else float(norm_bias.detach().double() @ _head_row(model, a))
    bias = (bias + (float(lm_bias[a]) if lm_bias is not None else 0.0)) / divisor
    logit = float(t.logits[0, -1, a])
    total = float(embed) + sum(map(sum, heads)) + bias_terms + sum(mlps) + bias
    return {"answer_token": a, "logit": logit, "embed": float(embed), "heads": heads,
            "attn_bias": bias_terms, "mlps": mlps, "bias": bias, "total": total}  # fmt: skip


def _attn_bias(attn: Any) -> Tensor | None:
    b = getattr(attn.out_proj, "bias", None)
    return None if b is None else b.detach()


def _head_row(model: Any, a: int) -> Tensor:
    """Row ``a`` of the LM head's weight ``(C,)`` in float64 (a quantized head dequantized by
    applying it to the identity)."""
    head = model.lm_head
    if isinstance(head, torch.nn.Linear):
        return head.weight.detach()[a].double()
    width = model.config.n_embd
    with torch.inference_mode():
        cols = head(torch.eye(width))  # (C, V): the head applied to each unit vector
    bias = getattr(head, "bias", None)
    return (cols if bias is None else cols - bias)[:, a].double()


def _unembed(model: Any, a: int) -> Tensor:
    w = model.ln_f.weight
    row = _head_row(model, a)
    return row if w is None else row * w.detach().double()


def head_scores(
    model: Any, kind: str = "induction", *, length: int = 20, batch: int = 8, seed: int = 0,
    vocab: int | None = None,
) -> dict:  # fmt: skip
    """Per-head scores ``(layers x heads)`` on ``batch`` random token sequences of ``length``
    tokens repeated once (``2 length`` tokens): ``induction`` the attention from each token of
    the repeat to the token after its earlier occurrence, ``previous-token`` to the token just
    before (every position but the first), ``duplicate-token`` to its earlier occurrence;
    averaged over the positions concerned and the batch."""
    if kind not in ("induction", "previous-token", "duplicate-token"):
        raise InputError(f"unknown head score {kind!r}")
    n_vocab = vocab or model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(100 if n_vocab > 1000 else 0, n_vocab, (batch, length), generator=g)
    ids = torch.cat([first, first], dim=1)  # (B, 2n)
    L = len(model.blocks)
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(L)]
    t = trace(model, ids, names=names)
    n = length
    q = torch.arange(n, 2 * n) if kind != "previous-token" else torch.arange(1, 2 * n)
    k = {"induction": q - n + 1, "duplicate-token": q - n, "previous-token": q - 1}[kind]
    scores = [t[name][:, :, q, k].mean(dim=(0, 2)).tolist() for name in names]  # L x H
    return {"kind": kind, "length": length, "batch": batch, "seed": seed, "scores": scores}


def parse_heads(specs: Sequence[str], model: Any) -> list[tuple[int, int]]:
    """``["3.1", ...]`` -> ``[(3, 1), ...]``, checked against the model's layers and heads."""
    L, H = len(model.blocks), model.blocks[0].attn.n_head
    out = []
    for spec in specs:
        try:
            layer, head = (int(p) for p in spec.split("."))
        except ValueError:
            raise InputError(f"--head {spec!r}: expected LAYER.HEAD, e.g. 3.1") from None
        if not (0 <= layer < L and 0 <= head < H):
            raise InputError(f"--head {spec}: out of range (layers 0..{L - 1}, heads 0..{H - 1})")
        out.append((layer, head))
    return out


def ablation(
    model: Any, tok: Any, text: str, heads: Sequence[tuple[int, int]], *, mean: bool = False,
    top: int = 10,
) -> dict:  # fmt: skip
    """The next-token distribution after ``text`` with and without ``heads`` (their ``z``
    zeroed, or replaced by its mean over the positions with ``mean``): the top tokens of
    each, their probabilities in both, and the KL divergence of the ablated from the plain."""
    ids = torch.tensor([_encode(tok, text)])
    op = "mean" if mean else "zero"
    ivs = [Intervention(f"blocks.{layer}.attn.hook_z", op, head=h) for layer, h in heads]
    plain = trace(model, ids, names=[]).logits[0, -1].float().log_softmax(-1)
    ablated = trace(model, ids, names=[], interventions=ivs).logits[0, -1].float()
    ablated = ablated.log_softmax(-1)
    kl = float((plain.exp() * (plain - ablated)).sum())

    def rows(lp: Tensor) -> list[dict]:
        top_ids = lp.topk(top).indices.tolist()
        return [{"token": _token_text(tok, i), "id": i, "p": float(plain[i].exp()),
                 "p_ablated": float(ablated[i].exp())} for i in top_ids]  # fmt: skip

    return {"heads": [f"{layer}.{h}" for layer, h in heads], "ablation": op, "kl": kl,
            "top": rows(plain), "top_ablated": rows(ablated)}  # fmt: skip
