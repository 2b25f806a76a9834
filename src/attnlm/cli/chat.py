"""``attnlm chat``: talk to an instruction-tuned model through its chat template.

Interactive (no ``--message``/``--messages``): one user turn per line of input, the reply
streamed as it is decoded, the conversation kept in the KV cache; ``/reset`` forgets it,
``/system TEXT`` sets the system message, Ctrl-D ends. Scripted: the conversation from
``--message`` (repeatable: user, assistant, user, ...) or ``--messages FILE.json``; the reply
alone on stdout, or ``--json`` with its tokens and timings.
"""

from __future__ import annotations

import argparse
import sys

from attnlm.base.validate import existing_path
from attnlm.cli.common import (
    add_command,
    add_draft_argument,
    add_lookahead_argument,
    add_model_spec_argument,
    add_runtime_arguments,
    add_sampling_arguments,
    add_stop_argument,
    add_weights_argument,
    draft_from_args,
    sampling_config,
    text_file,
    text_value,
    use_threads,
)

HELP_LINE = "/reset: forget the conversation  /system TEXT: set the system message  Ctrl-D: end"


def tokenizer_specials(tok) -> dict[str, str]:
    """The special token strings a chat template sees (``bos_token``, ``eos_token``,
    ``unk_token``, ``pad_token``) read from a tokenizer's vocabulary, where it has them."""
    vocab = getattr(tok, "tokens", None)
    out = {}
    for key in ("bos", "eos", "unk", "pad"):
        i = getattr(tok, f"{key}_id", None)
        if isinstance(i, int) and vocab is not None and 0 <= i < len(vocab):
            out[f"{key}_token"] = str(vocab[i])
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "chat", _chat)
    add_model_spec_argument(p)
    p.add_argument(
        "--message",
        action="append",
        default=[],
        type=text_value,
        metavar="TEXT",
        help="a turn (repeatable: user, assistant, user, ...; the last is the user's); "
        "prints the reply and exits",
    )
    p.add_argument(
        "--messages",
        default=None,
        metavar="FILE.json",
        type=text_file(),
        help='the conversation as a JSON list of {"role": ..., "content": ...}',
    )
    p.add_argument("--system", default=None, type=text_value, help="the system message")
    p.add_argument(
        "--template",
        default=None,
        metavar="FILE",
        type=text_file(existing_path),
        help="a Jinja chat template to use instead of the model's",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: the reply with its tokens, new_tokens, prefill_seconds, "
        "decode_tokens_per_second, peak_rss_mb, backend and backend_reason (scripted); the "
        "totals on the last line after an interactive session",
    )
    # greedy by default: a scripted question gets one reproducible answer
    add_sampling_arguments(
        p, temperature=0.0, max_new_tokens=256, max_new_tokens_help="256, per reply"
    )
    add_stop_argument(p)
    add_lookahead_argument(p)
    add_draft_argument(p)
    p.add_argument(
        "--no-cache", dest="use_cache", action="store_false", help="recompute every step"
    )
    add_runtime_arguments(p)
    add_weights_argument(p)
    # interactive turns are read from stdin line by line; a bad line is refused and the
    # conversation goes on (not a document read at once: no reads_stdin)


def scripted_messages(args: argparse.Namespace) -> list[dict[str, str]] | None:
    """The conversation ``--message``/``--messages`` give (None: interactive), checked: it
    ends with a user turn."""

    from attnlm.base.errors import InputError
    from attnlm.base.fileio import read_file_text
    from attnlm.tokenizers.chat_template import check_messages

    if args.message and args.messages:
        raise InputError("give --message TEXT or --messages FILE.json, not both")
    if args.message:
        roles = ["user", "assistant"]
        msgs = [{"role": roles[i % 2], "content": m} for i, m in enumerate(args.message)]
        if len(msgs) % 2 == 0:
            raise InputError(
                f"--message alternates user and assistant turns and ends with the user's: "
                f"{len(msgs)} given, give an odd number"
            )
    elif args.messages:
        raw = read_file_text(args.messages, "messages file", InputError)
        from attnlm.base.foreign import parse_json

        data = parse_json(raw, str(args.messages), "messages JSON")
        msgs = check_messages(data, str(args.messages))
        if not msgs or msgs[-1]["role"] != "user":
            raise InputError(f"{args.messages}: the last message must be the user's")
    else:
        return None
    if args.system is not None:
        if any(m["role"] == "system" for m in msgs):
            raise InputError("--system and a system message in --messages: give one of them")
        msgs.insert(0, {"role": "system", "content": args.system})
    return msgs


