"""Our encoder-decoder Transformer against Hugging Face ``MarianMTModel`` of the same shape:
training throughput and BLEU under one wall-clock budget, and beam-4 decoding speed.

Both models train on the same pairs (the built-in English -> German dates and numbers task,
or ``--pairs FILE``), the same shared character tokenizer, the same batches (same seed), the
same optimiser (AdamW, linear warm-up then cosine decay over each model's own elapsed time),
the same loss (label-smoothed cross-entropy, 0.1) and dropout. The two training loops
alternate step by step, each model stepping while it has used less time than the other, so
that load changes on a shared machine hit both alike. Each stops when its own training time
reaches the budget. Then both translate the test sources with beam search (4 beams,
``transformers``' ``generate(num_beams=4)`` for Marian, with pad banned and a forced end token
as Marian's generation config says) and are scored with sacrebleu's corpus BLEU / chrF.

    PYTHONPATH=src python benchmarks/bench_seq2seq.py --budget 120 --test 200

Goals (issue 11): BLEU at least Marian's, at least 1.2x its training tokens/s, at least 2x its
beam decoding speed. One thread (``harness.set_threads(1)``); medians of ``--repeats`` timed
decoding runs.

``--user-path`` (issue 22, :mod:`seq2seq_user_path`): the translation presets as a user calls
them (no overrides) against a 60-line ``MarianMTModel`` script, same wall-clock budget, BLEU on
a separate test file of the Tatoeba English-French sample (or ``--pairs FILE``); goals >= 1.5x
the reference's BLEU for ``translate-transformer``, >= 1.0x for ``translate-rnn``:

    PYTHONPATH=src:benchmarks python benchmarks/bench_seq2seq.py --user-path --repeats 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick


def _data(pairs_path, n_test, seed=0):
    from attnlm.data.pairs import PairTokenizerConfig, split_pairs, train_pair_tokenizers
    from attnlm.data.tasks import load_pairs

    pairs, _ = load_pairs(pairs_path)
    split = split_pairs(pairs, valid=0.1, test=0.1, seed=seed)
    tok = train_pair_tokenizers(split.train, PairTokenizerConfig(kind="char", shared=True))
    train = [(tok.encode_source(s), tok.tokens(t, "target")) for s, t in split.train]
    test = split.test[:n_test]
    return tok, train, test


def _batch(train, idx, pad, start, eos):
    """(src, src_mask, tgt_in, labels) right-padded; tgt_in starts with ``start``."""
    rows = [train[i] for i in idx]
    S = max(len(s) for s, _ in rows)
    T = max(len(t) for _, t in rows) + 1
    src = torch.full((len(rows), S), pad)
    tgt_in = torch.full((len(rows), T), pad)
    labels = torch.full((len(rows), T), -100)
    for r, (s, t) in enumerate(rows):
        src[r, : len(s)] = torch.tensor(s)
        tgt_in[r, : len(t) + 1] = torch.tensor([start, *t])
        labels[r, : len(t) + 1] = torch.tensor([*t, eos])
    return src, src != pad, tgt_in, labels


def _models(tok, args):
    from transformers import MarianConfig, MarianMTModel

    from attnlm.models.transformer import Transformer, TransformerConfig

    ids = tok.target_ids
    V = ids.vocab_size
    torch.manual_seed(0)
    ours = Transformer(
        TransformerConfig(
            vocab_size=V,
            d_model=args.d_model,
            n_head=args.heads,
            n_encoder_layers=args.layers,
            n_decoder_layers=args.layers,
            d_ff=args.d_ff,
            dropout=0.1,
            label_smoothing=0.1,
            positions_layout="split",
            pad_id=ids.pad,
            bos_id=ids.pad,
            eos_id=ids.eos,
        )  # fmt: skip
    )
    hf_cfg = MarianConfig(
        vocab_size=V, d_model=args.d_model, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff,
        activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        max_position_embeddings=512, scale_embedding=True, pad_token_id=ids.pad,
        decoder_start_token_id=ids.pad, eos_token_id=ids.eos, forced_eos_token_id=ids.eos,
    )  # fmt: skip
    torch.manual_seed(0)
    marian = MarianMTModel(hf_cfg)
    marian.generation_config.bad_words_ids = [[ids.pad]]
    marian.generation_config.forced_eos_token_id = ids.eos
    marian.generation_config.decoder_start_token_id = ids.pad
    return ours, marian


class Runner:
    """One model's training loop state (optimizer, clock, token count)."""

    def __init__(self, name, model, loss_fn, args):
        self.name, self.model, self.loss_fn = name, model, loss_fn
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                                     weight_decay=0.01)  # fmt: skip
        self.elapsed, self.tokens, self.steps = 0.0, 0, 0
        self.gen = torch.Generator().manual_seed(1)
        self.args = args

    def lr(self):
        a = self.args
        if self.steps < a.warmup:
            return a.lr * (self.steps + 1) / a.warmup
        frac = min(1.0, self.elapsed / a.budget)
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * frac))

    def step(self, train, pad, eos):
        idx = torch.randint(len(train), (self.args.batch,), generator=self.gen).tolist()
        src, mask, tgt_in, labels = _batch(train, idx, pad, pad, eos)
        t0 = time.perf_counter()
        for g in self.opt.param_groups:
            g["lr"] = self.lr()
        self.model.train()
        loss = self.loss_fn(self.model, src, mask, tgt_in, labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.elapsed += time.perf_counter() - t0
        self.tokens += int(mask.sum()) + int((labels != -100).sum())
        self.steps += 1
        return float(loss.detach())


def ours_loss(model, src, mask, tgt_in, labels):
    return model(src, tgt_in, mask, targets=labels).loss


def marian_loss(model, src, mask, tgt_in, labels):
    logits = model(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt_in).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100, label_smoothing=0.1)  # fmt: skip


