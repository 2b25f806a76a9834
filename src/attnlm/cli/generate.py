"""``attnlm generate``: continue a prompt with a trained checkpoint."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from attnlm.base.validate import finite_float, positive_int
from attnlm.cli.common import (
    add_draft_argument,
    add_lookahead_argument,
    add_model_spec_argument,
    add_num_samples_argument,
    add_options,
    add_pairs_argument,
    add_prompt_argument,
    add_runtime_arguments,
    add_sampling_arguments,
    add_stop_argument,
    add_weights_argument,
    arg,
    defaults,
    draft_from_args,
    flag,
    option,
    sampling_config,
    text_value,
    use_threads,
)


def _generate(args: argparse.Namespace) -> int:

    from attnlm.generate.options import DecodeOptions
    from attnlm.generate.stats import DecodeStats

    sampling = sampling_config(args)
    spec = args.model if args.model is not None else args.checkpoint
    model, tokenizer, threads = _load(args, spec, sampling)
    draft = draft_from_args(args, model, sampling)
    options = DecodeOptions(use_cache=args.use_cache, compile=args.compile,
                            lookahead=args.lookahead, draft=draft)  # fmt: skip
    stats = DecodeStats()
    texts = (_stream if args.stream else _batch)(args, model, tokenizer, sampling, options, stats)
    return _report(args, stats, texts, threads)


def _batch(args, model, tokenizer, sampling, options, stats) -> list[str]:
    """Every sample in one batch, printed when all are done."""
    from attnlm.generate.text import generate_text

    prompts = [args.prompt] * args.num_samples
    texts = generate_text(model, tokenizer, prompts, sampling, options, stats=stats)
    sys.stdout.write(("\n" + "-" * 40 + "\n").join(args.prompt + t for t in texts) + "\n")
    return texts


def _stream(args, model, tokenizer, sampling, options, stats) -> list[str]:
    """One sample after the other, each printed as it is decoded."""
    from attnlm.generate.text import generate_text

    out, texts = sys.stdout, []
    for i in range(args.num_samples):
        if i:
            out.write("\n" + "-" * 40 + "\n")
        out.write(args.prompt)
        out.flush()

        def on_text(_row: int, piece: str) -> None:
            out.write(piece)
            out.flush()

        seed = None if args.seed is None else args.seed + i
        texts += generate_text(model, tokenizer, [args.prompt], sampling.with_(seed=seed), options,
                               on_text=on_text, stats=stats)  # fmt: skip
        out.write("\n")
        out.flush()
    return texts


def _report(args: argparse.Namespace, stats, texts: list[str], threads: int | None) -> int:
    """With ``--json``: the timings and the texts as one JSON object, the last line of stdout
    (``threads``: the engine's, else PyTorch's)."""
    if args.json:
        import json

        if threads is None:
            import torch

            threads = torch.get_num_threads()
        record = {"texts": texts, **stats.to_json(), "threads": threads}
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    return 0


def _load(args: argparse.Namespace, spec: str, sampling) -> tuple:
    """``(model, tokenizer, threads)`` through :func:`attnlm.loading.sources.resolve`: the C engine
    (``c-engine``, no PyTorch) where the resolver's planner picks it for this decode (with the
    KV cache, uncompiled, the window holding prompt and new tokens) and ``threads`` its
    threads; else a PyTorch model (threads None: PyTorch's)."""
    from attnlm.base.errors import InputError
    from attnlm.generate.text import encode_prompt
    from attnlm.loading.sources import resolve

    engine_ok = args.use_cache and not args.compile
    model, tokenizer, info = resolve(spec, args.device, args.weights, engine_ok=engine_ok,
                                     threads=args.threads)  # fmt: skip
    # fail early; BOS where the tokenizer adds one (as generate_text encodes)
    prompts = [encode_prompt(tokenizer, args.prompt, specials=True)] * args.num_samples
    if info.details.get("backend") == "c-engine":
        from attnlm.generate import engine_decode

        if engine_decode.applies(model, prompts, sampling):
            return model, tokenizer, model.threads
        model, tokenizer, info = resolve(spec, args.device, args.weights)  # too long for it
    use_threads(args)
    if "generate" not in info.family.capabilities:
        raise InputError(f"{info.path}: a {info.family.type} model does not generate text")
    return model, tokenizer, None


def _translate(args: argparse.Namespace) -> int:

    from attnlm.base.device import resolve_device
    from attnlm.base.errors import InputError
    from attnlm.data.pairs import PairTokenizers
    from attnlm.generate.sampling import SamplingConfig
    from attnlm.generate.translate import translate
    from attnlm.loading.sources import load_model_ref

    use_threads(args)
    sampling = SamplingConfig(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    if args.beam > 1 and not sampling.greedy:
        raise InputError("--beam and --temperature > 0 exclude each other (beams do not sample)")
    if args.text and args.pairs:
        raise InputError("give sentences or --pairs FILE, not both")
    if args.pairs:
        from attnlm.data.pairs import read_pairs

        texts = [p.source for p in read_pairs(args.pairs)[0]]
    elif args.text:
        texts = list(args.text)
    else:
        from attnlm.base.textio import read_stdin

        texts = [t for t in read_stdin(empty_ok=True).splitlines() if t.strip()]
    if not texts:
        raise InputError("nothing to translate: give sentences, --pairs FILE or stdin lines")
    ck = load_model_ref(args.checkpoint, args.model, resolve_device(args.device))
    if "translate" not in ck.family.capabilities:
        raise InputError(f"{ck.path}: a {ck.family.type} model does not translate")
    tok = ck.pair_tokenizers or PairTokenizers.from_tokenizers(ck.tokenizer)
    early = {"true": True, "false": False, "never": "never"}[args.early_stopping]
    out = translate(
        ck.model,
        tok,
        texts,
        num_beams=args.beam,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        length_penalty=args.length_penalty,
        early_stopping=early,
        batch_size=args.batch_size,
        compile=args.compile,
    )
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


# ``attnlm generate``: the model, the prompt, how tokens are picked, how the decode runs
GENERATE_OPTIONS = (
    partial(add_model_spec_argument, checkpoint_synonym=True),
    partial(add_prompt_argument, default="\n", what="a newline"),
    add_sampling_arguments,
    partial(add_num_samples_argument, default=1),
    add_stop_argument,
    flag("--stream", "print tokens as they arrive"),
    option("--no-cache", dest="use_cache", action="store_false", help="recompute every step"),
    flag("--compile", "compile with torch.compile: the one-token decode step, once (fullgraph; "
         "CUDA graphs on a GPU): faster steps on a GPU after a warm-up of seconds to a minute "
         "(on the CPU the default C step is faster)"),
    add_lookahead_argument,
    add_draft_argument,
    flag("--json", "print one JSON object: after the text, on the last line, with the texts, "
         "prompt_tokens, new_tokens, prefill_seconds, decode_seconds, "
         "decode_tokens_per_second, peak_rss_mb, threads, backend and backend_reason"),
    add_runtime_arguments,
    add_weights_argument,
    defaults(func=_generate),
)  # fmt: skip

# ``attnlm translate``: the sentences, the model, the search and how it runs
TRANSLATE_OPTIONS = (
    option("text", nargs="*", type=text_value,
           help="sentences to translate (default: stdin lines)"),
    partial(add_model_spec_argument, checkpoint_synonym=True),
    add_pairs_argument,
    option("--beam", type=arg(positive_int), default=1, metavar="K", help="beam size (1: no beam)"),
    option("--length-penalty", type=arg(finite_float), default=1.0),
    option("--early-stopping", choices=["true", "false", "never"], default="false",
           help="beam search stopping rule, as transformers' early_stopping"),
    partial(add_sampling_arguments, temperature=0.0, max_new_tokens=None,
            max_new_tokens_help="2 x source + 10"),
    option("--batch-size", type=arg(positive_int), default=64),
    flag("--compile", "compile with torch.compile: the one-token decoder step (fullgraph; CUDA "
         "graphs on a GPU), once per batch size and length bucket: faster steps after a warm-up "
         "of seconds to a minute; greedy and sampling (beams stay uncompiled)"),
    add_runtime_arguments,
    defaults(func=_translate, reads_stdin=True),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="sample text from a model (KV cache, streaming)")
    add_options(p, *GENERATE_OPTIONS)
    t = sub.add_parser(
        "translate",
        help="translate sentences with a translation checkpoint (greedy, sampling, beam)",
        description="Translate the TEXT arguments, or one sentence per line of stdin (or the "
        "sources of --pairs FILE); prints one translation per line.",
    )
    add_options(t, *TRANSLATE_OPTIONS)
