"""``attnlm serve``: the offline attention explorer in the browser; with ``--api`` an
OpenAI-compatible HTTP API of one model (:mod:`attnlm.api`)."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from attnlm.base.validate import (
    existing_file,
    int_in_range,
    name_or_path,
    non_empty,
    positive_float,
    positive_int,
)
from attnlm.cli.common import (
    add_command,
    add_runtime_arguments,
    add_weights_argument,
    arg,
    flag,
    option,
    text_file,
    use_threads,
)

# the models (either spelling, repeatable), where the page is served, the machine
OPTIONS = (
    option("--model", action="append", default=[], metavar="SPEC", type=arg(name_or_path),
           help="run or checkpoint folder, Hugging Face folder, .gguf file, registered name "
           "(attnlm models --available), Hub id org/name, or org/name:QUANT for a GGUF file of "
           "a Hub repository (repeatable: choose one in the page)"),
    option("--checkpoint", action="append", default=[], metavar="SPEC", type=arg(name_or_path),
           help="the same as --model"),
    option("--port", type=arg(int_in_range, lo=0, hi=65535), default=8000,
           help="TCP port (0 picks a free one)"),
    option("--host", default="127.0.0.1", type=arg(non_empty),
           help="address to bind (default 127.0.0.1; the page has no authentication)"),
    option("--vectors", metavar="F", type=text_file(existing_file), default=None,
           help="a word2vec vectors file (attnlm word2vec train): the embeddings panel shows the "
           "word's one static vector beside the contextual ones"),
    partial(add_runtime_arguments, device="cpu"),
    add_weights_argument,
    option("--max-chars", type=arg(positive_int), default=None,
           help="at most this many characters: the longest text accepted"),
    flag("--compile", "compile with torch.compile: generate and translate through the compiled "
         "decode step (CUDA graphs on a GPU): the first request of each shape waits for a "
         "compile, later ones reuse it for as long as the server runs"),
    flag("--api", "serve the OpenAI-compatible API of one --model (/v1/chat/completions, "
         "/v1/completions, /v1/embeddings, /v1/models, /tokenize, /detokenize, /health) instead "
         "of the explorer"),
    option("--api-key", default=None, metavar="KEY", type=arg(non_empty),
           help="--api: every request needs 'Authorization: Bearer KEY' (required when --host "
           "is not a loopback address; also read from ATTNLM_API_KEY)"),
    option("--parallel", type=arg(int_in_range, lo=1, hi=256), default=None, metavar="N",
           help="--api: requests decoded at once, one batched step for all (default: 8 under 1B "
           "parameters, 4 under 8B, else 2)"),
    option("--prefill-chunk", type=arg(positive_int), default=256, metavar="N",
           help="--api: prompt tokens fed per step while other requests decode"),
    option("--slot-context", type=arg(positive_int), default=4096, metavar="N",
           help="--api: positions one slot holds, prompt and reply (at most the model's window; "
           "a GGUF model on the C engine sets its cache aside for all of them)"),
    option("--max-queue", type=arg(positive_int), default=64, metavar="N",
           help="--api: requests waiting for a slot before new ones get 429"),
    option("--max-tokens-limit", type=arg(positive_int), default=4096, metavar="N",
           help="--api: the largest max_tokens a request may ask for (also the default)"),
    option("--max-prompt-tokens", type=arg(positive_int), default=None, metavar="N",
           help="--api: the longest prompt taken (default: the model's window)"),
    option("--max-n", type=arg(int_in_range, lo=1, hi=128), default=8, metavar="N",
           help="--api: the most choices (n) one request may ask for"),
    option("--max-body-bytes", type=arg(positive_int), default=1 << 20, metavar="B",
           help="--api: the largest request body (413 beyond)"),
    option("--request-timeout", type=arg(positive_float), default=600.0, metavar="S",
           help="--api: seconds a request may take; then it ends (finish_reason length)"),
    option("--served-name", default=None, metavar="NAME", type=arg(non_empty),
           help="--api: the model's id in /v1/models and requests (default: its name)"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "serve", _serve, *OPTIONS)


def _serve(args: argparse.Namespace) -> int:
    """attention explorer in the browser (local server, works offline)"""
    import logging

    from attnlm.base.errors import InputError
    from attnlm.web.server import LOOPBACK_HOSTS, make_server
    from attnlm.web.service import DEFAULT_MAX_CHARS, load_service, resolve_named_model

    if not args.checkpoint and not args.model:
        raise InputError("nothing to serve: give --model SPEC (repeatable)")
    if not args.host.strip():  # "" would bind every interface, unlike what it looks like
        raise InputError("--host is empty: give an address (127.0.0.1, or 0.0.0.0 for all)")
    if args.api:
        return _serve_api(args)
    max_chars = args.max_chars if args.max_chars is not None else DEFAULT_MAX_CHARS
    use_threads(args)
    static = None
    if args.vectors:  # the static half of the embeddings panel, read before any model
        from attnlm.word2vec.vectors import WordVectors

        static = WordVectors.load(args.vectors)
    load = dict(device=args.device, max_chars=max_chars, weights=args.weights)
    services = [load_service(d, **load) for d in args.checkpoint]
    services += [resolve_named_model(n, **load) for n in args.model]
    for s in services:
        s.static_vectors = static
        s.compile = args.compile
    names: dict[str, int] = {}
    for s in services:  # two runs with the same folder name: number them
        if s.name in names:
            names[s.name] += 1
            s.name = f"{s.name}-{names[s.name]}"
        else:
            names[s.name] = 1
    try:
        server = make_server(services, args.host, args.port)
    except OSError as e:
        raise InputError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not (args.host in LOOPBACK_HOSTS or args.host.startswith("127.")):
        print(
            f"attnlm: warning: listening on {args.host}: the page has no authentication; "
            "anyone who can reach this address can use the models",
            file=sys.stderr,
        )
    print(f"attention explorer at {server.url} (models: {', '.join(s.name for s in services)})")
    print("press Ctrl+C to stop", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _serve_api(args: argparse.Namespace) -> int:
    import logging
    import os

    from attnlm.base.errors import InputError
    from attnlm.web.server import LOOPBACK_HOSTS

    specs = args.checkpoint + args.model
    if len(specs) != 1:
        raise InputError("--api serves one model: give exactly one --model SPEC")
    key = args.api_key or os.environ.get("ATTNLM_API_KEY") or None
    loopback = args.host in LOOPBACK_HOSTS or args.host.startswith("127.")
    if not loopback and key is None:
        raise InputError(f"--host {args.host} is reachable from other machines: give --api-key KEY "
                         "(or ATTNLM_API_KEY), or serve on 127.0.0.1")  # fmt: skip
    use_threads(args)
    from attnlm.api.app import make_app
    from attnlm.api.run import bind, serve_forever, url_of
    from attnlm.api.served import Limits, Served

    limits = Limits(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                    max_tokens=args.max_tokens_limit, max_n=args.max_n,
                    max_queue=args.max_queue, request_seconds=args.request_timeout,
                    slot_context=args.slot_context)  # fmt: skip
    served = Served(specs[0], device=args.device, weights=args.weights, parallel=args.parallel,
                    prefill_chunk=args.prefill_chunk, limits=limits, name=args.served_name,
                    threads=args.threads)  # fmt: skip
    try:
        sock = bind(args.host.strip("[]"), args.port)
    except OSError as e:
        served.close()
        raise InputError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    slots = ""
    if served.scheduler is not None:
        slots = f", {served.parallel} slots on {served.backend}"
    print(f"OpenAI-compatible API at {url_of(sock)}/v1 (model: {served.id}{slots})")
    print("press Ctrl+C to stop", flush=True)
    try:
        serve_forever(make_app(served, key), sock)
    finally:
        served.close()
        sock.close()
    return 0
