"""LSTM LM training step: attnlm's ``RNNLM`` vs the same-shape model written the way PyTorch's
``word_language_model`` example writes it (``RNNModel`` in its ``model.py``, the loop of its
``main.py``).

Shape of the ``lstm-char`` preset: vocabulary 80 (the default corpus's characters), embedding
and hidden width 128, 2 layers, tied embeddings, dropout 0, BPTT 32, batch 16 (``--width`` and
``--bptt`` change them). One step, the same
for both models: carry the hidden state from the previous step (detached; the example's
``repackage_hidden``), forward, cross-entropy over the window, backward, gradient clipping at
0.25, and the example's plain SGD update ``p -= lr * grad`` (lr 20). Ours runs the way the
trainer runs it: a ``causal-stream`` batch (``ids``, ``targets``, ``stream``, ``reset``), the
hidden states carried inside the model, the summed loss divided by the number of targets.
The reference is our own code in the example's style (the example is not vendored).

Both run in this process with ``harness.set_threads(1)``, alternating in rounds; the
medians of the rounds are reported with the tokens/s ratio (goal: at least 1.0x).

    .venv/bin/python benchmarks/bench_lstm.py [--rounds 7] [--steps 20] [--cell lstm]
        [--width 128] [--bptt 32]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.models.rnn import RNNLM, RNNConfig

V, E, L, T, B = 80, 128, 2, 32, 16
LR, CLIP = 20.0, 0.25


class ExampleRNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder, in the style of
    the ``word_language_model`` example: inputs ``(T, B)``, one multi-layer ``nn.LSTM``,
    log-softmax outputs for ``nn.NLLLoss``."""

    def __init__(self, rnn_type: str, ntoken: int, ninp: int, nhid: int, nlayers: int,
                 dropout: float = 0.0, tie_weights: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type.upper())(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.rnn_type, self.nhid, self.nlayers = rnn_type.upper(), nhid, nlayers
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))  # fmt: skip
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def example_step(cell: str):
    model = ExampleRNNModel(cell, V, E, E, L).train()
    criterion = nn.NLLLoss()
    state = {"hidden": model.init_hidden(B)}

    def step(x, y):  # x, y: (B, T) as batches come from our source; the example wants (T, B)
        data, targets = x.t().contiguous(), y.t().contiguous().view(-1)
        hidden = repackage_hidden(state["hidden"])
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        state["hidden"] = hidden
        return loss

    return step


def our_step(cell: str):
    model = RNNLM(RNNConfig(vocab_size=V, cell=cell, n_layer=L, n_embd=E, block_size=T)).train()
    stream = torch.arange(B)
    first = {"reset": torch.ones(B, dtype=torch.bool)}
    later = {"reset": torch.zeros(B, dtype=torch.bool)}
    calls = [0]

    def step(x, y):
        reset = first if calls[0] == 0 else later
        calls[0] += 1
        model.zero_grad(set_to_none=True)
        out = model(x, y, stream=stream, **reset)
        (out.loss_sum / out.n_targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
        return out.loss

    return step


def timed(step, batches):
    """One run of every batch, as a harness contender."""
    return lambda: harness.time_call(lambda: [step(x, y) for x, y in batches])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cell", default="lstm", choices=("rnn", "lstm", "gru"))
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--bptt", type=int, default=32)
    args = harness.parse(ap, quick={"rounds": 1, "steps": 2})
    global E, T
    E, T = args.width, args.bptt
    harness.set_threads(1)
    torch.manual_seed(0)
    stream = torch.randint(0, V, (B, args.steps * T + 1))
    batches = [(stream[:, i * T : (i + 1) * T], stream[:, i * T + 1 : (i + 1) * T + 1])
               for i in range(args.steps)]  # fmt: skip
    steps = {"attnlm": our_step(args.cell), "example": example_step(args.cell)}
    for s in steps.values():  # warm-up
        timed(s, batches[:3])()
    tokens = args.steps * B * T
    harness.header(f"{args.cell}-train-step", shape=f"V={V} E=H={E} L={L} T={T} B={B}")
    runs = harness.alternate({k: timed(s, batches) for k, s in steps.items()}, args.rounds, True)
    r = harness.report(
        f"{args.cell}-train-step", runs, "attnlm", "example", ">= 1.0x speed-up", tokens=tokens
    )
    for k in runs:
        print(f"  {k:<8} {tokens / r[k]['wall_s']:>10,.0f} tokens/s")


if __name__ == "__main__":
    main()
