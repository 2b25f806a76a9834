"""``attnlm generate``: continue a prompt with a trained checkpoint."""

from __future__ import annotations

import argparse
import sys

from attnlm.generate.sampling import MAX_NEW_TOKENS_LIMIT
from attnlm.validate import (
    arg,
    device,
    finite_float,
    int_in_range,
    positive_int,
    seed,
    threads,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="sample text from a checkpoint (KV cache, streaming)")
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="run or checkpoint folder",
    )
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument(
        "--max-new-tokens",
        type=arg(int_in_range, lo=0, hi=MAX_NEW_TOKENS_LIMIT),
        default=200,
        help=f"at most {MAX_NEW_TOKENS_LIMIT:,}",
    )
    p.add_argument(
        "--temperature", type=arg(finite_float, lo=0.0), default=1.0, help="0 means greedy"
    )
    p.add_argument("--top-k", type=arg(positive_int), default=None)
    p.add_argument("--top-p", type=arg(finite_float, lo=0.0, hi=1.0, lo_open=True), default=None)
    p.add_argument("--seed", type=arg(seed), default=None)
    p.add_argument("--num-samples", type=arg(int_in_range, lo=1, hi=10_000), default=1)
    p.add_argument(
        "--stop", action="append", default=[], metavar="STR", help="stop string (repeatable)"
    )
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    p.add_argument(
        "--no-cache", dest="use_cache", action="store_false", help="recompute every step"
    )
    p.add_argument("--device", default="auto", type=arg(device))
    p.add_argument("--threads", type=arg(threads), default=None)
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    import torch

    from attnlm.checkpoint import load_checkpoint
    from attnlm.device import resolve_device
    from attnlm.errors import InputError
    from attnlm.generate.sampling import SamplingConfig
    from attnlm.generate.text import encode_prompt, generate_text

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.num_samples < 1:
        raise InputError("--num-samples must be >= 1")
    sampling = SamplingConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
    ck = load_checkpoint(args.checkpoint, resolve_device(args.device))
    if "generate" not in ck.family.capabilities:
        raise InputError(f"{ck.path}: a {ck.family.type} model does not generate text")
    encode_prompt(ck.tokenizer, args.prompt)  # fail early, before any output
    out = sys.stdout
    if not args.stream:  # all samples in one batch
        texts = generate_text(
            ck.model,
            ck.tokenizer,
            [args.prompt] * args.num_samples,
            sampling=sampling,
            use_cache=args.use_cache,
        )
        out.write(("\n" + "-" * 40 + "\n").join(args.prompt + t for t in texts) + "\n")
        return 0
    for i in range(args.num_samples):  # streaming: one sample after the other
        if i:
            out.write("\n" + "-" * 40 + "\n")
        out.write(args.prompt)
        out.flush()

        def on_text(_row: int, piece: str) -> None:
            out.write(piece)
            out.flush()

        seed = None if args.seed is None else args.seed + i
        generate_text(
            ck.model,
            ck.tokenizer,
            [args.prompt],
            sampling=sampling.with_(seed=seed),
            use_cache=args.use_cache,
            on_text=on_text,
        )
        out.write("\n")
        out.flush()
    return 0
