"""A feed-forward neural language model after Bengio, Ducharme, Vincent & Jauvin (2003),
"A Neural Probabilistic Language Model", JMLR 3.

The probability of the next token depends on the previous ``n - 1`` tokens only (``order``
= n, as for an n-gram model)::

    x = [C(w_{t-n+2}); ...; C(w_t)]             concatenated embeddings, ((n-1) * m,)
    y = b + W x + U tanh(d + H x)                logits over the vocabulary, (V,)
    p(w_{t+1} | context) = softmax(y)

``W`` (direct input-to-output connections) is optional (``direct``). The model is trained
by the same trainer on the causal objective: a window of ``block_size`` targets, each
predicted from the ``n - 1`` tokens before it. Positions with fewer than ``n - 1`` previous
tokens in the window are padded on the left with a learned padding embedding (an extra row
``vocab_size`` of the table that is never predicted), so each target's probability depends
only on its window and evaluation over non-overlapping windows stays exact (every target
predicted once, a proper distribution each time). Generation uses the same rule at the start
of a prompt.

Decoding state: :class:`ContextState`, the last ``n - 1`` tokens (O(1) per new token).

Shape legend
    B  batch size
    T  positions (targets) in this call
    K  context length, n - 1
    m  embedding width (n_embd)
    h  hidden width (n_hidden)
    V  vocabulary size
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import at_least, fraction, positive
from attnlm.models.base import RECURRENT, Family, ModelOutput, check_ids, count_params, token_loss


@dataclass(frozen=True)
class FFNNConfig:
    """Shape and options of an :class:`FFNNLM`: ``order`` n (the model sees ``n - 1``
    previous tokens), embedding width ``n_embd`` (m), hidden width ``n_hidden`` (h),
    ``direct`` input-to-output connections (W), ``block_size`` targets per training
    window."""

    vocab_size: int
    order: int = 5
    n_embd: int = 32
    n_hidden: int = 256
    direct: bool = False
    dropout: float = 0.0
    block_size: int = 64

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "n_embd", "n_hidden", "block_size")
        at_least(self, 2, "order")
        fraction(self, "dropout")

    @property
    def context(self) -> int:
        return self.order - 1


class ContextState:
    """Decoding state of an :class:`FFNNLM`: the last ``n - 1`` tokens of each row,
    ``tokens`` ``(B, n - 1)`` (the padding id before the start)."""

    def __init__(self, tokens: Tensor | None) -> None:
        self.tokens = tokens
        self.length = 0

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices`` (beam search)."""
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, indices.to(self.tokens.device))

    def trim(self, n: int) -> None:
        """Nothing to drop: the state is always the last ``n - 1`` tokens."""


class FFNNLM(nn.Module):
    """Bengio et al. (2003) feed-forward LM (see the module docstring)."""

    def __init__(self, config: FFNNConfig) -> None:
        super().__init__()
        self.config = c = config
        self.pad_id = c.vocab_size  # extra embedding row: "before the start"
        self.embed = nn.Embedding(c.vocab_size + 1, c.n_embd)  # C
        k = c.context * c.n_embd
        self.hidden = nn.Linear(k, c.n_hidden)  # H, d
        self.out = nn.Linear(c.n_hidden, c.vocab_size)  # U, b
        self.direct = nn.Linear(k, c.vocab_size, bias=False) if c.direct else None  # W
        self.drop = nn.Dropout(c.dropout)
        nn.init.normal_(self.embed.weight, std=0.1)

    def contexts(self, ids: Tensor, before: Tensor | None = None) -> Tensor:
        """The ``n - 1`` tokens ending at each position of ``ids`` ``(B, T)``: ``(B, T, K)``.
        ``before`` ``(B, K)``: the tokens preceding ``ids`` (padding when None)."""
        B, K = ids.shape[0], self.config.context
        if before is None:
            before = torch.full((B, K), self.pad_id, dtype=ids.dtype, device=ids.device)
        full = torch.cat([before, ids], dim=1)  # (B, K + T)
        return full.unfold(1, K, 1)[:, 1:]  # (B, T, K)

    def logits_of(self, ctx: Tensor) -> tuple[Tensor, Tensor]:
        """Logits ``(B, T, V)`` and hidden activations ``(B, T, h)`` for contexts
        ``(B, T, K)``."""
        x = self.embed(ctx).flatten(2)  # (B, T, K*m)
        a = torch.tanh(self.hidden(x))  # (B, T, h)
        y = self.out(self.drop(a))  # (B, T, V)
        if self.direct is not None:
            y = y + self.direct(x)
        return y, a

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """Logits ``(B, T, V)`` of the token after each position of ``ids`` ``(B, T)``,
        each from the ``n - 1`` tokens ending there (left padding inside the window), and
        the loss against ``targets`` ``(B, T)``. ``return_hidden``: the concatenated
        embeddings ``(B, T, K*m)`` and the tanh layer ``(B, T, h)``. No attention."""
        check_ids(ids, self.config.vocab_size)
        ctx = self.contexts(ids)
        logits, a = self.logits_of(ctx)
        loss = loss_sum = n_targets = None
        if targets is not None:
            loss, loss_sum, n_targets = token_loss(logits, targets)
        hidden = [self.embed(ctx).flatten(2), a] if return_hidden else None
        return ModelOutput(
            logits=logits, loss=loss, loss_sum=loss_sum, n_targets=n_targets, hidden_states=hidden
        )

    # -- decoding state ---------------------------------------------------------------------------
    def new_state(self, batch: dict[str, Tensor] | None = None) -> ContextState:
        """An empty state (all padding until tokens are fed)."""
        return ContextState(None)

    def step(self, tokens: Tensor, state: ContextState) -> Tensor:
        """Feed ``tokens`` ``(B, n)`` after ``state``; logits ``(B, n, V)``."""
        check_ids(tokens, self.config.vocab_size)
        ctx = self.contexts(tokens, state.tokens)
        state.tokens = ctx[:, -1]  # (B, K): the last n-1 tokens
        state.length += tokens.shape[1]
        return self.logits_of(ctx)[0]

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters; ``non_embedding`` leaves out the embedding table C."""
        return count_params(self, exclude=(self.embed,) if non_embedding else ())


def _describe(c: FFNNConfig) -> str:
    return (
        f"feed-forward LM (Bengio 2003), n={c.order}, m={c.n_embd}, h={c.n_hidden}, "
        f"vocab={c.vocab_size}, direct={'yes' if c.direct else 'no'}, window={c.block_size}"
    )


FAMILY = Family(
    "ffnn", FFNNConfig, FFNNLM, "causal", frozenset({"generate"}), describe=_describe,
    description="feed-forward n-gram neural LM (Bengio et al. 2003)", decoding=RECURRENT,
)  # fmt: skip
