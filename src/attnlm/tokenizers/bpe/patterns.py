"""Byte-level BPE pre-tokenization: the regex patterns that cut text into chunks (merges never
cross a chunk boundary), as GPT-2 (Radford et al., 2019) and tiktoken's ``cl100k_base`` define
them.

* :data:`PATTERNS`: the built-in ``gpt2`` and ``cl100k`` patterns; :data:`GPT2_PUBLISHED`: GPT-2's
  regex as published.
* :func:`resolve_pattern`: a built-in name or a custom regex, validated (no capturing groups,
  never matching the empty string).
* :func:`split_pattern`: the regex both engines split with; a custom pattern is extended so that
  a character it does not cover becomes a chunk of its own (``decode(encode(text)) == text``).
* :func:`count_chunks`: the chunk counts of a training text, with a fast path for ``gpt2``.
* Before splitting: lone surrogates become U+FFFD (:func:`_fix_surrogates`, as tiktoken) and
  special tokens are cut out (:func:`_special_regex`, longest first).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import regex

from attnlm.tokenizers.base import TokenizerConfigError
from attnlm.tokenizers.split import Splitter

#: GPT-2's pre-tokenization regex as published (Radford et al., 2019, ``encoder.py``).
GPT2_PUBLISHED = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: Built-in pre-tokenization patterns. ``gpt2`` is GPT-2's regex with the letter alternative
#: moved first, which splits identically (the alternatives that can match at a position never
#: overlap, except the contractions, which stay before punctuation) and runs faster in
#: Python's ``regex`` (letters, the most common match, are tried first); ``cl100k`` is
#: cl100k_base's (GPT-3.5/4) exactly.
PATTERNS: dict[str, str] = {
    "gpt2": r""" ?\p{L}+|'(?:[stmd]|re|ve|ll)| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "cl100k": (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
        r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    ),
}


def resolve_pattern(pattern: str) -> tuple[str, str]:
    """``(name, regex)`` for a built-in pattern name, or ``("", pattern)`` for a valid regex."""
    if pattern in PATTERNS:
        return pattern, PATTERNS[pattern]
    if not isinstance(pattern, str) or not pattern:
        raise TokenizerConfigError("pattern must be a built-in name (gpt2, cl100k) or a regex")
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", pattern):
        raise TokenizerConfigError(
            f"unknown pattern name {pattern!r} (built-in: {', '.join(PATTERNS)}; "
            "or pass a regular expression)"
        )
    try:
        compiled = regex.compile(pattern)
    except regex.error as e:
        raise TokenizerConfigError(f"invalid pre-tokenization regex {pattern!r}: {e}") from None
    if compiled.groups:
        raise TokenizerConfigError(
            f"pre-tokenization regex {pattern!r} has {compiled.groups} capturing group(s), "
            "which would make findall return the groups instead of the chunks: use "
            "non-capturing groups (?:...)"
        )
    for pos in range(len(_EMPTY_PROBE) + 1):
        m = compiled.match(_EMPTY_PROBE, pos)
        if m is not None and m.end() == pos:
            raise TokenizerConfigError(
                f"pre-tokenization regex {pattern!r} can match the empty string (e.g. at "
                f"{_EMPTY_PROBE[pos : pos + 8]!r}); every chunk must hold at least one character"
            )
    return "", pattern


#: Text on which a custom pattern must not match the empty string anywhere (a mix of letters,
#: digits, punctuation, whitespace and non-ASCII characters).
_EMPTY_PROBE = "Hello, World! it's 123 4.5e6\n\t  héllo 日本語 x_y-z  \r\n©😀\x00"

#: What custom patterns are extended with: a character no alternative of the pattern covers
#: becomes a chunk of its own, so no text is ever lost and both engines see the same chunks.
UNCOVERED = r"[\s\S]"


def split_pattern(pattern: str) -> str:
    r"""The regex that actually splits text for ``pattern`` (a validated regex): built-in
    patterns as they are (they cover every character), a custom one as
    ``(?:PATTERN)|[\s\S]``: where PATTERN matches, its chunk; any character it leaves
    uncovered, a chunk of one character. The Python and tiktoken engines both use this."""
    if pattern in PATTERNS.values() or pattern == GPT2_PUBLISHED:
        return pattern
    return f"(?:{pattern})|{UNCOVERED}"


# `re`'s \s also matches U+001C..U+001F, `regex`'s (Unicode White_Space) does not: exclude them
_WS, _NON_WS = r"[^\S\x1c-\x1f]", r"[\S\x1c-\x1f]"
_WS_THEN_NON_WS = re.compile(rf"{_WS}*{_NON_WS}+|{_WS}+")


def count_chunks(text: str, pattern: str) -> Counter[str]:
    r"""``Counter(regex.findall(pattern, text))``, computed faster for the built-in patterns
    (see :mod:`attnlm.tokenizers.split`; for ``gpt2`` also the piece counting below).

    No ``gpt2`` chunk crosses a point where a non-space character is followed by a space
    (letter, digit and punctuation runs stop at whitespace; whitespace chunks hold only
    whitespace and look ahead only within their run). So the text is cut there into pieces
    ``\s*\S+`` with the fast ``re`` module, each distinct piece is split once, and its chunks
    are counted as often as the piece occurs. Pieces that occur equally often are joined and
    split in one call (joined pieces still meet at such a point).
    """
    if pattern not in (PATTERNS["gpt2"], GPT2_PUBLISHED):
        return Counter(Splitter(pattern)(text))
    compiled = regex.compile(pattern)
    pieces = _WS_THEN_NON_WS.findall(text)
    out: Counter[str] = Counter()
    if not pieces:
        return out
    piece_counts = Counter(pieces)
    # the first piece may start with a non-space and the last may be only spaces: alone
    alone = {pieces[0], pieces[-1]}
    by_count: dict[int, list[str]] = {}
    for piece, n in piece_counts.items():
        if piece not in alone:
            by_count.setdefault(n, []).append(piece)
    for piece in alone:
        n = piece_counts[piece]
        for chunk in compiled.findall(piece):
            out[chunk] += n
    for n, group in by_count.items():
        found = Counter(compiled.findall("".join(group)))
        if n == 1:
            out.update(found)
        else:
            for chunk, k in found.items():
                out[chunk] += k * n
    return out


def _fix_surrogates(text: str) -> str:
    """Replace lone surrogates by U+FFFD (what tiktoken does before encoding)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _special_regex(tokens: Iterable[str]) -> re.Pattern[str]:
    alts = sorted(tokens, key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(t) for t in alts))
