"""A hidden Markov model as a language model: the lectures' step before neural networks
(Rabiner 1989, "A Tutorial on Hidden Markov Models and Selected Applications in Speech
Recognition"; Jurafsky & Martin, "Speech and Language Processing", appendix A).

``K`` hidden states ``z_t``; each emits one token ``x_t`` of the tokenizer's vocabulary::

    p(z_1 = i)                = pi_i          start distribution          (K,)
    p(z_t = j | z_{t-1} = i)  = A_ij          transition matrix, rows sum to 1   (K, K)
    p(x_t = v | z_t = j)      = E_jv          emission matrix, rows sum to 1     (K, V)

Each distribution is stored as unnormalised logits (a softmax over the last axis gives the
probabilities), so gradient training works on them unchanged; Baum-Welch EM writes the log
of its re-estimated probabilities into the same logits.

**Forward algorithm, scaled** (the filtered state distribution ``f_t(j) = p(z_t = j | x_1..x_t)``
is kept normalised at every step, so nothing underflows and no logarithm of a sum is needed)::

    a_1 = pi * E[:, x_1]                 a_t = (f_{t-1} @ A) * E[:, x_t]
    c_t = sum_j a_t(j) = p(x_t | x_<t)   f_t = a_t / c_t
    log p(x_1..x_T) = sum_t log c_t

Batched over sequences, each step is one ``(B, K) @ (K, K)`` matrix product. The next-token
distribution after position ``t`` is ``p(x_{t+1} | x_1..x_t) = f_t @ A @ E``: the model is a
causal LM (``objective = "causal"``) whose logits at position ``t`` are the log of that,
trained and evaluated like any other family. Each training or evaluation window starts from
``pi`` at its first token (a boundary: the window's first token is conditioned on, not
predicted, as for every causal family).

**Decoding state**: :class:`HMMState`, the filtered distribution ``f_t`` ``(B, K)`` (O(K²) per
new token, any context length). ``attnlm generate`` samples each next token from ``f_t @ A @ E``;
:meth:`HMMLM.sample` draws the states themselves (ancestral sampling), which gives the same
distribution over texts.

**Viterbi**: the most probable state path, ``max`` instead of ``sum`` in log space, with back
pointers (:meth:`HMMLM.viterbi`).

**Baum-Welch EM** (:meth:`HMMLM.em_step`): the E-step runs the scaled forward pass and the
backward pass ``b_t = A @ (E[:, x_{t+1}] * b_{t+1}) / c_{t+1}`` (``b_T = 1``), batched over
sequences, and sums the expected counts::

    gamma_t = f_t * b_t                                 p(z_t | x), per position
    start   = sum over sequences of gamma_1
    trans   = A * sum_t f_t^T (E[:, x_{t+1}] * b_{t+1} / c_{t+1})      one matrix product
    emit    = sum_t gamma_t for each observed token      (index_add over the vocabulary)

The M-step normalises ``counts + em_pseudocount`` row by row (``em_pseudocount`` is
``hmmlearn``'s Dirichlet ``prior - 1``; 0 is maximum likelihood). Probabilities below
``exp(LOG_FLOOR)`` are stored as that floor, so logits stay finite.

Shape legend
    B  batch size (sequences)
    T  positions in this call
    K  hidden states (n_states)
    V  vocabulary size
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.foreign import check_config_fits
from attnlm.base.validate import above_zero, at_least_zero, positive
from attnlm.models.base import RECURRENT, Family, ModelOutput, check_ids, count_params, token_loss

LOG_FLOOR = -69.0  # log(1e-30): the smallest log-probability EM stores (finite logits)
EM_CHUNK = 1 << 24  # E-step chunk size in (rows x positions x states) values, ~64 MB float32


#: The most hidden states: K x K transitions, and forward-backward costs K**2 per token, so
#: 4,096 states already take 64 MB of transitions and seconds per EM step on a CPU.
MAX_STATES = 4096

#: The longest text Viterbi decodes at once, in tokens (a step per token, K**2 work each).
MAX_VITERBI_TOKENS = 16_384


@dataclass(frozen=True)
class HMMConfig:
    """Shape and options of an :class:`HMMLM`: ``n_states`` hidden states (K),
    ``block_size`` targets per training window (and positions per EM sequence),
    ``init_std`` of the normal initial logits, ``em_pseudocount`` added to every expected
    count in the EM M-step."""

    vocab_size: int
    n_states: int = 64
    block_size: int = 256
    init_std: float = 1.0
    em_pseudocount: float = 0.0

    def __post_init__(self) -> None:
        check_config_fits(self)  # before any layer is built: refuse what cannot fit
        positive(self, "vocab_size", "n_states", "block_size")
        if self.n_states > MAX_STATES:
            raise ConfigError(
                f"model.n_states must be at most {MAX_STATES:,}, got {self.n_states:,} (the "
                "transition table and every EM step grow with its square)"
            )
        above_zero(self, "init_std")
        at_least_zero(self, "em_pseudocount")


class Categorical(nn.Module):
    """Categorical distributions over the last axis of ``logits`` (one per row)."""

    def __init__(self, *shape: int, std: float) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.empty(shape))
        nn.init.normal_(self.logits, std=std)

    def probs(self) -> Tensor:
        return torch.softmax(self.logits, -1)

    def log_probs(self) -> Tensor:
        return torch.log_softmax(self.logits, -1)

    @torch.no_grad()
    def set_probs(self, probs: Tensor) -> None:
        """Store ``probs`` (rows normalised here) as logits, floored at :data:`LOG_FLOOR`."""
        p = probs.to(self.logits).clamp_min(0)
        p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
        self.logits.copy_(p.log().clamp_min(LOG_FLOOR))


class HMMState:
    """Decoding state of an :class:`HMMLM`: ``belief`` ``(B, K)``, the filtered state
    distribution after the tokens fed so far (None before the first: the start
    distribution applies). ``length``: tokens fed so far."""

    def __init__(self) -> None:
        self.belief: Tensor | None = None
        self.length = 0

    def reorder(self, indices: Tensor) -> None:
        """Keep rows ``indices`` (beam search)."""
        if self.belief is not None:
            self.belief = self.belief.index_select(0, indices.to(self.belief.device))

    def trim(self, n: int) -> None:
        """Nothing to drop: the filtered distribution summarises any context."""


@dataclass
class EMStats:
    """Expected counts of one E-step (float64) and the data's log-likelihood under the
    parameters that produced them."""

    start: Tensor  # (K,)
    trans: Tensor  # (K, K)
    emit: Tensor  # (K, V)
    log_likelihood: float = 0.0
    n_tokens: int = 0
    n_sequences: int = 0

    def add(self, other: EMStats) -> None:
        self.start += other.start
        self.trans += other.trans
        self.emit += other.emit
        self.log_likelihood += other.log_likelihood
        self.n_tokens += other.n_tokens
        self.n_sequences += other.n_sequences


def forward_filter(
    start: Tensor, trans: Tensor, emit_x: Tensor, belief: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The scaled forward algorithm (module docstring), time-major: ``emit_x`` ``(T, B, K)``
    holds ``E[:, x_t]``; ``belief`` ``(B, K)`` the filtered distribution before the first
    position (None: start from ``start``). Returns the filtered distributions ``(T, B, K)``
    and ``c_t = p(x_t | x_<t)`` ``(T, B)``."""
    filtered, scales = [], []
    for t in range(emit_x.shape[0]):
        prior = start if belief is None else belief @ trans  # (K,) or (B, K)
        a = prior * emit_x[t]
        c = a.sum(-1)
        belief = a / c[:, None]
        filtered.append(belief)
        scales.append(c)
    return torch.stack(filtered), torch.stack(scales)


