"""Character-level tokenizer: one id per distinct character of the training text.

Ids are the characters in code-point order (as in nanoGPT's ``shakespeare_char``), so the
default corpus gives the same ids on every machine. With ``unk=True`` one more id,
``len(chars)``, stands for ``<unk>`` and every unseen character maps to it; without it an
unseen character raises :class:`UnknownTokenError` naming the character and its position.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnlm.tokenizers.base import (
    UNK,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerConfigError,
    UnknownTokenError,
    check_text,
    register_kind,
)


def describe_char(ch: str) -> str:
    """``'é' (U+00E9)``: a character and its code point, readable in error messages."""
    return f"{ch!r} (U+{ord(ch):04X})"


@register_kind
class CharTokenizer(Tokenizer):
    """Maps each character to an id; ``unk`` chooses ``<unk>`` over an error for unseen ones.

    JSON fields: ``chars`` (the vocabulary as one string, position = id), ``unk`` (bool).
    """

    kind = "char"

    def __init__(self, chars: Iterable[str], unk: bool = False) -> None:
        chars = list(chars)
        if not chars:
            raise TokenizerConfigError("a character tokenizer needs at least one character")
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise TokenizerConfigError("chars must be single characters")
        if len(set(chars)) != len(chars):
            raise TokenizerConfigError("chars contains duplicates")
        self.chars: list[str] = chars
        self.unk = bool(unk)
        self._stoi = {c: i for i, c in enumerate(chars)}
        self.unk_id: int | None = len(chars) if self.unk else None

    @classmethod
    def train(cls, text: str, unk: bool = False) -> CharTokenizer:
        """Vocabulary = the distinct characters of ``text``, sorted by code point."""
        check_text(text)
        if not text:
            raise TokenizerConfigError("cannot build a character vocabulary from empty text")
        return cls(sorted(set(text)), unk=unk)

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + (1 if self.unk else 0)

    @property
    def special_tokens(self) -> dict[str, int]:
        return {UNK: len(self.chars)} if self.unk else {}

    def encode(self, text: str) -> list[int]:
        check_text(text)
        stoi = self._stoi
        try:
            return [stoi[c] for c in text]
        except KeyError:
            if self.unk:
                unk = len(self.chars)
                return [stoi.get(c, unk) for c in text]
            pos = next(i for i, c in enumerate(text) if c not in stoi)
            raise UnknownTokenError(
                f"character {describe_char(text[pos])} at position {pos} is not in the "
                "vocabulary (a run trained with `attnlm train --unk`, or a tokenizer built with "
                "unk=True, maps unseen characters to <unk>)"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        chars = self.chars
        n = len(chars)
        out = []
        for i in ids:
            if isinstance(i, int) and 0 <= i < n:
                out.append(chars[i])
            elif self.unk and i == n:
                out.append(UNK)
            else:
                raise InvalidTokenIdError(
                    f"token id {i!r} is not in the vocabulary (size {self.vocab_size})"
                )
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"chars": "".join(self.chars), "unk": self.unk}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        chars = data["chars"]
        if not isinstance(chars, str):
            raise TypeError("'chars' must be a string")
        return cls(list(chars), unk=bool(data.get("unk", False)))