@torch.inference_mode()
def decode_ours(model, sources, n_new, batch):
    from attnlm.generate import beam_search

    out = []
    for i in range(0, len(sources), batch):
        out += beam_search(model, sources[i : i + batch], 4, max_new_tokens=n_new)
    return out


@torch.inference_mode()
def decode_marian(model, sources, pad, n_new, batch):
    out = []
    for i in range(0, len(sources), batch):
        chunk = sources[i : i + batch]
        S = max(map(len, chunk))
        src = torch.full((len(chunk), S), pad)
        for r, s in enumerate(chunk):
            src[r, : len(s)] = torch.tensor(s)
        seqs = model.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=4,
                              max_new_tokens=n_new, do_sample=False)  # fmt: skip
        out += seqs.tolist()
    return out


def main() -> None:
    from attnlm.data.pairs import group_references
    from attnlm.loading.scores import corpus_bleu, corpus_chrf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=None, help="pairs TSV (default: the built-in task)")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="training seconds per model (120; --user-path: 300)",
    )
    ap.add_argument("--test", type=int, default=200, help="test sources to translate")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-ff", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed decoding runs, median (3; --user-path: rounds of training, 1)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1)")
    user = ap.add_argument_group("user path (issue 22; seq2seq_user_path.py)")
    user.add_argument(
        "--user-path",
        action="store_true",
        help="the presets as a user calls them vs a MarianMTModel script",
    )
    user.add_argument("--presets", nargs="+", default=["translate-transformer", "translate-rnn"])
    user.add_argument(
        "--ref-vocab",
        type=int,
        nargs="*",
        default=[4000, 0],
        help="the script's BPE vocabularies, one reference run each (0: the size "
        "attnlm's rule picks for the data)",
    )
    user.add_argument("--tune", action="store_true", help="score valid.tsv, not test.tsv")
    user.add_argument("--set", action="append", default=[], help="tuning only: --set for ours")
    args = harness.parse(ap, quick={"budget": 3.0, "test": 10, "repeats": 1})
    if not harness.require("seq2seq", "transformers"):
        return
    if args.user_path:
        import seq2seq_user_path

        if args.set:
            args.set = [x for kv in args.set for x in ("--set", kv)]
        args.threads, args.repeats = args.threads or 1, args.repeats or 1
        args.budget = args.budget or 300.0
        seq2seq_user_path.main(args)
        return
    args.threads, args.repeats = args.threads or 1, args.repeats or 3
    args.budget = args.budget or 120.0
    harness.set_threads(args.threads)

    tok, train, test = _data(args.pairs, args.test)
    pad, eos = tok.target_ids.pad, tok.target_ids.eos
    ours, marian = _models(tok, args)
    n_params = (sum(p.numel() for p in ours.parameters()),
                sum(p.numel() for p in marian.parameters()))  # fmt: skip
    print(f"data: {len(train):,} training pairs, {len(test)} test pairs; char vocab "
          f"{tok.target_ids.vocab_size}; parameters ours {n_params[0]:,}, Marian "
          f"{n_params[1]:,}; budget {args.budget:.0f}s each, {args.threads} thread(s)")  # fmt: skip
    runners = [Runner("attnlm", ours, ours_loss, args), Runner("Marian", marian, marian_loss, args)]
    while any(r.elapsed < args.budget for r in runners):
        r = min((r for r in runners if r.elapsed < args.budget), key=lambda r: r.elapsed)
        r.step(train, pad, eos)
    for r in runners:
        print(
            f"train {r.name:7s}: {r.steps} steps in {r.elapsed:.1f}s, "
            f"{r.tokens / r.elapsed:,.0f} tokens/s"
        )

    sources, refs = group_references(test)
    src_ids = [tok.encode_source(s) for s in sources]
    n_new = 2 * max(map(len, src_ids)) + 10
    ours.eval()
    marian.eval()
    results = {}
    for name, fn in (
        ("attnlm", lambda: decode_ours(ours, src_ids, n_new, 50)),
        ("Marian", lambda: decode_marian(marian, src_ids, pad, n_new, 50)),
    ):
        times, outs = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            outs = fn()
            times.append(time.perf_counter() - t0)
        hyps = [tok.decode_target(o) for o in outs]
        n_tok = sum(len([t for t in o[1:] if t != pad]) for o in outs)
        results[name] = {
            "bleu": corpus_bleu(hyps, refs).score,
            "chrf": corpus_chrf(hyps, refs).score,
            "seconds": statistics.median(times),
            "tokens": n_tok,
        }
        r = results[name]
        print(f"beam-4 {name:7s}: BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f}; "
              f"{len(src_ids)} sentences in {r['seconds']:.2f}s (median of {args.repeats}), "
              f"{r['tokens'] / r['seconds']:,.0f} tokens/s")  # fmt: skip
    a, m = runners
    train_ratio = (a.tokens / a.elapsed) / (m.tokens / m.elapsed)
    beam_ratio = results["Marian"]["seconds"] / results["attnlm"]["seconds"]
    print(
        f"ratios (ours / Marian): training tokens/s {train_ratio:.2f}x (goal >= 1.2), "
        f"beam-4 speed {beam_ratio:.2f}x (goal >= 2), BLEU {results['attnlm']['bleu']:.2f} "
        f"vs {results['Marian']['bleu']:.2f} (goal: at least Marian's)"
    )
    harness.emit(
        {
            "bench": "seq2seq-vs-marian",
            "clock": "wall",
            "budget_s": args.budget,
            "train_tokens_per_s": {r.name: r.tokens / r.elapsed for r in runners},
            "speedup_train": train_ratio,
            "target_train": ">= 1.2x",
            "beam4": results,
            "speedup_beam4": beam_ratio,
            "target_beam4": ">= 2x",
            "target_bleu": ">= Marian",
        }
    )


if __name__ == "__main__":
    main()
