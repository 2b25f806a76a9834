"""``attnlm tokenize ...`` subcommands: train, encode, decode, show, info."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.validate import (
    non_empty,
    non_negative_int,
    output_file,
    positive_int,
    read_stdin_text,
)
from attnlm.cli.common import (
    add_command,
    add_command_group,
    add_text_argument,
    arg,
    as_given,
    defaults,
    flag,
    option,
    text_file,
    text_value,
)

KINDS = ("char", "word", "bpe", "classic-bpe", "wordpiece")
_COLOURS = ("\x1b[30;48;5;153m", "\x1b[30;48;5;223m")
_RESET = "\x1b[0m"


# ``attnlm tokenize train``: the kind, its settings, the text and where it is saved
TRAIN_OPTIONS = (
    option("--kind", choices=KINDS, required=True, help="tokenizer kind"),
    option("--vocab-size", type=arg(positive_int), default=None,
           help="vocabulary size (bpe: 256 bytes + merges; classic-bpe: all symbols; word: "
           "maximum size; wordpiece: specials + characters + merges; char: not used)"),
    flag("--cased", "wordpiece: keep case and accents (default: lower-case and strip accents, "
         "as BERT uncased)"),
    option("--vocab-out", metavar="PATH", default=None, type=arg(output_file),
           help="wordpiece: also write a BERT vocab.txt"),
    option("--pattern", default="gpt2", type=arg(non_empty),
           help="pre-tokenization pattern: gpt2, cl100k or a regex (bpe; default: gpt2)"),
    option("--min-freq", type=arg(positive_int), default=None,
           help="word: minimum count (default 1); wordpiece: minimum pair count to merge"),
    flag("--unk", "char tokenizer: add <unk> for characters the text lacks"),
    option("--special", action="append", default=[], metavar="TOKEN", type=arg(non_empty),
           help="bpe: add a special token (repeatable), ids after the merges"),
    add_text_argument,
    option("--out", required=True, type=arg(output_file), metavar="PATH",
           help="output JSON file"),
    option("--tiktoken-out", type=arg(output_file), metavar="PATH", default=None,
           help="bpe: also write a .tiktoken file"),
)  # fmt: skip

# the tokenizer every other ``attnlm tokenize`` action reads
TOKENIZER_OPTIONS = (
    option("--tokenizer", required=True, metavar="PATH", type=text_file(as_given),
           help="the tokenizer: a tokenizer JSON file, a .tiktoken rank file with --pattern, a "
           "BERT vocab.txt / tokenizer.json / folder holding them, or a pretrained model name "
           "(minilm)"),
    option("--pattern", default=None, type=arg(non_empty),
           help="pre-tokenization pattern: gpt2, cl100k or a regex (for a .tiktoken file)"),
    option("--engine", choices=("auto", "python", "tiktoken"), default="auto",
           help="bpe encoding engine (default: auto)"),
)  # fmt: skip

SHOW_OPTIONS = (
    *TOKENIZER_OPTIONS,
    option("input", nargs="?", default=None, type=text_value, help="text to show (else --text)"),
    add_text_argument,
    option("--color", choices=("auto", "always", "never"), default="auto",
           help="alternate background colours (auto: when stdout is a terminal), else brackets"),
    option("--max-chars", type=arg(non_negative_int), default=2000,
           help="at most this many characters: shown (0: all)"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    tsub = add_command_group(sub, "tokenize", "train tokenizers, encode and inspect text")
    add_command(tsub, "train", _train, *TRAIN_OPTIONS)
    add_command(
        tsub, "encode", _encode, *TOKENIZER_OPTIONS,
        option("input", nargs="?", default=None, type=text_value,
               help="text to encode (default: stdin)"),
        flag("--allow-special", "bpe: encode special tokens in the text"),
        defaults(reads_stdin=True),
    )  # fmt: skip
    add_command(
        tsub, "decode", _decode, *TOKENIZER_OPTIONS,
        option("ids", nargs="*", type=arg(non_negative_int),
               help="token ids (default: read from stdin)"),
        defaults(reads_stdin=True),
    )  # fmt: skip
    add_command(tsub, "show", _show, *SHOW_OPTIONS)
    add_command(tsub, "info", _info, *TOKENIZER_OPTIONS)


def _load_tokenizer(args: argparse.Namespace):
    from attnlm.tokenizers import BPETokenizer, load

    path = Path(args.tokenizer)
    if not path.exists():
        from attnlm.data.pretrained import PRETRAINED, pretrained_path

        if args.tokenizer in PRETRAINED:  # a pretrained model's tokenizer, by name
            path = pretrained_path(args.tokenizer)
    if path.suffix == ".tiktoken":
        if not args.pattern:
            raise InputError(f"{path}: a .tiktoken file needs --pattern (gpt2, cl100k or a regex)")
        tok = BPETokenizer.from_tiktoken(path, args.pattern)
    else:
        tok = load(path)
    if isinstance(tok, BPETokenizer):
        tok.engine = args.engine
    return tok


def _train(args: argparse.Namespace) -> int:
    """train a tokenizer on a text and save it as JSON"""
    from attnlm.data.corpus import load_text
    from attnlm.tokenizers import TokenizerConfigError
    from attnlm.tokenizers.factory import SIZED_KINDS

    kind = args.kind
    if kind in SIZED_KINDS and args.vocab_size is None:
        raise TokenizerConfigError(f"--kind {kind} needs --vocab-size")
    if args.special and kind != "bpe":
        raise TokenizerConfigError("--special is only for --kind bpe")
    if args.tiktoken_out and kind != "bpe":
        raise TokenizerConfigError("--tiktoken-out is only for --kind bpe")
    if (args.cased or args.vocab_out) and kind != "wordpiece":
        raise TokenizerConfigError("--cased and --vocab-out are only for --kind wordpiece")
    text = load_text(args.text)
    return _train_and_save(args, kind, text)


def _train_and_save(args: argparse.Namespace, kind: str, text: str) -> int:
    from attnlm.tokenizers import train_tokenizer

    tok = train_tokenizer(
        kind,
        text,
        args.vocab_size,
        unk=args.unk,
        min_freq=args.min_freq,
        pattern=args.pattern,
        special_tokens=args.special or None,
        lowercase=not args.cased,
    )
    if args.vocab_out:
        tok.save_vocab(args.vocab_out)
    tok.save(args.out)
    if args.tiktoken_out:
        tok.save_tiktoken(args.tiktoken_out)
    print(f"{kind} tokenizer, vocab size {tok.vocab_size}, saved to {args.out}")
    return 0


def _read_input(value: str | None) -> str:
    if value is None or value == "-":
        return read_stdin_text()  # non-UTF-8 bytes: one-line InputError, never U+FFFD
    return value


def _encode(args: argparse.Namespace) -> int:
    """print the token ids of a text"""
    from attnlm.tokenizers import BPETokenizer

    tok = _load_tokenizer(args)
    text = _read_input(args.input)
    if isinstance(tok, BPETokenizer) and args.allow_special:
        ids = tok.encode(text, allowed_special="all")
    else:
        ids = tok.encode(text)
    print(" ".join(map(str, ids)))
    return 0


def _decode(args: argparse.Namespace) -> int:
    """print the text of token ids"""
    tok = _load_tokenizer(args)
    ids = args.ids or [_token_id(x) for x in read_stdin_text().split()]
    sys.stdout.write(tok.decode(ids) + "\n")
    return 0


def _token_id(text: str) -> int:
    """A token id read from stdin, by the same rule as the command line's ids."""
    try:
        return non_negative_int(text)
    except ConfigError:
        raise InputError(f"not a token id: {text!r}") from None


