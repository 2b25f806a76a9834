"""Parameter counts: exact per-module counts and the lecture's ``12 · L · d²`` estimate.

A transformer block of width ``d`` holds ``4d²`` attention weights (``W_Q, W_K, W_V, W_O``)
and ``8d²`` feed-forward weights (``d x 4d`` and ``4d x d``): ``12d²`` per block, ``12·L·d²``
for ``L`` blocks. The exact count adds biases, layer norms and the embeddings; for GPT-2
small (L=12, d=768, vocab 50257, context 1024, tied head) it is 124,439,808 against an
estimate of 84,934,656, the difference being mostly the 38.6M-entry token embedding.

A Llama block (:mod:`attnlm.models.llama`) changes both terms: attention holds
``2d² + 2d² · n_kv_head / n_head`` weights (``W_Q, W_O`` full, ``W_K, W_V`` only for the
shared key/value heads), the SwiGLU feed-forward ``3 · d · d_ff`` (gate, up, down), and two
RMSNorms ``2d``; :func:`llama_count` adds the embedding, an untied head and the final norm.
:func:`kv_cache_bytes_per_token` is what incremental decoding stores per token: keys and
values of every layer, ``2 · L · n_kv_head · d_head`` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from attnlm.models.base import count_params


@dataclass(frozen=True)
class ParamRow:
    """One line of a parameter table: ``count`` parameters first seen in module ``name``;
    ``per_layer`` is set for the rows describing one block of a stack; ``note`` says e.g.
    "tied" when the module's parameters were already counted elsewhere."""

    name: str
    count: int
    per_layer: bool = False
    note: str = ""


def lecture_estimate(n_layer: int, d_model: int) -> int:
    """The lecture's estimate ``12 · L · d²`` (block weight matrices only)."""
    return 12 * n_layer * d_model * d_model