class HMMLM(nn.Module):
    """A hidden Markov model language model (see the module docstring)."""

    def __init__(self, config: HMMConfig) -> None:
        super().__init__()
        self.config = c = config
        self.start = Categorical(c.n_states, std=c.init_std)  # pi
        self.transition = Categorical(c.n_states, c.n_states, std=c.init_std)  # A
        self.emission = Categorical(c.n_states, c.vocab_size, std=c.init_std)  # E

    # -- the parameters as probabilities (hmmlearn's names) ----------------------------------
    def probs(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(startprob (K,), transmat (K, K), emissionprob (K, V))``."""
        return self.start.probs(), self.transition.probs(), self.emission.probs()

    def set_probs(self, startprob: Tensor, transmat: Tensor, emissionprob: Tensor) -> None:
        """Set the parameters from probabilities (e.g. a fitted ``hmmlearn`` model's)."""
        K, V = self.config.n_states, self.config.vocab_size
        given = {"startprob": startprob, "transmat": transmat, "emissionprob": emissionprob}
        for (name, value), shape in zip(given.items(), ((K,), (K, K), (K, V))):
            if tuple(torch.as_tensor(value).shape) != shape:
                raise InputError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
        self.start.set_probs(torch.as_tensor(startprob))
        self.transition.set_probs(torch.as_tensor(transmat))
        self.emission.set_probs(torch.as_tensor(emissionprob))

    # -- the forward algorithm as a causal LM ------------------------------------------------
    def filter(self, ids: Tensor, belief: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Filtered distributions ``(B, T, K)`` and ``log p(x_t | x_<t)`` ``(B, T)`` of ``ids``
        ``(B, T)`` continuing ``belief`` (None: from the start distribution)."""
        check_ids(ids, self.config.vocab_size)
        start, trans, emit = self.probs()
        filtered, scales = forward_filter(start, trans, emit.t()[ids.t()], belief)
        return filtered.transpose(0, 1), scales.t().log()

    def next_token_logits(self, filtered: Tensor) -> Tensor:
        """``log p(x_{t+1} = v | x_1..x_t) = log(f_t @ A @ E)``, ``(B, T, V)``."""
        _, trans, emit = self.probs()
        return (filtered @ (trans @ emit)).log()

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        return_attention: bool = False,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """Logits ``(B, T, V)`` of the token after each position of ``ids`` ``(B, T)``
        (normalised log-probabilities) and the loss against ``targets``. ``return_hidden``:
        the filtered state distributions ``(B, T, K)``. No attention."""
        filtered, _ = self.filter(ids)
        logits = self.next_token_logits(filtered)
        loss = loss_sum = n_targets = None
        if targets is not None:
            loss, loss_sum, n_targets = token_loss(logits, targets)
        hidden = [filtered] if return_hidden else None
        return ModelOutput(
            logits=logits, loss=loss, loss_sum=loss_sum, n_targets=n_targets, hidden_states=hidden
        )

    @torch.no_grad()
    def score(self, sequences: Tensor | Iterable[Tensor]) -> float:
        """Total log-likelihood (nats) of the sequences, each from the start distribution:
        one ``(B, T)`` tensor or several (``hmmlearn``'s ``score(X, lengths)``)."""
        batches = [sequences] if isinstance(sequences, Tensor) else sequences
        return sum(float(self.filter(x)[1].sum()) for x in batches)

    # -- decoding ---------------------------------------------------------------------------
    def new_state(self, batch: dict[str, Tensor] | None = None) -> HMMState:
        """An empty state (the start distribution applies to the first token)."""
        return HMMState()

    def step(self, tokens: Tensor, state: HMMState) -> Tensor:
        """Feed ``tokens`` ``(B, n)`` after ``state``; logits ``(B, n, V)``."""
        filtered, _ = self.filter(tokens, state.belief)
        state.belief = filtered[:, -1]
        state.length += tokens.shape[1]
        return self.next_token_logits(filtered)

    @torch.no_grad()
    def sample(
        self,
        length: int,
        n: int = 1,
        prompt: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Ancestral sampling: ``(states, tokens)``, each ``(n, length)``. Without ``prompt``
        ``z_1 ~ pi``; after a ``prompt`` ``(n, P)`` the state of its last token is drawn from
        the filtered distribution and the next from its transition row. Then ``x_t ~
        E[z_t]`` and ``z_{t+1} ~ A[z_t]``."""
        start, trans, emit = self.probs()
        device = start.device
        states = torch.empty(n, length, dtype=torch.long, device=device)
        tokens = torch.empty_like(states)
        if prompt is None:
            z = torch.multinomial(start.expand(n, -1), 1, generator=generator)[:, 0]
        else:
            belief = self.filter(prompt.to(device))[0][:, -1]
            z = torch.multinomial(belief, 1, generator=generator)[:, 0]
            z = torch.multinomial(trans[z], 1, generator=generator)[:, 0]
        for t in range(length):
            states[:, t] = z
            tokens[:, t] = torch.multinomial(emit[z], 1, generator=generator)[:, 0]
            if t + 1 < length:
                z = torch.multinomial(trans[z], 1, generator=generator)[:, 0]
        return states, tokens

    @torch.no_grad()
    def viterbi(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """The most probable state path of each row of ``ids`` ``(B, T)``: ``(log_prob (B,),
        states (B, T))``, ``log_prob`` being ``log p(x, z*)`` of the best path."""
        check_ids(ids, self.config.vocab_size)
        log_start, log_trans = self.start.log_probs(), self.transition.log_probs()
        log_emit_x = self.emission.log_probs().t()[ids]  # (B, T, K)
        B, T, K = log_emit_x.shape
        back = torch.zeros(B, T, K, dtype=torch.long, device=ids.device)
        delta = log_start + log_emit_x[:, 0]  # (B, K): best log-prob of a path ending in j
        for t in range(1, T):
            delta, back[:, t] = (delta[:, :, None] + log_trans).max(1)  # over the previous i
            delta = delta + log_emit_x[:, t]
        best, last = delta.max(-1)
        path = torch.empty(B, T, dtype=torch.long, device=ids.device)
        path[:, -1] = last
        for t in range(T - 1, 0, -1):
            path[:, t - 1] = back[:, t].gather(1, path[:, t : t + 1])[:, 0]
        return best, path

    # -- Baum-Welch EM ------------------------------------------------------------------------
    @torch.no_grad()
    def expected_counts(self, ids: Tensor) -> EMStats:
        """The E-step on the sequences ``ids`` ``(B, T)`` (module docstring)."""
        check_ids(ids, self.config.vocab_size)
        start, trans, emit = self.probs()
        emit_x = emit.t()[ids.t()]  # (T, B, K), time-major: every slice [t] is contiguous
        filtered, c = forward_filter(start, trans, emit_x)
        T, B, K = filtered.shape
        beta = torch.ones_like(filtered)
        weighted = torch.empty_like(filtered)  # E[:, x_t] * b_t / c_t
        weighted[-1] = emit_x[-1] / c[-1, :, None]
        for t in range(T - 2, -1, -1):
            torch.matmul(weighted[t + 1], trans.t(), out=beta[t])
            weighted[t] = emit_x[t] * beta[t] / c[t, :, None]
        gamma = filtered * beta  # (T, B, K)
        xi = filtered[:-1].reshape(-1, K).t() @ weighted[1:].reshape(-1, K)
        emit_counts = gamma.new_zeros(self.config.vocab_size, K)
        emit_counts.index_add_(0, ids.t().reshape(-1), gamma.reshape(-1, K))
        return EMStats(
            start=gamma[0].sum(0).double(),
            trans=(trans * xi).double(),
            emit=emit_counts.t().double(),
            log_likelihood=float(c.log().double().sum()),
            n_tokens=B * T,
            n_sequences=B,
        )

    @torch.no_grad()
    def maximize(self, stats: EMStats) -> None:
        """The M-step: each distribution becomes its normalised expected counts plus
        ``em_pseudocount``."""
        extra = float(self.config.em_pseudocount)
        self.start.set_probs(stats.start + extra)
        self.transition.set_probs(stats.trans + extra)
        self.emission.set_probs(stats.emit + extra)

    def em_step(self, batches: Iterable[Tensor]) -> EMStats:
        """One Baum-Welch iteration over every sequence of ``batches`` (tensors ``(B, T)``,
        any mix of lengths); returns the E-step's counts and log-likelihood (under the
        parameters before the update). Rows are regrouped into chunks of about
        :data:`EM_CHUNK` values so each step of the recursions is one large matrix product."""
        K, V = self.config.n_states, self.config.vocab_size
        total = EMStats(
            torch.zeros(K, dtype=torch.float64),
            torch.zeros(K, K, dtype=torch.float64),
            torch.zeros(K, V, dtype=torch.float64),
        )
        device = self.start.logits.device
        for chunk in _chunks(batches, K):
            stats = self.expected_counts(chunk.to(device))
            stats.start, stats.trans, stats.emit = (
                s.cpu() for s in (stats.start, stats.trans, stats.emit)
            )
            total.add(stats)
        if total.n_sequences == 0:
            raise InputError("no sequences to fit the HMM on")
        self.maximize(total)
        return total

    def fit_step(self, windows: Iterable[dict[str, Tensor]]) -> tuple[float, int]:
        """One training step of ``train.hmm_em``: an :meth:`em_step` over the ``ids`` of every
        window of the training split. Returns the data's nats per token before the update and
        the number of tokens (what the trainer logs as the step's loss and tokens)."""
        stats = self.em_step(window["ids"] for window in windows)
        return -stats.log_likelihood / max(stats.n_tokens, 1), stats.n_tokens

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters; ``non_embedding`` leaves out the emission matrix."""
        return count_params(self, exclude=(self.emission,) if non_embedding else ())


def _chunks(batches: Iterable[Tensor], n_states: int) -> Iterator[Tensor]:
    """The rows of ``batches`` regrouped by length into tensors of about ``EM_CHUNK /
    (T * K)`` rows."""
    pending: dict[int, list[Tensor]] = {}
    for x in batches:
        if x.dim() != 2:
            raise InputError(f"sequences must be (B, T), got shape {tuple(x.shape)}")
        rows = max(1, EM_CHUNK // (x.shape[1] * n_states))
        parts = pending.setdefault(x.shape[1], [])
        parts.append(x)
        if sum(p.shape[0] for p in parts) >= rows:
            joined = torch.cat(parts)
            full = joined.shape[0] // rows * rows
            yield from joined[:full].split(rows)
            parts[:] = [joined[full:]] if joined.shape[0] > full else []
    for parts in pending.values():
        if parts:
            yield torch.cat(parts)


def split_sequences(ids: Tensor, length: int) -> list[Tensor]:
    """A 1-D token tensor cut into consecutive sequences of ``length`` tokens: ``[(N, length),
    (1, rest)]`` (the rest only when there is one); ``hmmlearn``'s ``lengths`` are
    ``[length] * N + [rest]``."""
    n = ids.shape[0] // length
    out = [ids[: n * length].view(n, length)] if n else []
    if ids.shape[0] > n * length:
        out.append(ids[n * length :].view(1, -1))
    return out


def _describe(c: HMMConfig) -> str:
    return (
        f"hidden Markov model, K={c.n_states} states, vocab={c.vocab_size}, window={c.block_size}"
    )


FAMILY = Family(
    "hmm", HMMConfig, HMMLM, "causal", frozenset({"generate"}), describe=_describe,
    description="hidden Markov model LM: forward algorithm, Viterbi, Baum-Welch EM "
    "(Baum et al. 1970, Rabiner 1989)", decoding=RECURRENT,
)  # fmt: skip
