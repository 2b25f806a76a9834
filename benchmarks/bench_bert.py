"""BERT on the CPU: our encoder against ``transformers.BertForMaskedLM`` at the same shape, and
WordPiece encoding against Hugging Face ``tokenizers``, in one run.

Shape (BERT-mini-like, the bert-base-uncased vocabulary): 4 layers, 4 heads, width 256,
feed-forward 1024, vocabulary 30,522, batch 8 x 128 tokens, dropout 0, GELU (erf), both
models with the same weights (ours is loaded from the ``BertForMaskedLM`` folder that
``transformers`` wrote). ``transformers`` runs its default attention (SDPA).

* forward: inference (``no_grad``, eval mode) with MLM logits at every position;
* forward + MLM loss: BERT masking (15%; 80/10/10) of the same batch, loss at masked positions
  only (ours runs the vocabulary projection at those positions only; ``transformers``
  everywhere);
* training step: forward with loss, backward, AdamW step (lr 1e-4, the same for both),
  zero_grad. Both models start from the same weights and see the same batches, so their losses
  must agree step by step (printed).

Times: wall-clock, ``harness.set_threads(1)``, ours and theirs alternating in rounds;
medians over rounds. tokens/s counts input tokens (B x T). WordPiece: the first
``--wp-chars`` characters of the default corpus, ours (cold cache) vs ``tokenizers``' Rust
``BertWordPieceTokenizer`` on one thread (full comparison: ``bench_wordpiece.py``).

    .venv/bin/python benchmarks/bench_bert.py [--rounds 5] [--steps 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import harness  # noqa: E402  (benchmarks/harness.py: runs, medians, ratios, --quick)
from attnlm.loading.objectives import MaskingConfig, mask_tokens  # noqa: E402
from attnlm.models import from_hf  # noqa: E402

V, T, B, L, H, C, F = 30522, 128, 8, 4, 4, 256, 1024
VOCAB = (
    Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "bert-base-uncased-vocab.txt"
)


def models(folder: Path):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
        intermediate_size=F, max_position_embeddings=512, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, hidden_act="gelu",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(cfg)
    hf.save_pretrained(folder)
    ours = from_hf(folder)
    return ours, hf


def batches(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cfg = MaskingConfig(mask_id=103, vocab_size=V, special_ids=(0, 101, 102, 103))
    out = []
    for _ in range(n):
        ids = torch.randint(1000, V, (B, T), generator=g)
        out.append(mask_tokens(ids, torch.rand(3, B, T, generator=g), cfg))
    return out


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="training steps per round")
    ap.add_argument("--wp-chars", type=int, default=1_000_000)
    args = harness.parse(ap, quick={"rounds": 1, "steps": 1, "wp_chars": 50_000})
    if not harness.require("bert", "transformers", "tokenizers"):
        return
    harness.set_threads(1)
    with tempfile.TemporaryDirectory() as d:
        ours, hf = models(Path(d))
    data = batches(args.rounds * args.steps + 1)
    probe = data[0]

    # same loss for the same weights and batch
    ours.eval(), hf.eval()
    with torch.no_grad():
        lo = float(ours(probe["ids"], targets=probe["targets"]).loss)
        lh = float(hf(input_ids=probe["ids"], labels=probe["targets"]).loss)
    print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, 1 thread; "
          f"B={B} T={T} L={L} H={H} C={C} F={F} V={V}")  # fmt: skip
    print(f"MLM loss, same weights and batch: ours {lo:.6f}  transformers {lh:.6f}  "
          f"|diff| {abs(lo - lh):.1e}")  # fmt: skip

    rows: dict[str, tuple[list[float], list[float]]] = {}

    def measure(name, f_ours, f_hf):
        a, b = rows.setdefault(name, ([], []))
        for _ in range(args.rounds):
            a.append(timed(f_ours))
            b.append(timed(f_hf))

    x, y = probe["ids"], probe["targets"]
    with torch.no_grad():
        f_ours, f_hf = (lambda: ours(x)), (lambda: hf(input_ids=x))
        f_ours(), f_hf()  # warm-up
        measure("forward (all logits)", f_ours, f_hf)
        f_ours, f_hf = (lambda: ours(x, targets=y)), (lambda: hf(input_ids=x, labels=y))
        measure("forward + MLM loss", f_ours, f_hf)

    ours.train(), hf.train()
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-4, weight_decay=0.01)
    opt_h = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01)
    losses_o, losses_h = [], []

    def step_ours(batch):
        loss = ours(batch["ids"], targets=batch["targets"]).loss
        loss.backward()
        opt_o.step()
        opt_o.zero_grad(set_to_none=True)
        losses_o.append(loss.item())

    def step_hf(batch):
        loss = hf(input_ids=batch["ids"], labels=batch["targets"]).loss
        loss.backward()
        opt_h.step()
        opt_h.zero_grad(set_to_none=True)
        losses_h.append(loss.item())

    times_o, times_h = [], []
    for r in range(args.rounds):
        chunk = data[1 + r * args.steps : 1 + (r + 1) * args.steps]
        times_o.append(timed(lambda c=chunk: [step_ours(b) for b in c]) / args.steps)
        times_h.append(timed(lambda c=chunk: [step_hf(b) for b in c]) / args.steps)
    rows["training step (fwd+bwd+AdamW)"] = (times_o, times_h)
    drift = max(abs(a - b) for a, b in zip(losses_o, losses_h))
    print(f"training losses over {len(losses_o)} steps: ours {losses_o[0]:.4f} -> "
          f"{losses_o[-1]:.4f}, transformers {losses_h[0]:.4f} -> {losses_h[-1]:.4f}; "
          f"max |diff| {drift:.1e}")  # fmt: skip

    print(f"\n{'':<32}{'ours tok/s':>12}{'HF tok/s':>12}{'ours/HF':>9}")
    for name, (a, b) in rows.items():
        to, th = B * T / statistics.median(a), B * T / statistics.median(b)
        print(f"{name:<32}{to:12,.0f}{th:12,.0f}{to / th:8.2f}x")
        harness.emit(
            {
                "bench": f"bert {name}",
                "clock": "wall",
                "runs": args.rounds,
                "attnlm": {"tokens_per_s": to},
                "hf": {"tokens_per_s": th},
                "speedup_wall": to / th,
                **({"target": ">= 1.2x speed-up"} if name.startswith("training") else {}),
            }
        )

    wordpiece(args.wp_chars)


def wordpiece(n_chars: int) -> None:
    from attnlm.data.corpus import load_text
    from attnlm.tokenizers.wordpiece import WordPieceTokenizer
    from tokenizers import BertWordPieceTokenizer

    text = load_text(None)[:n_chars]
    mb = len(text.encode("utf-8")) / 1e6
    hf = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    t_hf, enc = _cpu(lambda: hf.encode_batch(text.splitlines(), add_special_tokens=False))
    tok = WordPieceTokenizer.from_vocab_file(VOCAB)
    t_ours, ids = _cpu(lambda: tok.encode(text))
    assert ids == [i for e in enc for i in e.ids], "WordPiece ids differ from HF tokenizers"
    print(f"\nWordPiece, {mb:.2f} MB of the default corpus, ids identical:")
    print(f"{'ours (cold cache)':<32}{mb / t_ours:9.2f} MB/s")
    print(f"{'HF tokenizers (Rust, 1 thread)':<32}{mb / t_hf:9.2f} MB/s   ours/HF "
          f"{t_hf / t_ours:.2f}x  (full run: benchmarks/bench_wordpiece.py)")  # fmt: skip


def _cpu(fn):
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


if __name__ == "__main__":
    main()