def _llama_terms(config: Any) -> tuple[int, int, int, int, int]:
    """Per block: the q/o weights, the k/v weights, the feed-forward's, the two norms', and
    the optional parts' (q/k/v biases, q/k norms, post-norms)."""
    c = config
    d = c.n_embd
    D = getattr(c, "head_dim", d // c.n_head)
    q, kv = c.n_head * D, c.n_kv_head * D
    parts = (q + 2 * kv) * bool(getattr(c, "qkv_bias", False))
    if getattr(c, "qk_norm", False):  # each head's (D each) or all heads' (H D and Hkv D)
        parts += q + kv if getattr(c, "qk_norm_all", False) else 2 * D
    parts += 2 * d * bool(getattr(c, "post_norms", False))
    pre = 2 * d * bool(getattr(c, "pre_norms", True))  # (none in OLMo 2)
    return 2 * d * q, 2 * d * kv, 3 * d * c.ffn_width, pre, parts


def llama_count(config: Any) -> int:
    """The Llama parameter count by formula: ``L · (2d² + 2d² · Hkv/H + 3 d F + 2d) + V d
    (+ V d untied head) + d`` (equal to the exact count; tested); with a head width ``D``
    of its own, ``2d · H D + 2d · Hkv D`` for attention, and the parts' own (biases, q/k
    norms, post-norms)."""
    c = config
    d = c.n_embd
    head = 0 if c.tie_embeddings else c.vocab_size * d
    return c.n_layer * sum(_llama_terms(c)) + c.vocab_size * d + head + d


def kv_cache_bytes_per_token(config: Any, bytes_per_value: int = 4) -> int:
    """Bytes of KV cache per token of one sequence: ``2 · L · Hkv · D`` values (``Hkv`` =
    ``n_kv_head`` where the config has one, else ``n_head``)."""
    width = getattr(config, "n_embd", None) or config.d_model
    kv_heads = getattr(config, "n_kv_head", None) or config.n_head
    d_head = getattr(config, "head_dim", None) or width // config.n_head
    return 2 * config.n_layer * kv_heads * d_head * bytes_per_value


def format_llama_lines(config: Any) -> str:
    """The Llama formula with its terms, for ``attnlm params``."""
    c = config
    d, V = c.n_embd, c.vocab_size
    *terms, parts = _llama_terms(c)
    ends = [V * d] + ([] if c.tie_embeddings else [V * d]) + [d]
    head = "" if c.tie_embeddings else " + V·d (head)"
    attn = "2d² + 2d²·Hkv/H"
    if c.head_dim * c.n_head != d or parts:
        attn = "2d·H·D + 2d·Hkv·D"
    if parts:
        terms.append(parts)
    more = " + parts" if parts else ""
    return (
        f"Llama formula: L·({attn} + 3·d·d_ff + 2d{more}) + V·d{head} + d\n"
        f"  = {c.n_layer}·({' + '.join(f'{t:,}' for t in terms)}) + "
        f"{' + '.join(f'{t:,}' for t in ends)} = {llama_count(c):,}"
    )


def format_kv_cache(config: Any) -> str:
    """The KV-cache bytes per token (float32 and 16-bit), beside multi-head attention's."""
    per = kv_cache_bytes_per_token(config)
    line = (
        f"KV cache per token: 2·L·Hkv·D = {per // 4:,} values = {per:,} bytes float32, "
        f"{per // 2:,} bytes bfloat16"
    )
    kv_heads = getattr(config, "n_kv_head", None) or config.n_head
    if kv_heads != config.n_head:
        mha = per * config.n_head // kv_heads
        line += f" ({kv_heads}/{config.n_head} of multi-head attention's {mha:,})"
    return line


def param_rows(model: nn.Module) -> list[ParamRow]:
    """Per-module counts of ``model``'s direct children, in order. A parameter is counted at
    its first appearance, so a tied LM head shows 0 with the note "tied". A
    ``nn.ModuleList`` of blocks gives one row for the whole stack followed by ``per_layer``
    rows for the children of its first block."""
    seen: set[int] = set()
    rows: list[ParamRow] = []

    def new_params(module: nn.Module) -> tuple[int, bool]:
        count, shared = 0, False
        for p in module.parameters():
            if id(p) in seen:
                shared = True
                continue
            seen.add(id(p))
            count += p.numel()
        return count, shared

    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList) and len(child) > 0:
            first = child[0]
            inner = [(n, count_params(m)) for n, m in first.named_children()]
            total, _ = new_params(child)
            rows.append(ParamRow(f"{name} ({len(child)} x)", total))
            own = count_params(first) - sum(c for _, c in inner)
            rows += [ParamRow(f"  {n}", c, per_layer=True) for n, c in inner if c]
            if own:
                rows.append(ParamRow("  (own)", own, per_layer=True))
            continue
        count, shared = new_params(child)
        if count or shared:
            rows.append(ParamRow(name, count, note="tied" if shared and not count else ""))
    return rows


def format_param_table(
    model: nn.Module, n_layer: int | None = None, d_model: int | None = None
) -> str:
    """A printable table: per-module counts, the exact total and, for transformer shapes
    (``n_layer`` and ``d_model`` given), ``12·L·d²`` beside it."""
    rows = param_rows(model)
    total = count_params(model)
    width = max(len(r.name) for r in rows + [ParamRow("12·L·d² estimate", 0)]) + 2
    lines = [f"{'module':<{width}}{'per layer':>14}{'parameters':>16}"]
    for r in rows:
        note = f"  ({r.note})" if r.note else ""
        if r.per_layer:
            lines.append(f"{r.name:<{width}}{r.count:>14,}")
        else:
            lines.append(f"{r.name:<{width}}{'':>14}{r.count:>16,}{note}")
    lines.append("-" * (width + 30))
    lines.append(f"{'total (exact)':<{width}}{'':>14}{total:>16,}")
    if n_layer is None or d_model is None:
        return "\n".join(lines)
    estimate = lecture_estimate(n_layer, d_model)
    lines.append(
        f"{'12·L·d² estimate':<{width}}{'':>14}{estimate:>16,}"
        f"  (L={n_layer}, d={d_model}; {estimate / total:.1%} of exact)"
    )
    return "\n".join(lines)
