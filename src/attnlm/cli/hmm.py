"""``attnlm hmm ...``: the hidden Markov model family's own commands.

* ``attnlm hmm fit [--text PATH] [--states K] [--iters N] --out DIR``: Baum-Welch EM (the
  ``hmm-char`` preset with ``train.hmm_em = true``), a run folder like ``attnlm train``'s, so
  ``attnlm eval`` and ``attnlm generate`` read it;
* ``attnlm hmm viterbi --checkpoint DIR "TEXT" [--json]`` (or ``--text PATH``): the most
  probable state of every token.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

from attnlm.base.validate import existing_dir, finite_float, output_dir, positive_int
from attnlm.cli.common import (
    add_command,
    add_command_group,
    add_json_argument,
    add_literal_text_arguments,
    add_options,
    add_progress_argument,
    add_runtime_arguments,
    add_seed_argument,
    add_set_argument,
    add_text_argument,
    add_time_budget_argument,
    arg,
    as_given,
    defaults,
    literal_or_file,
    option,
    text_file,
    use_threads,
)

FIT_PRESET = "hmm-char"


FIT_HELP = "fit an HMM language model by Baum-Welch EM"
FIT_DESCRIPTION = (
    "Fit a hidden Markov model to a text by Baum-Welch EM: each iteration runs the "
    "forward-backward algorithm over the whole training split (cut into sequences of "
    "--block-size tokens, each from the start distribution) and re-estimates the start, "
    f"transition and emission probabilities. Starts from the {FIT_PRESET} preset with "
    "train.hmm_em = true and writes a run folder (checkpoint/, metrics.jsonl) that attnlm eval "
    "and attnlm generate read."
)

# ``attnlm hmm fit``: the text, the model's size, EM's iterations, the machine
FIT_OPTIONS = (
    add_text_argument,
    option("--out", default="runs/hmm", metavar="DIR", type=arg(output_dir),
           help="run folder (default runs/hmm)"),
    option("--states", type=arg(positive_int), default=None, help="hidden states K"),
    option("--iters", type=arg(positive_int), default=20, help="EM iterations (20)"),
    option("--block-size", type=arg(positive_int), default=None,
           help="training window in tokens: one EM sequence and one evaluation window"),
    option("--pseudocount", type=arg(finite_float, lo=0), default=None,
           help="added to every expected count (model.em_pseudocount)"),
    option("--tokenizer", default=None, type=text_file(as_given),
           help="the tokenizer: char, bpe, or a saved tokenizer JSON"),
    partial(add_time_budget_argument, default=None),
    partial(add_runtime_arguments, device=None),
    partial(add_seed_argument, help="the initial values"),
    add_progress_argument,
    partial(add_set_argument, example="e.g. model.init_std=0.5"),
)  # fmt: skip

# ``attnlm hmm viterbi``: the run and the text it decodes
VITERBI_OPTIONS = (
    option("--checkpoint", required=True, metavar="DIR", type=arg(existing_dir),
           help="an hmm run folder"),
    partial(add_literal_text_arguments, what="the text to decode"),
    add_json_argument,
    partial(add_runtime_arguments, device="cpu"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    hsub = add_command_group(sub, "hmm", "hidden Markov model LM: Baum-Welch fit, Viterbi paths")
    fit = hsub.add_parser("fit", help=FIT_HELP, description=FIT_DESCRIPTION)
    add_options(fit, *FIT_OPTIONS, defaults(func=_fit))
    add_command(hsub, "viterbi", _viterbi, *VITERBI_OPTIONS)


def _fit(args: argparse.Namespace) -> int:
    from attnlm.base.config import load_preset
    from attnlm.train.config import apply_overrides, spec_from_tables
    from attnlm.train.run import new_run_dir_check, train_run

    tables = apply_overrides(load_preset(FIT_PRESET), args.set)
    model, train = tables.setdefault("model", {}), tables.setdefault("train", {})
    given = {"n_states": args.states, "block_size": args.block_size,
             "em_pseudocount": args.pseudocount}  # fmt: skip
    model.update({k: v for k, v in given.items() if v is not None})
    train.update(hmm_em=True, max_iters=args.iters, eval_interval=1, log_interval=1,
                 progress=args.progress)  # fmt: skip
    flags = {"tokenizer": args.tokenizer, "time_budget": args.time_budget,
             "threads": args.threads, "seed": args.seed, "device": args.device,
             "text": str(Path(args.text).resolve()) if args.text else None}  # fmt: skip
    train.update({k: v for k, v in flags.items() if v is not None})
    spec = spec_from_tables(tables, preset=FIT_PRESET)
    run_dir = Path(args.out)
    new_run_dir_check(run_dir)
    result = train_run(spec, run_dir)
    ev = result.last_eval
    tail = f"; val {ev.bpc:.4f} bits/char" if ev is not None and ev.bpc is not None else ""
    print(f"done: {result.step} EM iterations ({result.stop_reason}) in {result.elapsed:.1f}s"
          f"{tail}")  # fmt: skip
    print(f"run folder: {run_dir} (checkpoint/, metrics.jsonl: the log-likelihood per iteration)")
    return 0


def _viterbi(args: argparse.Namespace) -> int:
    """the most probable hidden state of each token of a text

    Decode the Viterbi path of a text under an HMM checkpoint: the state sequence z maximising p(x,
    z), and its log-probability."""
    import torch

    from attnlm.base.device import resolve_device
    from attnlm.base.errors import InputError
    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.tokenizers import encode_text, token_label

    text = literal_or_file(args)
    use_threads(args)
    ck = load_checkpoint(args.checkpoint, resolve_device(args.device))
    if not callable(getattr(ck.model, "viterbi", None)):
        raise InputError(f"{args.checkpoint}: a {ck.family.type} model has no hidden states "
                         "to decode; give an hmm checkpoint")  # fmt: skip
    ids = encode_text(ck.tokenizer, text, "the text")
    if not ids:
        raise InputError("the text is empty after tokenization")
    from attnlm.models.hmm import MAX_VITERBI_TOKENS

    if len(ids) > MAX_VITERBI_TOKENS:
        raise InputError(f"the text is {len(ids):,} tokens long; viterbi decodes at most "
                         f"{MAX_VITERBI_TOKENS:,} at once (split the text)")  # fmt: skip
    x = torch.tensor([ids], device=next(ck.model.parameters()).device)
    log_prob, path = ck.model.viterbi(x)
    tokens = [token_label(ck.tokenizer, i) for i in ids]
    states = path[0].tolist()
    if args.json:
        out = {"tokens": tokens, "ids": ids, "states": states, "log_prob": float(log_prob[0])}
        print(json.dumps(out))
        return 0
    print(f"best path: log p(text, states) = {float(log_prob[0]):.4f} nats")
    for token, state in zip(tokens, states):
        print(f"{token!r:>12}  {state}")
    return 0
