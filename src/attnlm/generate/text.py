"""Text in, text out: prompts, stop strings and streaming on top of :func:`decode`.

Streaming decodes each row's ids incrementally, each token once (:class:`_RowText`): a token
may end in the middle of a UTF-8 character (byte-level BPE), so its bytes go through an
incremental UTF-8 decoder that releases a character when its last byte arrives; text that could
be the start of a stop string is held back, so a stop string is never printed. The streamed
pieces join to exactly the text a one-shot decode gives (tested).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Any

from attnlm.base.errors import AttnlmError, InputError
from attnlm.generate.options import DecodeOptions
from attnlm.generate.sampling import SamplingConfig, check_sampling, mask_from, token_limit
from attnlm.generate.stats import DecodeStats, Timer
from attnlm.runtime.engine import Engine
from attnlm.tokenizers.base import special_encoder

TextCallback = Callable[[int, str], None]  # on_text(row, new_text)


def encode_prompt(tokenizer: Any, prompt: str, *, specials: bool = False) -> list[int]:
    """Encode a prompt, turning tokenizer failures (unknown characters) into InputError.
    ``specials``: with the special tokens the tokenizer adds to a plain text (BOS where its
    files ask for one, as Gemma's do: :func:`~attnlm.tokenizers.base.special_encoder`); a
    rendered chat template writes its own."""
    try:
        ids = special_encoder(tokenizer)(prompt) if specials else list(tokenizer.encode(prompt))
    except AttnlmError as e:
        raise InputError(f"cannot encode the prompt: {e}") from None
    except (KeyError, ValueError) as e:
        bad = sorted({c for c in prompt if not _encodable(tokenizer, c)})
        shown = ", ".join(repr(c) for c in bad[:10]) or str(e)
        msg = f"the prompt contains characters the tokenizer cannot encode: {shown}"
        raise InputError(msg) from None
    if not ids:
        raise InputError("the prompt is empty after tokenization; give at least one character")
    return ids


def _encodable(tokenizer: Any, ch: str) -> bool:
    try:
        tokenizer.encode(ch)
        return True
    except Exception:
        return False


class _RowText:
    """Incremental text of one row: new ids in, printable text out, stop strings detected.

    Each token is decoded once: a byte-level tokenizer (``decode_bytes``) feeds its bytes to an
    incremental UTF-8 decoder (a character split across tokens appears when its last byte
    arrives; invalid bytes become U+FFFD exactly as in a one-shot decode); a character
    tokenizer decodes each id alone. Other tokenizers (word-level joins depend on neighbours)
    decode the row again for each token, after the last few ``context`` ids (the prompt's
    end), so that the text reads on from the prompt: the space a word tokenizer puts between
    the prompt and the first new word, WordPiece's ``##`` pieces joining the prompt's last
    word. Text not yet printed (``tail``) keeps the last ``len(longest stop) - 1`` characters,
    so a stop string is found in the tail alone and never printed.
    """

    CONTEXT = 4  # prompt ids decoded before the new ones (a join looks at most 2 tokens back)

    def __init__(self, tokenizer: Any, stop: Sequence[str], context: Sequence[int] = ()) -> None:
        self.tok = tokenizer
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.final: str | None = None  # set when a stop string ends the row
        self.printed: list[str] = []  # pieces already returned
        self.tail = ""  # decoded, not yet returned
        if hasattr(tokenizer, "decode_bytes"):
            self.mode = "bytes"
            self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        elif getattr(tokenizer, "kind", None) == "char":
            self.mode = "char"
        else:
            self.mode = "full"
        self.context = list(context)[-self.CONTEXT :] if self.mode == "full" else []
        self.head = tokenizer.decode(self.context) if self.context else ""
        self.n_printed = 0

    def _decoded(self) -> str:
        """The row's new ids decoded as they read after the prompt (``full`` mode)."""
        if self.context:
            joined = self.tok.decode(self.context + self.ids)
            if joined.startswith(self.head):
                return joined[len(self.head) :]
        return self.tok.decode(self.ids)

    def text(self) -> str:
        """The row's text so far (all of it once :meth:`flush` was called)."""
        if self.final is not None:
            return self.final
        if self.mode == "full":
            return self._decoded()
        return "".join(self.printed) + self.tail

    def push(self, token: int) -> tuple[str, bool]:
        """Add a token; return (text safe to print now, whether a stop string appeared)."""
        self.ids.append(token)
        if self.mode == "bytes":
            self.tail += self.utf8.decode(self.tok.decode_bytes([token]))
        elif self.mode == "char":
            self.tail += self.tok.decode([token])
        else:
            self.tail = self._decoded()[self.n_printed :]
        for s in self.stop:
            i = self.tail.find(s)
            if i >= 0:
                self.final = "".join(self.printed) + self.tail[:i]
                piece, self.tail = self.tail[:i], ""
                return piece, True
        safe = len(self.tail) - self.hold
        if self.mode == "full":  # a character cut between tokens decodes as U+FFFD for now
            while safe > 0 and self.tail[safe - 1] == "\ufffd":
                safe -= 1
        if safe <= 0:
            return "", False
        piece, self.tail = self.tail[:safe], self.tail[safe:]
        self.printed.append(piece)
        self.n_printed += len(piece)
        return piece, False

    def flush(self) -> str:
        """The rest of the text (the end of the row); nothing after a stop string."""
        if self.final is not None:
            return ""
        if self.mode == "bytes":
            self.tail += self.utf8.decode(b"", final=True)
        elif self.mode == "full":
            self.tail = self._decoded()[self.n_printed :]
        piece, self.tail = self.tail, ""
        self.printed.append(piece)
        self.n_printed += len(piece)
        return piece


def generate_text(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    sampling: SamplingConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    on_text: TextCallback | None = None,
    stats: DecodeStats | None = None,
    stop_ids: Sequence[int] = (),
) -> list[str]:
    """Continue each prompt; return the generated text of each (without the prompt).

    ``sampling`` says how tokens are picked, how many, with which seed and which ``stop``
    strings end a row (not included); ``options`` how the decode runs
    (:class:`~attnlm.generate.plan.DecodeOptions`); ``on_text(row, piece)`` receives text as
    it is generated (streaming). ``stats``: a :class:`~attnlm.generate.stats.DecodeStats` the
    decode's prefill and decode times, token counts and backend are added to. ``model``: a
    PyTorch model, or an :class:`~attnlm.runtime.engine.Engine` (decoded by
    :mod:`attnlm.generate.engine_decode`, which needs no PyTorch). ``stop_ids``: tokens that
    end a row (end of text, end of turn; not part of the text).
    """
    sampling = check_sampling(sampling)
    options = options or DecodeOptions()
    ids = [encode_prompt(tokenizer, p, specials=True) for p in prompts]
    rows = [_RowText(tokenizer, sampling.stop, context=row) for row in ids]
    timer = Timer(stats, sum(len(row) for row in ids), len(ids))

    ends = frozenset(stop_ids)

    def on_token(r: int, token: int) -> bool:
        timer.token()
        if token in ends:  # the row ends here; the token is not text
            return True
        piece, stopped = rows[r].push(token)
        if on_text and piece:
            on_text(r, piece)
        return stopped

    timer.start()
    new = _decode(model, tokenizer, ids, sampling, options, on_token, stats)
    timer.stop(sum(len(row) for row in new))
    for r, row in enumerate(rows):
        rest = row.flush()
        if on_text and rest:
            on_text(r, rest)
    return [row.text() for row in rows]


def _decode(model, tokenizer, ids, sampling, options, on_token, stats) -> list[list[int]]:
    """The new ids of each prompt, decoded on the engine or through :func:`decode` (the
    backend chosen once and noted in ``stats``); ids past the tokenizer's are never picked."""
    limit = token_limit(model, tokenizer)
    if isinstance(model, Engine):
        from attnlm.generate import engine_decode

        if options.draft is not None:
            raise InputError("a draft model speeds up float32 weights, not the 8- or 4-bit engine")
        _note_backend(stats, model)
        return engine_decode.decode(model, ids, sampling, on_token=on_token,
                                    lookahead=options.lookahead, vocab_limit=limit)  # fmt: skip
    from attnlm.generate.loop import decode
    from attnlm.runtime.planner import runner_for

    if options.runner is None:  # the backend, chosen once
        options = options.with_(runner=runner_for(model, compile=options.compile))
    _note_backend(stats, options.runner)
    process = None if limit is None else (lambda logits, _pos, _total: mask_from(logits, limit))
    return decode(model, ids, sampling, options, on_token=on_token, process=process)


def _note_backend(stats: DecodeStats | None, runner: Any) -> None:
    """Record the backend that decodes (its name and why it was chosen) in ``stats``."""
    if stats is not None:
        stats.backend, stats.backend_reason = runner.name, runner.reason