def _chat(args: argparse.Namespace) -> int:
    """chat with an instruction-tuned model (its chat template, KV cache across turns)

    Chat with a model through its chat template (GGUF tokenizer.chat_template,
    tokenizer_config.json's chat_template or chat_template.jinja, or --template FILE). Without
    --message/--messages: interactive, one user turn per line; /reset: forget the conversation,
    /system TEXT: set the system message, Ctrl-D: end."""

    from attnlm.base.errors import InputError
    from attnlm.loading.sources import resolve
    from attnlm.tokenizers.chat_template import from_file

    msgs = scripted_messages(args)  # fail early, before loading the model
    sampling = sampling_config(args)
    # the resolver's planner may pick the C engine (a local GGUF file of an architecture it
    # runs: the C step without PyTorch)
    model, tok, info = resolve(args.model, args.device, args.weights, engine_ok=args.use_cache,
                               threads=args.threads)  # fmt: skip
    if info.details.get("backend") == "c-engine":
        from attnlm.generate.engine_chat import EngineChatSession as Session
    else:
        from attnlm.generate.chat import ChatSession as Session

        use_threads(args)
        if "generate" not in info.family.capabilities:
            raise InputError(f"{args.model}: a {info.family.type} model does not generate text")
    template, stops = info.chat_template, info.stop_ids
    if args.template is not None:
        # a model without a template of its own (Gemma 3 270M, a base model): the special
        # token strings come from its tokenizer, so that {{ bos_token }} renders the BOS
        special = template.special_tokens if template is not None else tokenizer_specials(tok)
        template = from_file(args.template, special)
    if template is None:
        raise InputError(
            f"{args.model}: the model has no chat template (not a chat model?); "
            "give one with --template FILE"
        )
    session = Session(model, tok, template, stops, sampling=sampling, use_cache=args.use_cache,
                      lookahead=args.lookahead,
                      draft=draft_from_args(args, model, sampling))  # fmt: skip
    if msgs is not None:
        return _scripted(session, msgs, args.json)
    return _interactive(session, args.system, args.json)


def _scripted(session, msgs: list[dict[str, str]], as_json: bool) -> int:
    import json

    session.messages = msgs
    session.prompt_ids()  # a template that refuses the conversation fails before decoding
    reply = session.reply(None)
    if as_json:
        print(json.dumps(reply.to_json(), ensure_ascii=False))
    else:
        sys.stdout.write(reply.text + "\n")
    return 0


def _read_turn(stream) -> str | None:
    """The next line of input as text (None at the end); a line that is not valid text raises a
    one-line InputError naming stdin."""
    from attnlm.base.textio import decode_text

    raw = stream.readline()
    if not raw:
        return None
    if isinstance(raw, str):  # a text stream (tests, embedding)
        raw = raw.encode("utf-8", "surrogateescape")
    return decode_text(raw, "stdin", empty_ok=True, name_line=False).rstrip("\r\n")


def _interactive(session, system: str | None, as_json: bool = False) -> int:
    import json

    from attnlm.base.errors import InputError
    from attnlm.generate.stats import DecodeStats

    totals = DecodeStats()

    session.reset(system)
    out, err = sys.stdout, sys.stderr
    tty = sys.stdin.isatty()
    stream = getattr(sys.stdin, "buffer", sys.stdin)
    if tty:
        err.write(HELP_LINE + "\n")
    while True:
        if tty:
            err.write("> ")
            err.flush()
        try:
            line = _read_turn(stream)
        except InputError as e:
            err.write("attnlm: error: " + " ".join(str(e).split()) + "\n")
            continue
        if line is None:  # Ctrl-D (end of input)
            if tty:
                err.write("\n")
            if as_json:
                out.write(json.dumps({"turns": totals.rows, **totals.to_json()}) + "\n")
            return 0
        if not line.strip():
            continue
        if line.strip() == "/reset":
            session.reset(system)
            err.write("(conversation reset)\n")
            continue
        if line.startswith("/system"):
            system = line[len("/system") :].strip() or None
            session.set_system(system or "")
            err.write(f"(system message {'set' if system else 'removed'})\n")
            continue

        thinking: list[str] = []  # a harmony model's reasoning (gpt-oss): stderr, its own line

        def stream_piece(piece: str, thinking: list[str] = thinking) -> None:
            if thinking and thinking[-1] != "\n":
                err.write("\n")
                err.flush()
                thinking.append("\n")
            out.write(piece)
            out.flush()

        def stream_reasoning(piece: str, thinking: list[str] = thinking) -> None:
            err.write(("" if thinking else "(reasoning) ") + piece)
            err.flush()
            thinking.append(piece)

        try:
            reply = session.reply(line, on_text=stream_piece, on_reasoning=stream_reasoning)
        except InputError as e:  # a template that refuses this turn, a full window
            out.write("\n")
            err.write("attnlm: error: " + " ".join(str(e).split()) + "\n")
            continue
        out.write("\n")
        out.flush()
        totals.prompt_tokens += reply.prefilled
        totals.new_tokens += len(reply.ids)
        totals.rows += 1
        totals.prefill_seconds += reply.prefill_s
        totals.decode_seconds += reply.decode_s
