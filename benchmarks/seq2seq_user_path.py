"""The "user path" row of ``bench_seq2seq.py`` (issue 22): the translation presets exactly as
a user calls them, against a 60-line ``MarianMTModel`` script, on real sentence pairs.

Data: the Tatoeba English-French sample (``../shared/data/tatoeba-eng-fra-5k.tsv``, CC-BY 2.0
FR) or any pairs file given with ``--pairs``, cut as a user would into three files by source
sentence (:func:`attnlm.data.pairs.split_pairs`, fixed seed; 80% / 10% / 10%): ``train.tsv``,
``valid.tsv`` (what the presets were tuned on) and ``test.tsv`` (what is reported; nothing
was tuned on it).

Ours: ``attnlm train --preset P --pairs train.tsv --valid-pairs valid.tsv --test-pairs
test.tsv --out DIR`` (no other settings: the preset's own time budget, 5 minutes) and
``attnlm eval --checkpoint DIR`` (greedy, every pair of the test file).

The reference: the script a user writes from the ``transformers`` docs, with the shape the
issue gives: a byte-level BPE (``tokenizers.ByteLevelBPETokenizer``, 4,000 tokens, trained on
both sides of train.tsv; a second reference run uses the size attnlm's rule picks for the
data, ``--ref-vocab 4000 0``, and ours is compared with the better of the two),
``MarianMTModel`` with d_model 128, 2+2 layers, 4 heads, feed-forward
512, AdamW at 1e-3, batches of 64 random pairs, the loss ``model(labels=...)`` computes, for
the same wall-clock budget; greedy ``generate``. BLEU: sacrebleu on the test file, all
translations of a source as its references, for both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PAIRS = ROOT.parent / "shared" / "data" / "tatoeba-eng-fra-5k.tsv"
SPLIT_SEED = 22  # the user's own cut of the file (not the run split seed)


def split_files(pairs_path, folder):
    """Write train.tsv / valid.tsv / test.tsv into ``folder`` (80/10/10 by source)."""
    from attnlm.data.pairs import read_pairs, split_pairs, write_pairs

    pairs, _ = read_pairs(pairs_path)
    parts = split_pairs(pairs, valid=0.1, test=0.1, seed=SPLIT_SEED)
    paths = {}
    for name in ("train", "valid", "test"):
        paths[name] = Path(folder) / f"{name}.tsv"
        write_pairs(paths[name], [(p.source, p.target) for p in getattr(parts, name)])
    return paths


def run_ours(preset, files, out, extra=(), eval_on="test"):
    """Train and evaluate one preset through the command line; returns the eval JSON."""
    import contextlib
    import io

    from attnlm.cli import main

    argv = ["train", "--preset", preset, "--pairs", str(files["train"]), "--valid-pairs",
            str(files["valid"]), "--test-pairs", str(files["test"]), "--out", str(out),
            "--no-progress", *extra]  # fmt: skip
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):
        assert main(argv) == 0, log.getvalue()
    seconds = time.perf_counter() - t0
    buf = io.StringIO()
    which = [] if eval_on == "test" else ["--pairs", str(files[eval_on])]
    with contextlib.redirect_stdout(buf):
        assert main(["eval", "--checkpoint", str(out), *which, "--json"]) == 0
    result = json.loads(buf.getvalue())
    lines = log.getvalue().splitlines()
    result["log"] = [ln for ln in lines if ln.startswith(("pairs:", "model:", "done:"))]
    result["wall_s"] = seconds
    return result


def run_reference(files, budget, vocab=4000, eval_on="test", seed=0):
    """The 60-line MarianMTModel script; returns BLEU/chrF on ``files[eval_on]``."""
    from transformers import MarianConfig, MarianMTModel

    from attnlm.data.pairs import group_references, read_pairs
    from attnlm.loading.scores import translation_scores
    from tokenizers import ByteLevelBPETokenizer

    train, _ = read_pairs(files["train"])
    if not vocab:  # 0: the size our rule picks for these pairs (attnlm.tokenizers.sizing)
        from attnlm.tokenizers.sizing import vocab_size_for

        vocab = vocab_size_for([p.source for p in train] + [p.target for p in train])
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([p.source for p in train] + [p.target for p in train],
                            vocab_size=vocab, special_tokens=["<pad>", "</s>", "<s>"])  # fmt: skip
    pad, eos = tok.token_to_id("<pad>"), tok.token_to_id("</s>")
    config = MarianConfig(
        vocab_size=tok.get_vocab_size(), d_model=128, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=512,
        decoder_ffn_dim=512, max_position_embeddings=256, pad_token_id=pad, eos_token_id=eos,
        decoder_start_token_id=pad, forced_eos_token_id=eos,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    src = [tok.encode(p.source).ids + [eos] for p in train]
    tgt = [tok.encode(p.target).ids + [eos] for p in train]

    def pad_to(rows, fill):
        n = max(map(len, rows))
        return torch.tensor([r + [fill] * (n - len(r)) for r in rows])

    gen = torch.Generator().manual_seed(seed)
    steps, t0 = 0, time.perf_counter()
    model.train()
    while time.perf_counter() - t0 < budget:
        idx = torch.randint(len(src), (64,), generator=gen).tolist()
        ids = pad_to([src[i] for i in idx], pad)
        labels = pad_to([tgt[i] for i in idx], -100)
        loss = model(input_ids=ids, attention_mask=(ids != pad).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    seconds = time.perf_counter() - t0
    model.eval()
    test, _ = read_pairs(files[eval_on])
    sources, refs = group_references(test)
    hyps = []
    with torch.inference_mode():
        for i in range(0, len(sources), 64):
            ids = pad_to([tok.encode(s).ids + [eos] for s in sources[i : i + 64]], pad)
            out = model.generate(input_ids=ids, attention_mask=(ids != pad).long(),
                                 max_new_tokens=2 * ids.shape[1] + 10, num_beams=1)  # fmt: skip
            hyps += [tok.decode(o, skip_special_tokens=True) for o in out.tolist()]
    scores = translation_scores(hyps, refs)
    scores.update(steps=steps, train_s=seconds, pairs=len(test), vocab=tok.get_vocab_size(),
                  examples=list(zip(sources[:3], hyps[:3])))  # fmt: skip
    return scores


def main(args) -> None:
    import tempfile

    torch.set_num_threads(args.threads)
    pairs = args.pairs or DEFAULT_PAIRS
    eval_on = "valid" if args.tune else "test"
    with tempfile.TemporaryDirectory() as tmp:
        files = split_files(pairs, tmp)
        sizes = {k: len(Path(v).read_text(encoding="utf-8").splitlines()) for k, v in files.items()}
        print(f"user path: {pairs}: train {sizes['train']:,}, valid {sizes['valid']:,}, test "
              f"{sizes['test']:,} pairs; scored on {eval_on}.tsv; reference budget "
              f"{args.budget:.0f}s, {args.threads} thread(s)")  # fmt: skip
        rows = {}
        refs = [f"reference-{v or 'sized'}" for v in args.ref_vocab]
        for rep in range(args.repeats):
            order = [*refs, *args.presets]
            if rep % 2:
                order.reverse()  # alternate who runs first on a shared machine
            for name in order:
                if name in refs:
                    vocab = args.ref_vocab[refs.index(name)]
                    r = run_reference(files, args.budget, vocab, eval_on, seed=rep)
                    what = f"{r['steps']} steps in {r['train_s']:.0f}s, vocab {r['vocab']}; "
                    what += " | ".join(f"{a} -> {b}" for a, b in r["examples"])
                else:
                    out = Path(tmp) / f"{name}-{rep}"
                    r = run_ours(name, files, out, args.set, eval_on)
                    what = f"{r['wall_s']:.0f}s wall; " + " | ".join(r["log"])
                rows.setdefault(name, []).append(r["bleu"])
                print(f"[{rep}] {name}: BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f} ({what})",
                      flush=True)  # fmt: skip
        if not refs:  # tuning runs of ours only
            return
        best = [max(rows[n][i] for n in refs) for i in range(args.repeats)]  # per round
        for name in args.presets:
            bleus = rows[name]
            ratios = [b / max(r, 1e-9) for b, r in zip(bleus, best)]
            print(f"user path {name}: BLEU {', '.join(f'{b:.2f}' for b in bleus)} vs the best "
                  f"reference {', '.join(f'{b:.2f}' for b in best)}: ratio "
                  f"{', '.join(f'{x:.2f}x' for x in ratios)}")  # fmt: skip
