"""A sparse mixture of experts (Shazeer et al., 2017, "Outrageously Large Neural Networks";
Mixtral, Jiang et al., 2024; Qwen3-MoE): the feed-forward sublayer as ``E`` gated
feed-forward networks ("experts") of which each position uses ``k``.

For each position ``x`` (a row of the normed residual stream):

1. a **router** scores every expert, ``r = x W_router`` ``(E,)``, and turns the scores into
   probabilities ``p = softmax(r)``;
2. the ``k`` experts of highest ``p`` are chosen (``top-k``); their probabilities are the
   mixing weights ``w``, renormalised to sum to one where the model says so (Mixtral,
   Qwen3-MoE: ``w / Σ w``; OLMoE and Qwen2-MoE keep ``p`` as it is);
3. the output is ``Σ_i w_i · SwiGLU_{e_i}(x)``: only ``k`` of the ``E`` experts run, so a
   model with ``E · F`` feed-forward width per layer costs ``k · F`` per token.

gpt-oss routes another way (``gating = "topk_softmax"``): the ``k`` highest router logits are
chosen and the softmax runs over those alone (the same weights as renormalising, other
roundings), its router and experts have biases (``bias``), and its experts are
:class:`~attnlm.nn.blocks.ClampedSwiGLU` (``expert``).

Module names (the checkpoint keys): ``router`` (``nn.Linear(C, E)``, no bias) and
``experts.{e}`` (each a :class:`~attnlm.nn.blocks.SwiGLU`: ``fc`` = ``[W_gate; W_up]``,
``proj`` = ``W_down``), so every expert's matrices are ordinary linear layers (quantized,
adapted and inspected like a dense model's). ``(B, T, C) -> (B, T, C)``.

The sums follow llama.cpp's ``build_moe_ffn``: the softmax in float32 over every expert,
the top ``k`` of the probabilities, the renormalising sum clamped below at
:data:`MIN_WEIGHT_SUM` (never reached: the largest of ``E`` probabilities is at least
``1/E``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlm.nn.blocks import SwiGLU

#: llama.cpp's lower clamp of the renormalising sum of the chosen experts' weights
MIN_WEIGHT_SUM = 6.103515625e-5
#: how the router's logits become the chosen experts' weights: a softmax over every expert,
#: then the top k (renormalised with ``norm_topk``); or the top k logits, then their softmax
GATINGS = ("softmax", "topk_softmax")


class SparseMoE(nn.Module):
    """``n_expert`` SwiGLU experts of width ``d_ff``, ``n_used`` of them per position (see
    the module docstring); ``norm_topk``: the chosen weights renormalised to sum to one."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_expert: int,
        n_used: int,
        *,
        norm_topk: bool = True,
        dropout: float = 0.0,
        gating: str = "softmax",
        bias: bool = False,
        expert: type[SwiGLU] = SwiGLU,
    ) -> None:
        super().__init__()
        self.n_expert, self.n_used, self.norm_topk = n_expert, n_used, norm_topk
        self.gating = gating
        self.router = nn.Linear(d_model, n_expert, bias=bias)  # (B, T, C) -> (B, T, E)
        self.experts = nn.ModuleList(
            expert(d_model, d_ff, bias=bias, dropout=dropout) for _ in range(n_expert)
        )
        self.gated_act = expert.gated_act

    gated_act = "silu"

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(weights (N, k), experts (N, k) int64)`` of the rows ``x`` ``(N, C)``: the
        chosen experts in order of probability, and their mixing weights (float32)."""
        logits = self.router(x).float()  # (N, E)
        if self.gating == "topk_softmax":  # gpt-oss: the top k logits, then their softmax
            top, chosen = torch.topk(logits, self.n_used, dim=-1)  # (N, k) each
            return torch.softmax(top, dim=-1), chosen
        probs = torch.softmax(logits, dim=-1)  # (N, E)
        weights, chosen = torch.topk(probs, self.n_used, dim=-1)  # (N, k) each
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True).clamp_min(MIN_WEIGHT_SUM)
        return weights, chosen

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (N, C)
        return self.mix(rows, *self.route(rows)).reshape(x.shape)

    def mix(self, rows: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        """``Σ_i weights[:, i] · expert_{chosen[:, i]}(rows)`` ``(N, C)``."""
        out = torch.zeros_like(rows)
        # each expert once, on the rows that chose it (a position's k experts are distinct)
        for e in torch.unique(chosen).tolist():
            row, slot = torch.nonzero(chosen == e, as_tuple=True)
            y = self.experts[e](rows[row]) * weights[row, slot, None].to(rows.dtype)
            out = out.index_add(0, row, y)
        return out