def token_pieces(tok, ids: list[int]) -> list[tuple[str, int]]:
    """Split ``ids`` into displayable pieces ``(text, number of tokens)``: one per token, except
    that byte-level tokens ending inside a UTF-8 character are grouped with the next ones."""
    from attnlm.tokenizers import BPETokenizer, ClassicBPETokenizer
    from attnlm.tokenizers.classic_bpe import END

    pieces: list[tuple[str, int]] = []
    if isinstance(tok, BPETokenizer) or hasattr(tok, "token_bytes"):  # byte-level tokens
        buf = b""
        n = 0
        for i in ids:
            buf += tok.token_bytes(i)
            n += 1
            try:
                pieces.append((buf.decode("utf-8"), n))
            except UnicodeDecodeError:
                if n < 4:  # a character spans at most 4 bytes, so at most 4 tokens
                    continue
                pieces.append((buf.decode("utf-8", errors="replace"), n))
            buf, n = b"", 0
        if buf:
            pieces.append((buf.decode("utf-8", errors="replace"), n))
    elif isinstance(tok, ClassicBPETokenizer):
        pieces = [(tok.token_text(i).replace(END, " "), 1) for i in ids]
    else:
        pieces = [(tok.token_text(i), 1) for i in ids]
    return pieces


def _visible(s: str) -> str:
    return s.replace("\t", "→").replace("\n", "↵\n")


def _show(args: argparse.Namespace) -> int:
    """print a text with its token boundaries and tokens per word / bytes per token"""
    from attnlm.data.corpus import load_text
    from attnlm.tokenizers import BPETokenizer

    tok = _load_tokenizer(args)
    text = args.input if args.input is not None else load_text(args.text)
    if args.max_chars > 0:
        text = text[: args.max_chars]
    if isinstance(tok, BPETokenizer):
        ids = tok.encode(text, allowed_special="all")  # show special tokens as one piece
    else:
        ids = tok.encode(text)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    out = []
    for k, (piece, _) in enumerate(token_pieces(tok, ids)):
        if colour:
            out.append(
                _COLOURS[k % 2]
                + _visible(piece).replace("\n", _RESET + "\n" + _COLOURS[k % 2])
                + _RESET
            )
        else:
            out.append("[" + _visible(piece) + "]")
    print("".join(out))
    n_tok = len(ids)
    n_words = len(text.split())
    n_bytes = len(text.encode("utf-8", errors="surrogatepass"))
    print(f"\ntokens: {n_tok:,}  characters: {len(text):,}  bytes: {n_bytes:,}  words: {n_words:,}")
    if n_tok:
        per_word = f"{n_tok / n_words:.2f}" if n_words else "n/a"
        print(
            f"tokens per word: {per_word}  bytes per token: {n_bytes / n_tok:.2f}  "
            f"characters per token: {len(text) / n_tok:.2f}"
        )
    return 0


def _info(args: argparse.Namespace) -> int:
    """kind, vocabulary size and special tokens"""
    tok = _load_tokenizer(args)
    print(f"kind: {tok.kind}\nvocab size: {tok.vocab_size:,}")
    if getattr(tok, "pattern", None):
        print(f"pattern: {tok.pattern_name or tok.pattern}\nengine: {tok.engine}")
    if tok.kind == "wordpiece":
        strip = tok.lowercase if tok.strip_accents is None else tok.strip_accents
        print(
            f"lowercase: {tok.lowercase}  strip accents: {strip}  "
            f"model max length: {tok.model_max_length}"
        )
    specials = tok.special_tokens
    if specials:
        print("special tokens: " + ", ".join(f"{s} = {i}" for s, i in specials.items()))
    return 0
